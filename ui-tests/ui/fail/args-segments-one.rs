use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 1)]
fn f(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    ys.tanh()
}

fn main() {}
