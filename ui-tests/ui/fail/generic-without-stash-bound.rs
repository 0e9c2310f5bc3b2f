use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f<T: ckpt::Stash>(xs: &Tensor, extra: T) -> (Tensor, T) {
    let ys = xs.relu();
    (ys.tanh(), extra)
}

#[checkpointed(segments = 2)]
fn g<T: Clone>(xs: &Tensor, extra: T) -> (Tensor, T) {
    let e = extra.clone();
    let ys = xs.relu();
    (ys.tanh(), e)
}

fn main() {}
