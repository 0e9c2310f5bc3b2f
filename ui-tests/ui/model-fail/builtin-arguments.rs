//! `dropout` takes its probability; the other built-ins take nothing.
use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        dropout,
        relu(0.1),
        dropout(0.1, 0.2),
        gelu("tanh"),
    }
}

fn main() {}
