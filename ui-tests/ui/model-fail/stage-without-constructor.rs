//! A layer stage needs an expression that builds it.
use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        fc1: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        relu,
        fc2: nn::Linear,
    }
}

fn main() {
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _ = Mlp::new(vs.root()); // no follow-on error here
}
