//! The planner's choice of policy per checkpointed segment for `#[checkpointed(budget =
//! "..")]` functions (issue 14, "the planner chooses", as `tests/plan_policies.rs` does for
//! `model!`): a layer loop over the encoder's blocks (`ckpt-models/src/encoder.rs`, small
//! shapes, dropout 0.1). The profile measures what the masks and selective policies keep
//! in each block (exact bytes); each segment runs with its planned policy, the measured
//! peak (exact CPU byte counter) is within 10 % of the prediction and gradients are
//! bit-equal to the plain function's; a declared `policy = ..` is never overridden.

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::plan::{PLANNED_POLICIES, Plan};
use ckpt::{Policy, ShallowClone, checkpointed};
use tch::nn;
use tch::{Device, Kind, Tensor};

use ckpt_models::encoder::{self, Block, Config};

/// The memory meter and the global RNG are process-wide: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const CONFIG: Config = encoder::SMALL;
const BATCH: i64 = 16;

#[derive(Debug, ShallowClone)]
struct Net {
    blocks: Vec<Block>,
}

/// The same body under several attributes: the blocks in a layer loop, then the output.
macro_rules! blocks {
    ($($(#[$attr:meta])* fn $name:ident;)*) => {$(
        $(#[$attr])*
        fn $name(&self, xs: &Tensor, pad: &Tensor) -> Tensor {
            let mut h = xs.shallow_clone();
            for block in self.blocks.iter() {
                h = block.forward(&h, pad, true);
            }
            h
        }
    )*};
}

impl Net {
    blocks! {
        fn plain;
        #[checkpointed(budget = "40%")]
        fn budget40;
        #[checkpointed(budget = "60%")]
        fn budget60;
        #[checkpointed(budget = "80%")]
        fn budget80;
        #[checkpointed(budget = "60%", policy = selective)]
        fn budget60_selective;
        #[checkpointed(budget = "60%", policy = full)]
        fn budget60_full;
    }
}

struct Setup {
    vs: nn::VarStore,
    net: Net,
    xs: Tensor,
    pad: Tensor,
    w: Tensor,
}

fn setup() -> Setup {
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net {
        blocks: (0..CONFIG.layers)
            .map(|i| Block::new(vs.root() / "blocks" / i, &CONFIG))
            .collect(),
    };
    let shape = [BATCH, CONFIG.seq_len, CONFIG.d_model];
    let xs = Tensor::randn(shape, (Kind::Float, Device::Cpu));
    let pad = Tensor::zeros([BATCH, CONFIG.seq_len], (Kind::Bool, Device::Cpu));
    let w = Tensor::randn(shape, (Kind::Float, Device::Cpu));
    Setup {
        vs,
        net,
        xs,
        pad,
        w,
    }
}

type Forward = fn(&Net, &Tensor, &Tensor) -> Tensor;

impl Setup {
    /// One training step of `f` from a fixed seed: its peak above the baseline, and the
    /// parameters' gradients (zeroed before).
    fn step(&self, f: Forward) -> (u64, Vec<Tensor>) {
        let mut vars = self.vs.trainable_variables();
        for v in &mut vars {
            v.zero_grad();
        }
        tch::manual_seed(11);
        let ((), report) = ckpt::memory::measure(Device::Cpu, || {
            // `let`: the product is a temporary, freed before backward.
            let loss = (f(&self.net, &self.xs, &self.pad) * &self.w).sum(Kind::Float);
            loss.backward();
        });
        let grads = vars.iter().map(|v| v.grad().copy()).collect();
        (
            u64::try_from(report.peak_above_baseline_bytes).unwrap(),
            grads,
        )
    }
}

/// The plan `function_plans` lists for the function whose name starts with `name`.
fn plan_of(name: &str) -> Plan {
    let all = ckpt::plan::function_plans();
    let mine: Vec<_> = all
        .iter()
        .filter(|p| p.function.starts_with(&format!("{name} (")))
        .collect();
    assert_eq!(mine.len(), 1, "{name}: {all:#?}");
    mine[0].plan.clone()
}

fn assert_bit_equal(a: &[Tensor], b: &[Tensor], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.equal(y), "{what}: gradient {i} differs");
    }
}

/// Runs `f` twice (the first call profiles and plans), checks its gradients against the
/// plain function's and its measured peak against the plan's prediction, and returns
/// the plan.
fn check(s: &Setup, name: &str, f: Forward, plain_grads: &[Tensor]) -> Plan {
    let _ = s.step(f);
    let (measured, grads) = s.step(f);
    assert_bit_equal(&grads, plain_grads, name);
    let mut plan = plan_of(name);
    plan.set_measured_peak_bytes(measured);
    let predicted = plan.predicted_peak_bytes() as f64;
    let error = (measured as f64 - predicted).abs() / predicted;
    println!("{name}: error {:.2} %\n{}", 100.0 * error, plan.explain());
    assert!(error <= 0.10, "{name}: {plan}");
    assert_eq!(plan.policies().len(), plan.cuts().len(), "{name}");
    plan
}

#[test]
fn budget_functions_choose_a_policy_per_segment_and_predict_the_measured_peak() {
    let _serial = serial();
    let s = setup();
    let _ = s.step(Net::plain); // allocates the parameters' gradients
    let (_, plain_grads) = s.step(Net::plain);
    let cases: [(&str, Forward); 3] = [
        ("Net::budget40", Net::budget40),
        ("Net::budget60", Net::budget60),
        ("Net::budget80", Net::budget80),
    ];
    for (name, f) in cases {
        let plan = check(&s, name, f, &plain_grads);
        assert!(
            plan.policies().iter().all(|p| PLANNED_POLICIES.contains(p)),
            "{name}: {plan}"
        );
        // The profile measured both policies in every block (each has Linear layers
        // and training-mode dropout): the masks keep one bit an element of each
        // dropout, at least those of the two residual branches (`[batch, seq, d_model]`)
        // and of the feed-forward layer (4 times wider); selective keeps more.
        let blocks = &plan.stage_costs()[1..=CONFIG.layers];
        let elements = (BATCH * CONFIG.seq_len * CONFIG.d_model) as u64;
        for (i, stage) in blocks.iter().enumerate() {
            let masks = stage.masks.as_ref().expect("masks measured");
            let selective = stage.selective.as_ref().expect("selective measured");
            assert!(masks.kept_bytes >= 6 * elements / 8, "block {i}: {stage:?}");
            assert!(
                selective.kept_bytes > masks.kept_bytes,
                "block {i}: {stage:?}"
            );
        }
    }
}

#[test]
fn a_declared_policy_is_not_overridden() {
    let _serial = serial();
    let s = setup();
    let _ = s.step(Net::plain);
    let (_, plain_grads) = s.step(Net::plain);
    let selective = check(
        &s,
        "Net::budget60_selective",
        Net::budget60_selective,
        &plain_grads,
    );
    assert!(!selective.cuts().is_empty(), "{selective}");
    assert!(
        selective
            .policies()
            .iter()
            .all(|&p| p == Policy::selective()),
        "{selective}"
    );
    let full = check(&s, "Net::budget60_full", Net::budget60_full, &plain_grads);
    assert!(!full.cuts().is_empty(), "{full}");
    assert!(
        full.policies().iter().all(|&p| p == Policy::RECOMPUTE_ALL),
        "{full}"
    );
}
