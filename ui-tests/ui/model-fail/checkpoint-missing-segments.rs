use tch::nn;

ckpt::model! {
    #[checkpointed]
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

ckpt::model! {
    #[checkpointed(preserve_rng_state = false)]
    struct Mlp2(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

fn main() {}
