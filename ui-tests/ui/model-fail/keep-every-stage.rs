use tch::nn;

ckpt::model! {
    #[checkpointed(segments = 2)]
    struct AllKept(p) {
        #[keep] fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep] relu,
    }
}

ckpt::model! {
    #[checkpointed(segments = auto)]
    struct AllKeptAuto(p) {
        #[keep] fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep] relu,
    }
}

fn main() {
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let _ = AllKept::new(vs.root());
    let _ = AllKeptAuto::new(vs.root());
}
