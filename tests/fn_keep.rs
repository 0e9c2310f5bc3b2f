//! The planner keeps statements of a `#[checkpointed(segments = auto | budget)]` function
//! (issue 14), as it keeps `model!` stages (`tests/plan_keep.rs`): on a statement that is
//! dear to recompute and cheap to keep, before a layer loop of residual blocks, the
//! budget plans keep that statement instead of recomputing it; the measured peak of
//! every planned step is within 10 % of the prediction; gradients equal the plain
//! function's bit for bit; a statement marked `#[ckpt::keep]` runs once a step under
//! every schedule, `segments = N` over a layer loop included, and so does every
//! iteration of a kept `fold`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::plan::Plan;
use ckpt::{ShallowClone, checkpointed};
use common::residual::{Block, D, keeps, slow};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

/// The memory meter, `live_segments` and the run counter are process-wide: the tests
/// take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const BATCH: i64 = 1024;
const BLOCKS: i64 = 10;

/// How often the statement of block `first` ran.
static FIRST: AtomicUsize = AtomicUsize::new(0);

fn counted(t: Tensor) -> Tensor {
    FIRST.fetch_add(1, Ordering::SeqCst);
    t
}

#[derive(Debug, ShallowClone)]
struct Net {
    first: Block,
    blocks: Vec<Block>,
}

impl Net {
    fn new(p: &nn::Path) -> Self {
        Net {
            first: Block::new(p / "first"),
            blocks: (0..BLOCKS).map(|i| Block::new(p / "blocks" / i)).collect(),
        }
    }

    /// The unannotated forward: 12 stages, `slow, first, blocks[0..10]`.
    fn plain(&self, x: &Tensor) -> Tensor {
        let h = slow(x);
        let mut h = counted(self.first.forward(&h));
        for b in self.blocks.iter() {
            h = b.forward(&h);
        }
        h
    }
}

