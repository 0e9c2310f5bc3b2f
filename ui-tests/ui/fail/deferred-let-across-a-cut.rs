//! A `let` without a value and its assignment may not be separated by a cut.
use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 4)]
fn late(xs: &Tensor) -> Tensor {
    let last;
    last = xs.relu();
    let y = last.tanh();
    y + last
}

fn main() {}
