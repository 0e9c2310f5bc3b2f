//! A stage must be a layer, a built-in, a function path or a closure.
use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        xs.relu(),
        fc.forward(),
        scale(2.0),
        3 * 4,
    }
}

fn main() {}
