//! A budget chooses the cuts itself: not with `segments = N`.
use tch::nn;

ckpt::model! {
    #[checkpointed(segments = 3, budget = "1 GiB")]
    struct A(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

fn main() {}
