use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f(xs: &Tensor) -> Tensor {
    let ys = xs.relu();
    let zs = {
        #[ckpt::keep]
        let t = ys.tanh();
        t
    };
    zs.sigmoid()
}

fn main() {}
