use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f(mut xs: Tensor) -> Tensor {
    let _ = xs.relu_();
    let ys = xs.sigmoid();
    let mut fresh = ys.exp();
    let _ = fresh.tanh_();
    fresh + 1.0
}

fn main() {}