/// Defines `Net::$name` with `#[checkpointed($($arg)*)]` over the plain forward's body,
/// `$($keep)*` on the statement of block `first`.
macro_rules! forward {
    ($name:ident, ($($arg:tt)*) $(, $keep:meta)?) => {
        impl Net {
            #[checkpointed($($arg)*)]
            fn $name(&self, x: &Tensor) -> Tensor {
                let h = slow(x);
                $(#[$keep])?
                let mut h = counted(self.first.forward(&h));
                for b in self.blocks.iter() {
                    h = b.forward(&h);
                }
                h
            }
        }
    };
}

forward!(min_peak, (segments = auto));
forward!(budget50, (budget = "50%"));
forward!(budget65, (budget = "65%"));
forward!(budget80, (budget = "80%"));
forward!(forced_min_peak, (segments = auto), ckpt::keep);
forward!(forced_budget50, (budget = "50%"), ckpt::keep);
forward!(forced_segments3, (segments = 3), ckpt::keep);
forward!(forced_impossible, (budget = "10%"), ckpt::keep);

impl Net {
    /// The blocks as a `fold`, kept whole: every iteration runs once.
    #[checkpointed(segments = auto)]
    fn kept_fold(&self, x: &Tensor) -> Tensor {
        let h = slow(x);
        let h = self.first.forward(&h);
        #[ckpt::keep]
        let h = self.blocks.iter().fold(h, |h, b| counted(b.forward(&h)));
        h.tanh()
    }

    fn plain_fold(&self, x: &Tensor) -> Tensor {
        let h = slow(x);
        let h = self.first.forward(&h);
        let h = self.blocks.iter().fold(h, |h, b| counted(b.forward(&h)));
        h.tanh()
    }
}

type Forward = fn(&Net, &Tensor) -> Tensor;

struct Setup {
    vs: nn::VarStore,
    net: Net,
    x: Tensor,
    w: Tensor,
}

fn setup(seed: i64, batch: i64) -> Setup {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs.root());
    let x = Tensor::randn([batch, D], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([batch, D], (Kind::Float, Device::Cpu));
    Setup { vs, net, x, w }
}

/// One training step of `f` with the loss `(f(x) * w).sum()`: its peak tensor bytes
/// above the baseline, the gradients of every variable (zeroed before), and how often
/// the counted statement ran.
fn step(s: &Setup, f: Forward) -> (u64, Vec<Tensor>, usize) {
    let mut vars = s.vs.trainable_variables();
    for v in &mut vars {
        v.zero_grad();
    }
    FIRST.store(0, Ordering::SeqCst);
    let ((), report) = ckpt::memory::measure(Device::Cpu, || {
        // The output and the product are temporaries, freed before backward (as the
        // cost model assumes).
        let loss = (f(&s.net, &s.x) * &s.w).sum(Kind::Float);
        loss.backward();
    });
    let grads = vars.iter().map(|v| v.grad().copy()).collect();
    (
        u64::try_from(report.peak_above_baseline_bytes).unwrap(),
        grads,
        FIRST.load(Ordering::SeqCst),
    )
}

/// The plan `function_plans` lists for the function whose name starts with `name`, for
/// the input of `s` (the tests call the same functions on inputs of other sizes).
fn plan_of(s: &Setup, name: &str) -> Plan {
    let all = ckpt::plan::function_plans();
    let input = format!("[{:?} ", s.x.size());
    let mine: Vec<_> = all
        .iter()
        .filter(|p| p.function.starts_with(&format!("{name} (")) && p.input.starts_with(&input))
        .collect();
    assert_eq!(mine.len(), 1, "{name}: {all:#?}");
    mine[0].plan.clone()
}

#[test]
fn the_planner_keeps_statements_and_predicts_the_peak() {
    let _serial = serial();
    let s = setup(0, BATCH);
    let _ = step(&s, Net::plain); // allocates the parameters' gradients
    let cases: [(&str, Forward); 4] = [
        ("Net::min_peak", Net::min_peak),
        ("Net::budget50", Net::budget50),
        ("Net::budget65", Net::budget65),
        ("Net::budget80", Net::budget80),
    ];
    let mut kept_any = false;
    for (name, f) in cases {
        let _ = step(&s, f); // profiles and plans
        let (measured, _, _) = step(&s, f);
        let mut plan = plan_of(&s, name);
        assert_eq!(
            plan.len(),
            13,
            "{name}: slow, first, the 10 blocks, the last"
        );
        let predicted = plan.predicted_peak_bytes();
        plan.set_measured_peak_bytes(measured);
        println!("{name}:\n{}\n", plan.explain());
        let error = (measured as f64 - predicted as f64).abs() / predicted as f64;
        assert!(
            error <= 0.10,
            "{name}: measured {measured} vs predicted {predicted}"
        );
        if let Some(budget) = plan.budget_bytes() {
            assert!(predicted <= budget, "{name}");
            // The slow statement is not recomputed: kept (or plain).
            assert!(!plan.mode(plan.segment_of(0)).is_checkpointed(), "{plan}");
        }
        // The forward runs this plan: one live segment per checkpointed segment.
        let y = f(&s.net, &s.x);
        let checkpointed = (0..plan.segments())
            .filter(|&j| plan.mode(j).is_checkpointed())
            .count();
        assert_eq!(ckpt::live_segments(), checkpointed as i64, "{name}: {plan}");
        drop(y);
        kept_any |= keeps(&plan);
    }
    assert!(kept_any, "some plan keeps a statement");
}

#[test]
fn kept_plans_give_the_plain_gradients_and_marked_statements_run_once() {
    let _serial = serial();
    let s = setup(1, 256);
    let (_, want, runs) = step(&s, Net::plain);
    assert_eq!(runs, 1);
    let cases: [(&str, Forward, bool); 7] = [
        ("Net::min_peak", Net::min_peak, false),
        ("Net::budget50", Net::budget50, false),
        ("Net::budget65", Net::budget65, false),
        ("Net::budget80", Net::budget80, false),
        ("Net::forced_min_peak", Net::forced_min_peak, true),
        ("Net::forced_budget50", Net::forced_budget50, true),
        ("Net::forced_segments3", Net::forced_segments3, true),
    ];
    for (name, f, forced) in cases {
        // The first call of an auto function profiles its statements, running them more.
        for call in 0..3 {
            let (_, got, runs) = step(&s, f);
            common::assert_all_equal(&format!("{name}, call {call}"), &got, &want);
            if forced && call > 0 {
                assert_eq!(runs, 1, "{name}, call {call}: the kept statement runs once");
            }
        }
        if forced && !name.ends_with("segments3") {
            let plan = plan_of(&s, name);
            assert!(!plan.mode(plan.segment_of(1)).is_checkpointed(), "{plan}");
            assert!(plan.marked_keep(1) && !plan.marked_keep(0), "{plan}");
            // `explain` says the statement is kept because it is marked.
            let text = plan.explain();
            assert!(
                text.contains("kept (marked keep): runs once")
                    || text.contains("(plain, marked keep)"),
                "{text}"
            );
        }
    }
    // Without the mark, min-peak recomputes the statement of `first` (it is checkpointed).
    let (_, _, runs) = step(&s, Net::min_peak);
    let plan = plan_of(&s, "Net::min_peak");
    let recomputed = plan.mode(plan.segment_of(1)).is_checkpointed();
    assert_eq!(runs, if recomputed { 2 } else { 1 }, "{plan}");
}

#[test]
fn a_kept_fold_runs_each_iteration_once() {
    let _serial = serial();
    let s = setup(2, 64);
    let (_, want, runs) = step(&s, Net::plain_fold);
    assert_eq!(runs, BLOCKS as usize);
    for call in 0..3 {
        let (_, got, runs) = step(&s, Net::kept_fold);
        common::assert_all_equal(&format!("kept fold, call {call}"), &got, &want);
        if call > 0 {
            // (The first call profiles.)
            assert_eq!(runs, BLOCKS as usize, "call {call}: every iteration once");
        }
    }
    let plan = plan_of(&s, "Net::kept_fold");
    for stage in 2..2 + BLOCKS as usize {
        assert!(
            !plan.mode(plan.segment_of(stage)).is_checkpointed(),
            "{plan}"
        );
    }
}

/// A budget that the marked statement alone makes impossible: the panic names the mark.
#[test]
fn an_impossible_budget_says_the_marked_statements_are_kept() {
    let _serial = serial();
    let s = setup(3, 256);
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Net::forced_impossible(&s.net, &s.x)
    }))
    .expect_err("10 % of the plain peak cannot be met");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.starts_with("Net::forced_impossible (")
            && message.contains("% of the plain run's peak) is too small")
            && message.contains("the smallest feasible peak of this chain with the stages marked keep kept (every plan keeps them; unmark some to go lower) is"),
        "{message}"
    );
}
