use tch::nn;

ckpt::model! {
    #[checkpointed(segments = "3", preserve_rng_state = 1, determinism_check = yes)]
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

fn main() {}
