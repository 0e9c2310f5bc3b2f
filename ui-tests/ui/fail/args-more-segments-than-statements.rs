use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 4)]
fn f(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    let zs = ys.sigmoid();
    zs.tanh()
}

fn main() {}
