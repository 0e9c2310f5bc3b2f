use tch::nn;

ckpt::model! {
    #[checkpointed(segments = 0)]
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

fn main() {}
