//! Every stage and field needs its own name: it names the struct field and the variables.
use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
