use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2, preserve_rng_state = false, segments = 2, preserve_rng_state = true)]
fn f(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    ys.tanh()
}

fn main() {}
