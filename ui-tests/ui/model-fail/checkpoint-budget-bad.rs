//! Budgets are parsed at compile time, with the grammar of `ckpt::plan::Budget`.
use tch::nn;

ckpt::model! {
    #[checkpointed(budget = "512 parsecs")]
    struct A(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

ckpt::model! {
    #[checkpointed(budget = "150%")]
    struct B(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

ckpt::model! {
    #[checkpointed(budget = 512)]
    struct C(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
