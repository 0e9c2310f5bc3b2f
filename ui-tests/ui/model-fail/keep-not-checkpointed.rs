use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep] relu,
        fc2: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _ = Mlp::new(vs.root());
}
