use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2, budget = "1 GiB")]
fn f(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    ys.tanh()
}

fn main() {}
