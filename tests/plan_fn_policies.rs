//! The planner's choice of policy per checkpointed segment for `#[checkpointed(budget =
//! "..")]` functions (issue 14, "the planner chooses", as `tests/plan_policies.rs` does for
//! `model!`): a layer loop over the encoder's blocks (`ckpt-models/src/encoder.rs`, small
//! shapes, dropout 0.1). The profile measures what the masks, narrowing and selective policies keep
//! in each block (exact bytes); each segment runs with its planned policy, the measured
//! peak (exact CPU byte counter) is within 10 % of the prediction and gradients are
//! bit-equal to the plain function's; a declared `policy = ..` is never overridden, on a
//! function as on a `model!` of the same blocks.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::plan::{PLANNED_POLICIES, Plan};
use ckpt::{Policy, ShallowClone, checkpointed};
use tch::nn::{self, ModuleT};
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
        #[checkpointed(budget = "60%", policy = masks)]
        fn budget60_masks;
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
    /// One training step of `f` from a fixed seed ([`measured_step`]).
    fn step(&self, f: Forward) -> (u64, Vec<Tensor>) {
        // The product is a temporary, freed before backward.
        measured_step(&self.vs, || {
            (f(&self.net, &self.xs, &self.pad) * &self.w).sum(Kind::Float)
        })
    }
}

/// One training step from a fixed seed (`loss()`, then backward): its peak above the
/// baseline, and the gradients of the trainable variables of `vs` (zeroed before).
fn measured_step(vs: &nn::VarStore, loss: impl FnOnce() -> Tensor) -> (u64, Vec<Tensor>) {
    let mut vars = vs.trainable_variables();
    for v in &mut vars {
        v.zero_grad();
    }
    tch::manual_seed(11);
    let ((), report) = ckpt::memory::measure(Device::Cpu, || loss().backward());
    let grads = vars.iter().map(|v| v.grad().copy()).collect();
    (
        u64::try_from(report.peak_above_baseline_bytes).unwrap(),
        grads,
    )
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
    assert_predicts(name, &mut plan, measured);
    assert_eq!(plan.policies().len(), plan.cuts().len(), "{name}");
    plan
}

