//! A `#[field]` needs its value too.
use tch::nn;

ckpt::model! {
    struct Mlp(p, scale: f64) {
        #[field] scale: f64,
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
