//! `xs` and `train` are what per-call values see of the forward call.
use tch::{nn, Tensor};

ckpt::model! {
    struct Mlp(p) {
        let xs: Tensor = xs.relu(),
        let mask: Tensor = xs.ne(0),
        let mask: Tensor = xs.ne(1),
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
