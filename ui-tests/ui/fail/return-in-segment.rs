use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f(xs: &Tensor) -> Tensor {
    if xs.numel() == 0 {
        return xs.shallow_clone();
    }
    let ys = xs.relu();
    let zs = (|| {
        return ys.sigmoid();
    })();
    zs.tanh()
}

fn main() {}
