use tch::nn;

ckpt::model! {
    #[checkpointed(segments = auto)]
    struct Auto(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep] relu,
        fc2: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

ckpt::model! {
    #[checkpointed(budget = "50%")]
    struct Budget(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep] relu,
    }
}

ckpt::model! {
    #[checkpointed(segments = 2)]
    struct AllKept(p) {
        #[keep] fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep] relu,
    }
}

fn main() {
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let mut m = Auto::new(vs.root());
    let _ = m.set_segments(2);
    let _ = Budget::new(vs.root());
    let _ = AllKept::new(vs.root());
}
