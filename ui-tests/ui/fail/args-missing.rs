use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed]
fn f(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    ys.tanh()
}

fn main() {}
