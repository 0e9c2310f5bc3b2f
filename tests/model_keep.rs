//! `#[keep]` on stages of a `model!` chain: a kept stage runs once, inline between the
//! checkpointed segments, and is not recomputed in backward (a repeated stage: every
//! layer); outputs, gradients and batch-norm buffers equal the unannotated model's bit
//! for bit; the peak memory lies strictly between full recompute with the same segments
//! and no checkpointing; the schedule API splits run-time cuts the same way, and the
//! planner (`segments = auto`, budgets) keeps the marked stages in every plan.
//!
//! The tests share the RNG, the memory counter and the run counters: one at a time.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::plan::{Objective, Schedule};
use ckpt::{ShallowClone, model};
use common::{assert_all_equal, grads_and_output};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How often the blocks (every layer counted), the `up` projection and the `gate` closure
/// ran.
static BLOCKS: AtomicUsize = AtomicUsize::new(0);
static UP: AtomicUsize = AtomicUsize::new(0);
static GATE: AtomicUsize = AtomicUsize::new(0);

fn counted(counter: &AtomicUsize, t: Tensor) -> Tensor {
    counter.fetch_add(1, Ordering::SeqCst);
    t
}

/// The run counts since the last call: blocks, `up`, `gate`.
fn counts() -> (usize, usize, usize) {
    (
        BLOCKS.swap(0, Ordering::SeqCst),
        UP.swap(0, Ordering::SeqCst),
        GATE.swap(0, Ordering::SeqCst),
    )
}

#[derive(Debug, ShallowClone)]
struct Residual {
    lin: nn::Linear,
}

impl Residual {
    fn new(p: nn::Path, d: i64) -> Self {
        Residual {
            lin: nn::linear(p, d, d, Default::default()),
        }
    }
}

impl Module for Residual {
    fn forward(&self, xs: &Tensor) -> Tensor {
        counted(&BLOCKS, xs + xs.apply(&self.lin).tanh())
    }
}

const D_IN: i64 = 32;
const D: i64 = 64;
const W: i64 = 512;

/// The gate: an elementwise stage with a large output, kept in [`Kept`].
fn gate(xs: &Tensor) -> Tensor {
    counted(&GATE, xs.sigmoid() * xs)
}

// 11 stages: inp, bn, blocks[0], blocks[1], up, gate, gelu, down, dropout, relu, out.
// `segments = 2` cuts 0..5 | 5..11: the first runs checkpointed, the second inline.