/// Attaches the measured peak to `plan` and checks it is within 10 % of the prediction.
fn assert_predicts(name: &str, plan: &mut Plan, measured: u64) {
    plan.set_measured_peak_bytes(measured);
    let predicted = plan.predicted_peak_bytes() as f64;
    let error = (measured as f64 - predicted).abs() / predicted;
    println!("{name}: error {:.2} %\n{}", 100.0 * error, plan.explain());
    assert!(error <= 0.10, "{name}: {plan}");
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
        // The explanation says, for each checkpointed segment, why each of the three
        // other policies lost, `narrowing` only where a stage of the segment has a
        // narrowing linear (the planner may also keep segments, which have none).
        let text = plan.explain();
        let reasons = ruled_out(&text);
        let expected: usize = plan
            .ranges()
            .into_iter()
            .enumerate()
            .filter(|&(j, _)| j < plan.cuts().len() && plan.mode(j).is_checkpointed())
            .map(|(_, r)| {
                let narrowing = plan.stage_costs()[r].iter().any(|s| s.narrowing.is_some());
                PLANNED_POLICIES.len() - 1 - usize::from(!narrowing)
            })
            .sum();
        assert_eq!(reasons.len(), expected, "{name}: {text}");
        for r in reasons {
            assert!(
                r.contains("> budget")
                    || r.contains("saves less time")
                    || r.contains("as fast, but")
                    || r.contains("ties with"),
                "{name}: {r}"
            );
        }
        // The profile measured the three policies in every block (each has Linear layers
        // and training-mode dropout): the masks keep one bit an element of each
        // dropout, at least those of the two residual branches (`[batch, seq, d_model]`)
        // and of the feed-forward layer (4 times wider); narrowing also the feed-forward
        // down-projection's float32 `[batch, seq, d_model]` output, exactly; selective
        // keeps more.
        let blocks = &plan.stage_costs()[1..=CONFIG.layers];
        let elements = (BATCH * CONFIG.seq_len * CONFIG.d_model) as u64;
        for (i, stage) in blocks.iter().enumerate() {
            let masks = stage.masks.as_ref().expect("masks measured");
            let narrowing = stage.narrowing.as_ref().expect("narrowing measured");
            let selective = stage.selective.as_ref().expect("selective measured");
            assert!(masks.kept_bytes >= 6 * elements / 8, "block {i}: {stage:?}");
            assert_eq!(
                narrowing.kept_bytes,
                masks.kept_bytes + 4 * elements,
                "block {i}: {stage:?}"
            );
            assert!(
                selective.kept_bytes > narrowing.kept_bytes,
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
    assert!(!checkpointed_policies(&selective).is_empty(), "{selective}");
    assert!(
        checkpointed_policies(&selective)
            .iter()
            .all(|&p| p == Policy::selective()),
        "{selective}"
    );
    let full = check(&s, "Net::budget60_full", Net::budget60_full, &plain_grads);
    assert!(!checkpointed_policies(&full).is_empty(), "{full}");
    assert!(
        checkpointed_policies(&full)
            .iter()
            .all(|&p| p == Policy::RECOMPUTE_ALL),
        "{full}"
    );
    let masks = check(&s, "Net::budget60_masks", Net::budget60_masks, &plain_grads);
    assert_keeps_masks_everywhere(&masks, 1..CONFIG.layers + 1);
    // No choice, nothing ruled out.
    for plan in [selective, full, masks] {
        assert!(ruled_out(&plan.explain()).is_empty(), "{}", plan.explain());
    }
}

/// The policies of the plan's checkpointed segments (not those it keeps).
fn checkpointed_policies(plan: &Plan) -> Vec<Policy> {
    plan.modes()
        .iter()
        .filter(|m| m.is_checkpointed())
        .map(|m| m.policy())
        .collect()
}

/// The lines of an explanation that say why a policy lost ("not masks: ..").
fn ruled_out(explain: &str) -> Vec<&str> {
    explain
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("not "))
        .collect()
}

/// A plan whose every checkpointed segment runs with [`Policy::masks`] (a plan
/// may also keep segments, which run once and keep everything), and whose checkpointed
/// segments keep the dropout masks of every block they hold (`blocks`: the stages that
/// are blocks), at least one bit an element of the two residual branches and of the
/// feed-forward layer (`6 * batch * seq * d_model` bits a block).
fn assert_keeps_masks_everywhere(plan: &Plan, blocks: Range<usize>) {
    assert!(plan.modes().iter().any(|m| m.is_checkpointed()), "{plan}");
    let block_masks = 6 * (BATCH * CONFIG.seq_len * CONFIG.d_model) as u64 / 8;
    let segments = plan.ranges().into_iter().take(plan.cuts().len());
    for (j, range) in segments.enumerate() {
        if !plan.mode(j).is_checkpointed() {
            continue;
        }
        assert_eq!(plan.policies()[j], Policy::masks(), "{plan}");
        let held = range.filter(|i| blocks.contains(i)).count() as u64;
        let (kept, _) = plan
            .segment_keep(j, Policy::masks())
            .expect("masks modelled");
        assert!(kept >= held * block_masks, "segment {j}: {plan}");
    }
}

ckpt::model! {
    /// The blocks of [`Net`] as a `model!` with a declared masks policy and a budget.
    #[checkpointed(budget = "60%", policy = masks)]
    struct MaskedBlocks(p, c: &Config) {
        let pad: Tensor = Tensor::zeros(&xs.size()[..2], (Kind::Bool, xs.device())),
        blocks: [Block; c.layers] = Block::new(p, c) => |b, xs, train| b.forward(xs, &pad, train),
    }
}

/// `model!` with `budget = "60%", policy = masks`: the planner plans the cuts for the
/// masks policy in every segment (never overridden, also after `set_segments(1)` and
/// `set_budget` again); gradients are the plain run's bit for bit and the measured peak
/// is within 10 % of the prediction.
#[test]
fn a_declared_masks_policy_is_planned_for_in_a_model() {
    let _serial = serial();
    let s = setup();
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = MaskedBlocks::new(vs.root(), &CONFIG);
    assert_eq!(model.policy(), Policy::masks());
    let step = |model: &MaskedBlocks| {
        measured_step(&vs, || {
            (model.forward_t(&s.xs, true) * &s.w).sum(Kind::Float)
        })
    };
    let _ = step(&model); // profiles and plans
    let (measured, grads) = step(&model);
    let mut plan = model.plan_for(&s.xs, true).unwrap();
    assert_keeps_masks_everywhere(&plan, 0..CONFIG.layers);
    assert_predicts("model!, masks", &mut plan, measured);
    model.set_segments(1).unwrap();
    let (_, plain_grads) = step(&model);
    assert_bit_equal(&grads, &plain_grads, "model!, masks vs plain");
    model
        .set_budget(ckpt::plan::Budget::FractionOfPlain(0.6))
        .unwrap();
    assert_keeps_masks_everywhere(&model.plan_for(&s.xs, true).unwrap(), 0..CONFIG.layers);
}
