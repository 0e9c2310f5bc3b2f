//! Per-call values are computed from the model's input, before the chain.
use tch::{nn, Tensor};

ckpt::model! {
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        let mask: Tensor = xs.ne(0),
        |xs| xs * &mask,
    }
}

fn main() {}
