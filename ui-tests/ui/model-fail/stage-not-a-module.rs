//! A layer stage's type must be a tch module.
use tch::nn;

ckpt::model! {
    struct Net(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        scale: f64 = 2.0,
        #[train] shift: i64 = 1,
    }
}

fn main() {}
