//! `segments = auto` and `budget = ".."` wait for the planner.
use tch::nn;

ckpt::model! {
    #[checkpointed(segments = auto)]
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

ckpt::model! {
    #[checkpointed(budget = "512 MiB")]
    struct Mlp2(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

fn main() {}
