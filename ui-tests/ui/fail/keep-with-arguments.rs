use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    #[ckpt::keep(always)]
    let zs = ys.tanh();
    let ws = zs.sigmoid();
    ws.exp()
}

fn main() {}
