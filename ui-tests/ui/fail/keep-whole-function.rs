use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed]
fn f(xs: &Tensor) -> Tensor {
    #[ckpt::keep]
    let ys = xs.relu();
    ys.tanh()
}

fn main() {}
