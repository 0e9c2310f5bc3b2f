// `#[keep]` with `segments = auto` and `budget`: the planner keeps the marked stages in
// every plan and may keep others.
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

ckpt::model! {
    #[checkpointed(segments = auto)]
    struct Auto(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep] relu,
        fc2: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

ckpt::model! {
    #[checkpointed(budget = "100%")]
    struct Budget(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep] relu,
        fc2: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let mut m = Auto::new(vs.root());
    let xs = Tensor::randn([2, 4], (Kind::Float, Device::Cpu));
    m.forward(&xs).sum(Kind::Float).backward();
    let plan = m.plan_for(&xs).unwrap();
    assert!(!plan.mode(plan.segment_of(1)).is_checkpointed(), "{plan}");
    m.set_segments(2).unwrap();
    m.set_budget("80%".parse().unwrap()).unwrap();
    let b = Budget::new(vs.root());
    b.forward(&xs).sum(Kind::Float).backward();
}
