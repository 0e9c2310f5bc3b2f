//! The planner's choice of policy per checkpointed segment (issue 14, "the planner
//! chooses"): on the transformer encoder of `ckpt-models/src/encoder.rs` (small shapes, the
//! model of `tests/plan_model.rs`), budget plans with selective segments predict the
//! measured peak (exact CPU byte counter) within 10 %; the model runs each segment with
//! its planned policy, with gradients bit-equal to the plain model's; a fixed policy is
//! not overridden.

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::Policy;
use ckpt::plan::{Budget, PLANNED_POLICIES, Plan};
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

use ckpt_models::encoder;

/// The memory meter and the global RNG are process-wide: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Setup {
    vs: nn::VarStore,
    model: encoder::Encoder,
    ids: Tensor,
    labels: Tensor,
}

fn setup() -> Setup {
    tch::manual_seed(5);
    let c = encoder::SMALL;
    let vs = nn::VarStore::new(Device::Cpu);
    let model = encoder::Encoder::new(vs.root(), &c);
    let ids = Tensor::randint_low(1, c.vocab, [16, c.seq_len], (Kind::Int64, Device::Cpu));
    let labels = Tensor::randint(c.classes, [16], (Kind::Int64, Device::Cpu));
    Setup {
        vs,
        model,
        ids,
        labels,
    }
}

impl Setup {
    /// One training step from a fixed seed: its peak above the baseline, and the
    /// parameters' gradients (zeroed before).
    fn step(&self) -> (u64, Vec<Tensor>) {
        let mut vars = self.vs.trainable_variables();
        for v in &mut vars {
            v.zero_grad();
        }
        tch::manual_seed(11);
        let ((), report) = ckpt::memory::measure(Device::Cpu, || {
            let loss = self
                .model
                .forward_t(&self.ids, true)
                .cross_entropy_for_logits(&self.labels);
            loss.backward();
        });
        let grads = vars.iter().map(|v| v.grad().copy()).collect();
        (
            u64::try_from(report.peak_above_baseline_bytes).unwrap(),
            grads,
        )
    }
}

fn relative_error(measured: u64, plan: &Plan) -> f64 {
    (measured as f64 - plan.predicted_peak_bytes() as f64).abs()
        / plan.predicted_peak_bytes() as f64
}

fn assert_bit_equal(a: &[Tensor], b: &[Tensor], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.equal(y), "{what}: gradient {i} differs");
    }
}

#[test]
fn fixed_selective_budget_plans_predict_the_measured_peak() {
    let _serial = serial();
    let mut s = setup();
    s.model.set_segments(1).unwrap();
    let _ = s.step(); // allocates the parameters' gradients
    let (_, plain_grads) = s.step();
    s.model.set_policy(Policy::selective());
    let mut with_selective = 0;
    for fraction in [0.5, 0.6, 0.7, 0.8] {
        s.model
            .set_budget(Budget::FractionOfPlain(fraction))
            .unwrap();
        let mut plan = s.model.plan_for(&s.ids, true).unwrap();
        assert_eq!(plan.policies().len(), plan.cuts().len());
        // Every checkpointed segment has the fixed policy (the planner may keep some).
        assert!(
            plan.modes()
                .iter()
                .all(|m| !m.is_checkpointed() || m.policy() == Policy::selective()),
            "{plan}"
        );
        let (measured, grads) = s.step();
        assert_bit_equal(&grads, &plain_grads, &format!("budget {fraction}"));
        plan.set_measured_peak_bytes(measured);
        let error = relative_error(measured, &plan);
        println!(
            "fixed selective, budget {fraction}: error {:.2} %\n{}",
            100.0 * error,
            plan.explain()
        );
        assert!(error <= 0.10, "budget {fraction}: {plan}");
        if !plan.cuts().is_empty() {
            with_selective += 1;
        }
    }
    assert!(with_selective >= 2, "too few plans with selective segments");
}

#[test]
fn chosen_policies_run_and_predict_the_measured_peak() {
    let _serial = serial();
    let mut s = setup();
    s.model.set_segments(1).unwrap();
    let _ = s.step();
    let (_, plain_grads) = s.step();
    for fraction in [0.4, 0.5, 0.6, 0.7, 0.8] {
        s.model
            .set_budget(Budget::FractionOfPlain(fraction))
            .unwrap();
        let mut plan = s.model.plan_for(&s.ids, true).unwrap();
        assert!(plan.policies().iter().all(|p| PLANNED_POLICIES.contains(p)));
        let (measured, grads) = s.step();
        assert_bit_equal(&grads, &plain_grads, &format!("budget {fraction}"));
        plan.set_measured_peak_bytes(measured);
        let error = relative_error(measured, &plan);
        println!(
            "chosen, budget {fraction}: error {:.2} %\n{}",
            100.0 * error,
            plan.explain()
        );
        assert!(error <= 0.10, "budget {fraction}: {plan}");
    }
}

#[test]
fn a_fixed_policy_is_not_overridden() {
    let _serial = serial();
    let mut s = setup();
    s.model.set_policy(Policy::RECOMPUTE_ALL);
    s.model.set_budget(Budget::FractionOfPlain(0.8)).unwrap();
    let plan = s.model.plan_for(&s.ids, true).unwrap();
    assert!(
        plan.policies().iter().all(|&p| p == Policy::RECOMPUTE_ALL),
        "{plan}"
    );
}
