//! Per-call values need a type: they are handed to every stage and checkpointed segment.
use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        let mask = xs.ne(0),
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
