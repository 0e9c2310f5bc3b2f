use tch::nn;

ckpt::model! {
    #[checkpointed(segments = 2, segmnets = 3)]
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
    }
}

fn main() {}
