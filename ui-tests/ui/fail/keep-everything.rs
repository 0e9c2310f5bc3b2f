use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f(xs: &Tensor) -> Tensor {
    #[ckpt::keep]
    let ys = xs.relu();
    #[ckpt::keep]
    let zs = ys.tanh();
    zs.sigmoid()
}

fn main() {}