/// The one chain, declared with the given attributes on the declaration, the blocks and
/// the gate.
macro_rules! chain {
    ($(#[$decl:meta])* struct $name:ident { blocks: [$($blocks:tt)*], gate: [$($gate:tt)*] }) => {
        model! {
            $(#[$decl])*
            struct $name(p) {
                inp: nn::Linear = nn::linear(p, D_IN, D, Default::default()),
                #[train] bn: nn::BatchNorm = nn::batch_norm1d(p, D, Default::default()),
                $($blocks)* blocks: [Residual; 2] = Residual::new(p, D),
                up: nn::Linear = nn::linear(p, D, W, Default::default())
                    => |l, xs| counted(&UP, l.forward(xs)),
                $($gate)* gate,
                gelu,
                down: nn::Linear = nn::linear(p, W, D, Default::default()),
                dropout(0.2),
                relu,
                out: nn::Linear = nn::linear(p, D, 4, Default::default()),
            }
        }
    };
}

chain! {
    /// The unannotated model.
    struct Plain { blocks: [], gate: [] }
}

chain! {
    /// Full recompute of the first segment.
    #[checkpointed(segments = 2)]
    struct Full { blocks: [], gate: [] }
}

chain! {
    /// The blocks (both layers) kept: the first segment becomes `inp, bn` (checkpointed),
    /// `blocks[0..2]` (inline), `up` (checkpointed), then `gate..out` inline as before.
    #[checkpointed(segments = 2)]
    struct Kept { blocks: [#[keep]], gate: [#[ckpt::keep]] }
}

/// Three models with the same variables (the same seed, the same names).
fn fixture() -> [(nn::VarStore, Box<dyn ModuleT>); 3] {
    let build = |f: &dyn Fn(nn::Path) -> Box<dyn ModuleT>| {
        tch::manual_seed(7);
        let vs = nn::VarStore::new(Device::Cpu);
        let m = f(vs.root());
        (vs, m)
    };
    [
        build(&|p| Box::new(Plain::new(p))),
        build(&|p| Box::new(Full::new(p))),
        build(&|p| Box::new(Kept::new(p))),
    ]
}

/// Output, gradients (every variable, the input) and then every variable's value (the
/// batch norm's running statistics updated by the step) of one training step.
fn step(vs: &nn::VarStore, m: &dyn ModuleT, x: &Tensor) -> Vec<Tensor> {
    tch::manual_seed(11);
    let mut out = grads_and_output(vs, x, &|x| m.forward_t(x, true));
    out.extend(common::params(vs).iter().map(Tensor::copy));
    out
}

#[test]
fn kept_stages_run_once_and_everything_equals_plain() {
    let _serial = serial();
    let [(vs_plain, plain), (vs_full, full), (vs_kept, kept)] = fixture();
    let x = Tensor::randn([16, D_IN], (Kind::Float, Device::Cpu));
    counts();
    let want = step(&vs_plain, &*plain, &x);
    assert_eq!(counts(), (2, 1, 1), "plain: every stage once");
    let got = step(&vs_full, &*full, &x);
    assert_all_equal("full recompute vs plain", &got, &want);
    assert_eq!(counts(), (4, 2, 1), "full: segment 0..5 recomputed");
    let got = step(&vs_kept, &*kept, &x);
    assert_all_equal("kept vs plain", &got, &want);
    assert_eq!(
        counts(),
        (2, 2, 1),
        "kept: the blocks (and the gate, inline anyway) once, `up` recomputed"
    );
    let names: Vec<String> = {
        let mut n: Vec<String> = vs_kept.variables().into_keys().collect();
        n.sort();
        n
    };
    assert!(names.contains(&"bn.running_mean".to_owned()), "{names:?}");
    // Evaluation mode: no grad, nothing checkpointed, the same output.
    let eval = |m: &dyn ModuleT| tch::no_grad(|| m.forward_t(&x, false));
    assert!(eval(&*kept).equal(&eval(&*plain)));
}

/// Peak tensor bytes above the baseline of a training step, after a warm-up step that
/// allocates the gradients.
fn step_peak(vs: &nn::VarStore, m: &dyn ModuleT, x: &Tensor) -> i64 {
    let run = || {
        tch::manual_seed(3);
        m.forward_t(x, true).square().sum(Kind::Float).backward();
    };
    run();
    for v in vs.trainable_variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let ((), report) = ckpt::memory::measure(Device::Cpu, run);
    report.peak_above_baseline_bytes
}

#[test]
fn kept_peak_lies_between_full_recompute_and_plain() {
    let _serial = serial();
    let [(vs_plain, plain), (vs_full, full), (vs_kept, kept)] = fixture();
    let x = Tensor::randn([256, D_IN], (Kind::Float, Device::Cpu));
    let peak_plain = step_peak(&vs_plain, &*plain, &x);
    let peak_full = step_peak(&vs_full, &*full, &x);
    let peak_kept = step_peak(&vs_kept, &*kept, &x);
    println!("peak bytes: plain {peak_plain}, full recompute {peak_full}, kept {peak_kept}");
    assert!(
        peak_full < peak_kept && peak_kept < peak_plain,
        "full {peak_full} < kept {peak_kept} < plain {peak_plain}"
    );
}

#[test]
fn run_time_cuts_split_around_kept_stages_and_auto_keeps_them() {
    let _serial = serial();
    let x = Tensor::randn([8, D_IN], (Kind::Float, Device::Cpu));
    // Every stage a segment of its own: all but the kept ones and the last (inline)
    // are recomputed. Cuts at 3 and 5: 0..3 | 3..5 | 5..11 run as 0..2 (checkpointed),
    // 2..3 (the kept blocks[0]), 3..4 (the kept blocks[1]), 4..5 (`up`, checkpointed)
    // and 5..11 inline.
    for schedule in [Schedule::Segments(11), Schedule::Cuts(vec![3, 5])] {
        let [(vs_plain, plain), ..] = fixture();
        tch::manual_seed(7);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut kept = Kept::new(vs.root());
        counts();
        let want = step(&vs_plain, &*plain, &x);
        counts();
        kept.set_schedule(schedule.clone()).unwrap();
        let got = step(&vs, &kept, &x);
        assert_all_equal(
            &format!("{schedule:?} with kept stages vs plain"),
            &got,
            &want,
        );
        assert_eq!(counts(), (2, 2, 1), "{schedule:?}");
        // The planner keeps the `#[keep]` stages (blocks[0], blocks[1], gate) in every
        // plan, and may keep others: outputs, gradients and the batch norm's buffers
        // still equal the plain model's, and the kept stages run once a step.
        for auto in [
            Schedule::Auto(Objective::MinPeak),
            Schedule::Auto(Objective::Budget("100%".parse().unwrap())),
        ] {
            let [(vs_plain, plain), ..] = fixture();
            let want = step(&vs_plain, &*plain, &x);
            tch::manual_seed(7);
            let vs = nn::VarStore::new(Device::Cpu);
            let mut kept = Kept::new(vs.root());
            kept.set_schedule(auto.clone()).unwrap();
            let plan = kept.plan_for(&x, true).unwrap();
            for i in [2, 3, 5] {
                assert!(
                    !plan.mode(plan.segment_of(i)).is_checkpointed(),
                    "{auto}: {plan}"
                );
            }
            counts();
            let got = step(&vs, &kept, &x);
            assert_all_equal(&format!("{auto} with kept stages vs plain"), &got, &want);
            let (blocks, _, gate) = counts();
            assert_eq!((blocks, gate), (2, 1), "{auto}: the kept stages ran once");
        }
    }
}
