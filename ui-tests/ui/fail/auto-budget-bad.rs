use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(budget = "12 parsecs")]
fn unknown_unit(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    ys.tanh()
}

#[checkpointed(budget = "150%")]
fn too_many_percent(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    ys.tanh()
}

#[checkpointed(budget = "512")]
fn bytes_without_unit(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    ys.tanh()
}

#[checkpointed(budget = 512)]
fn not_a_string(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    ys.tanh()
}

fn main() {}
