//! `segments = auto`, `budget`, and the run-time schedule setters of a checkpointed model.
use ckpt::plan::{Budget, Schedule};
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

ckpt::model! {
    /// Cut by the planner.
    #[checkpointed(segments = auto)]
    pub struct Auto(p, d: i64) {
        fc1: nn::Linear = nn::linear(p, d, d, Default::default()),
        relu,
        dropout(0.1),
        fc2: nn::Linear = nn::linear(p, d, d, Default::default()),
        gelu,
        fc3: nn::Linear = nn::linear(p, d, 2, Default::default()),
    }
}

ckpt::model! {
    #[checkpointed(budget = "1.5 MiB", preserve_rng_state = false)]
    struct WithinBudget(p, d: i64) {
        fc1: nn::Linear = nn::linear(p, d, d, Default::default()),
        tanh,
        fc2: nn::Linear = nn::linear(p, d, d, Default::default()),
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let mut m = Auto::new(vs.root(), 32);
    let x = Tensor::randn([64, 32], (Kind::Float, Device::Cpu));
    let plan = m.plan_for(&x, true).unwrap();
    println!("{plan}");
    m.forward_t(&x, true).sum(Kind::Float).backward();
    m.set_segments(2).unwrap();
    m.set_budget("50%".parse().unwrap()).unwrap();
    m.set_plan(&plan).unwrap();
    m.set_schedule(Schedule::Cuts(vec![1, 3])).unwrap();
    m.set_auto().unwrap();
    assert!(m.set_segments(0).is_err());
    assert_eq!(m.stage_names().len(), 6);
    m.clear_plans();

    let mut w = WithinBudget::new(vs.root() / "w", 32);
    assert_eq!(
        w.schedule(),
        Schedule::Auto(ckpt::plan::Objective::Budget(Budget::Bytes(3 << 19)))
    );
    tch::nn::Module::forward(&w, &x).sum(Kind::Float).backward();
    w.set_budget(Budget::Bytes(1)).unwrap();
    assert!(w.plan_for(&x).is_err());
}
