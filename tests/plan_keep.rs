//! The planner keeps segments (issue 14): on a chain of residual blocks after a stage that
//! is dear to recompute and cheap to keep, the budgets are met by keeping that stage
//! instead of recomputing it; the measured peak of every planned step is within 10 % of
//! the prediction; gradients equal the plain model's bit for bit; a stage marked
//! `#[keep]` is kept in every plan.

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::model;
use ckpt::plan::{Objective, Schedule, SegmentMode};
use common::residual::{Block, D, keeps, slow};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

/// The memory meter and `live_segments` are process-wide: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const BATCH: i64 = 1024;

/// The chain, `$keep` on its block `first`: 12 stages, `slow, first, blocks[0..10]`.
macro_rules! chain {
    ($(#[$decl:meta])* struct $name:ident { $($keep:tt)* }) => {
        model! {
            $(#[$decl])*
            struct $name(p) {
                slow,
                $($keep)* first: Block = Block::new(p),
                blocks: [Block; 10] = Block::new(p),
            }
        }
    };
}

chain! {
    /// Cut by the planner.
    #[checkpointed(segments = auto)]
    struct Chain {}
}

chain! {
    /// Not checkpointed.
    struct Plain {}
}

chain! {
    /// The block `first` (stage 1) marked `#[keep]`.
    #[checkpointed(segments = auto)]
    struct Forced { #[keep] }
}

/// Peak tensor bytes above the baseline of one forward + backward with the loss
/// `(y * w).sum()` (a fresh gradient of `y`'s size, the cost model's assumption).
fn step_peak(model: &impl Module, x: &Tensor, w: &Tensor) -> u64 {
    let ((), report) = ckpt::memory::measure(Device::Cpu, || {
        let loss = (model.forward(x) * w).sum(Kind::Float);
        loss.backward();
    });
    u64::try_from(report.peak_above_baseline_bytes).unwrap()
}

fn budgets() -> Vec<Schedule> {
    let mut out = vec![Schedule::Auto(Objective::MinPeak)];
    for b in ["50%", "65%", "80%"] {
        out.push(Schedule::Auto(Objective::Budget(b.parse().unwrap())));
    }
    out
}

#[test]
fn planner_keeps_linear_outputs_and_predicts_the_peak() {
    let _serial = serial();
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut chain = Chain::new(vs.root());
    let x = Tensor::randn([BATCH, D], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([BATCH, D], (Kind::Float, Device::Cpu));
    // Steady state: a first step allocates the parameters' gradients.
    chain.set_segments(1).unwrap();
    let _ = step_peak(&chain, &x, &w);
    let mut kept_any = false;
    for schedule in budgets() {
        chain.set_schedule(schedule.clone()).unwrap();
        let mut plan = chain.plan_for(&x).unwrap();
        let predicted = plan.predicted_peak_bytes();
        let measured = step_peak(&chain, &x, &w);
        plan.set_measured_peak_bytes(measured);
        println!("{schedule}:\n{}\n", plan.explain());
        let error = (measured as f64 - predicted as f64).abs() / predicted as f64;
        assert!(
            error <= 0.10,
            "{schedule}: measured {measured} vs predicted {predicted}"
        );
        if let Some(budget) = plan.budget_bytes() {
            assert!(predicted <= budget, "{schedule}");
        }
        // The forward used this plan: one live segment per checkpointed segment.
        let y = chain.forward(&x);
        let checkpointed = (0..plan.segments())
            .filter(|&j| plan.mode(j).is_checkpointed())
            .count();
        assert_eq!(ckpt::live_segments(), checkpointed as i64, "{plan}");
        drop(y);
        kept_any |= keeps(&plan);
        // Within a budget the slow stage is not recomputed: kept (or plain).
        if plan.budget_bytes().is_some() {
            assert!(!plan.mode(plan.segment_of(0)).is_checkpointed(), "{plan}");
        }
    }
    assert!(kept_any, "some plan keeps a segment");
}

#[test]
fn kept_plans_give_the_plain_gradients_and_keep_marked_stages() {
    let _serial = serial();
    tch::manual_seed(1);
    let vs_plain = nn::VarStore::new(Device::Cpu);
    let plain = Plain::new(vs_plain.root());
    let x = Tensor::randn([256, D], (Kind::Float, Device::Cpu));
    let reference = common::grads_and_output(&vs_plain, &x, &|x| plain.forward(x));
    for schedule in budgets() {
        for forced in [false, true] {
            let mut vs = nn::VarStore::new(Device::Cpu);
            let (plan, got) = if forced {
                let mut m = Forced::new(vs.root());
                vs.copy(&vs_plain).unwrap();
                m.set_schedule(schedule.clone()).unwrap();
                let plan = m.plan_for(&x).unwrap();
                (plan, common::grads_and_output(&vs, &x, &|x| m.forward(x)))
            } else {
                let mut m = Chain::new(vs.root());
                vs.copy(&vs_plain).unwrap();
                m.set_schedule(schedule.clone()).unwrap();
                let plan = m.plan_for(&x).unwrap();
                (plan, common::grads_and_output(&vs, &x, &|x| m.forward(x)))
            };
            common::assert_all_equal(&format!("{schedule}, forced {forced}"), &got, &reference);
            if forced {
                assert!(!plan.mode(plan.segment_of(1)).is_checkpointed(), "{plan}");
            }
        }
    }
}

/// `checkpoint_sequential_plan` runs a plan's kept segments inline (no checkpoint node)
/// and its checkpointed ones checkpointed: the gradients of the plain chain.
#[test]
fn checkpoint_sequential_plan_runs_kept_segments_inline() {
    let _serial = serial();
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks: Vec<Block> = (0..6).map(|i| Block::new(vs.root() / i)).collect();
    let x = Tensor::randn([32, D], (Kind::Float, Device::Cpu));
    let costs = ckpt::plan::profile_sequential(&blocks, &x);
    let ckpt_full = SegmentMode::Checkpointed(ckpt::Policy::RECOMPUTE_ALL);
    let plan = costs
        .evaluate_with_modes(&[2, 4], &[SegmentMode::Kept, ckpt_full])
        .unwrap();
    assert_eq!(plan.recomputed_stages(), 2);
    let want = common::grads_and_output(&vs, &x, &|x| {
        blocks.iter().fold(x.shallow_clone(), |h, b| b.forward(&h))
    });
    let got = common::grads_and_output(&vs, &x, &|x| {
        let y = ckpt::checkpoint_sequential_plan(&blocks, &plan, x);
        // One checkpointed segment (2..4) is live; the kept 0..2 made no node.
        assert_eq!(ckpt::live_segments(), 1);
        y
    });
    common::assert_all_equal("kept plan vs plain", &got, &want);
}
