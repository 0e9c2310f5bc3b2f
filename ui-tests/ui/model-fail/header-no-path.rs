use tch::nn;

ckpt::model! {
    struct Mlp() {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

ckpt::model! {
    struct Mlp2(p, d) {
        fc: nn::Linear = nn::linear(p, d, d, Default::default()),
    }
}

fn main() {}
