use tch::nn;

ckpt::model! {
    #[checkpointed(segments = 2, preserve_rng_state = false, segments = 3, preserve_rng_state = true)]
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

fn main() {}
