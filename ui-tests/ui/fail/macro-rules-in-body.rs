use ckpt::checkpointed;
use tch::{Kind, Tensor};

#[checkpointed(segments = 2)]
fn f(xs: &Tensor, s: f64) -> Tensor {
    let s = s * 100.0;
    macro_rules! scaled {
        ($x:expr) => {
            $x * s
        };
    }
    let ys = scaled!(xs.sin());
    ys.sum(Kind::Float)
}

fn main() {}
