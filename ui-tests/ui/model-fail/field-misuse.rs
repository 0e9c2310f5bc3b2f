//! A `#[field]` is a named value that is not a stage.
use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        #[field] relu,
        #[field] fc: nn::Linear = nn::linear(p / "fc", 4, 4, Default::default()) => |l, xs| xs.apply(l),
        fc2: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
