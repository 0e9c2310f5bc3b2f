use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = auto)]
fn f(xs: &Tensor) -> Tensor {
    xs.relu()
}

fn main() {}
