use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        #[trian] fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[inline] relu,
    }
}

fn main() {}
