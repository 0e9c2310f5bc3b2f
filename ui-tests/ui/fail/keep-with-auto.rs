use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = auto)]
fn f(xs: &Tensor) -> Tensor {
    #[ckpt::keep]
    let ys = xs.relu();
    let zs = ys.tanh();
    zs.sigmoid()
}

fn main() {}
