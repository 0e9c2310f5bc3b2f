//! The planner with kept segments against exhaustive search over cuts and per-segment
//! modes (checkpointed with each policy, or kept) under random keep constraints, and the
//! cost model of a kept segment worked by hand.

use super::super::{
    Budget, ChainCost, KeepCost, Keeping, Objective, PLANNED_POLICIES, SegmentMode,
};
use super::tests::{budget_between, chain_of, check_budget_plan, policy_stage, residual_chain};
use crate::{CkptError, Policy};
use proptest::prelude::*;

/// Whether a plan's segments obey `keeping`: a kept segment holds only stages that may
/// be kept, a checkpointed one no stage that must be.
fn obeys(keeping: &Keeping, cuts: &[usize], modes: &[SegmentMode]) -> bool {
    let mut start = 0;
    cuts.iter().zip(modes).all(|(&end, &m)| {
        let r = start..end;
        start = end;
        match m {
            SegmentMode::Kept => r.clone().all(|i| keeping.may(i)),
            _ => !r.clone().any(|i| keeping.must(i)),
        }
    })
}

/// Every cut set of `0..len` with every mode per segment but the last (checkpointed with
/// each of `allowed`, or kept) that obeys `keeping`, as (peak, extra seconds).
fn all_plans(costs: &ChainCost, allowed: &[Policy], keeping: &Keeping) -> Vec<(u64, f64)> {
    let len = costs.len();
    let inner = len.saturating_sub(1);
    let mut choices: Vec<SegmentMode> = allowed
        .iter()
        .map(|&p| SegmentMode::Checkpointed(p))
        .collect();
    choices.push(SegmentMode::Kept);
    let n = choices.len();
    let mut out = Vec::new();
    for mask in 0u32..1 << inner {
        let cuts: Vec<usize> = (1..len).filter(|c| mask & (1 << (c - 1)) != 0).collect();
        for choice in 0..n.pow(cuts.len() as u32) {
            let modes: Vec<SegmentMode> = (0..cuts.len())
                .map(|j| choices[choice / n.pow(j as u32) % n])
                .collect();
            if !obeys(keeping, &cuts, &modes) {
                continue;
            }
            let p = costs.evaluate_with_modes(&cuts, &modes).unwrap();
            out.push((p.predicted_peak_bytes(), p.predicted_extra_seconds()));
        }
    }
    out
}

fn keeping(len: usize) -> impl Strategy<Value = Keeping> {
    (
        prop::collection::vec(prop::bool::weighted(0.7), len),
        prop::collection::vec(prop::bool::weighted(0.15), len),
    )
        .prop_map(|(may, must)| Keeping { may, must })
}

/// A chain of up to 6 stages, its keep constraints, and the policies allowed (all, or
/// full recompute alone).
fn case() -> impl Strategy<Value = (ChainCost, Keeping, Vec<Policy>)> {
    chain_of(policy_stage(), 6).prop_flat_map(|c| {
        let len = c.len();
        (
            Just(c),
            keeping(len),
            prop_oneof![
                Just(PLANNED_POLICIES.to_vec()),
                Just(vec![Policy::RECOMPUTE_ALL])
            ],
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Least peak, then least time among those, equals exhaustive search over cut
    /// sets x modes; the plan obeys the constraints and evaluates to its own figures.
    #[test]
    fn min_peak_with_kept_equals_exhaustive((costs, keep, allowed) in case()) {
        let plan = costs.plan_keeping(&Objective::MinPeak, &allowed, &keep).unwrap();
        let modes: Vec<SegmentMode> = (0..plan.cuts().len()).map(|j| plan.mode(j)).collect();
        prop_assert!(obeys(&keep, plan.cuts(), &modes), "{plan:?}");
        let all = all_plans(&costs, &allowed, &keep);
        let best_peak = all.iter().map(|p| p.0).min().unwrap();
        let best_time = all
            .iter()
            .filter(|p| p.0 == best_peak)
            .map(|p| p.1)
            .fold(f64::INFINITY, f64::min);
        prop_assert_eq!(plan.predicted_peak_bytes(), best_peak);
        prop_assert_eq!(plan.predicted_extra_seconds(), best_time);
        let again = costs.evaluate_with_modes(plan.cuts(), &modes).unwrap();
        prop_assert_eq!(again.predicted_peak_bytes(), plan.predicted_peak_bytes());
        prop_assert_eq!(again.predicted_extra_seconds(), plan.predicted_extra_seconds());
    }

    /// Least time within a budget, then least peak, equals exhaustive search; too small
    /// a budget states the least peak.
    #[test]
    fn budget_with_kept_equals_exhaustive(
        (costs, keep, allowed) in case(),
        sel in 0u64..1200,
    ) {
        let all = all_plans(&costs, &allowed, &keep);
        let budget = budget_between(&all, sel);
        let objective = Objective::Budget(Budget::Bytes(budget));
        let plan = costs.plan_keeping(&objective, &allowed, &keep);
        if let Ok(plan) = &plan {
            let modes: Vec<SegmentMode> = (0..plan.cuts().len()).map(|j| plan.mode(j)).collect();
            prop_assert!(obeys(&keep, plan.cuts(), &modes), "{plan:?}");
        }
        check_budget_plan(plan.as_ref(), &all, budget)?;
    }
}

/// The residual chain (input 1, kept 2, forward temporaries 1, backward 1, 1 s a stage)
/// cut at 2 and 4, worked by hand.
#[test]
fn kept_segment_by_hand() {
    let costs = residual_chain(8);
    let ckpt = SegmentMode::Checkpointed(Policy::RECOMPUTE_ALL);
    // All checkpointed: segment 0..2 recomputed on its held output gradient
    // (2 + max(2 + 2, 4 + 1) = 6 with the gradient's 1), segment 2..4 the same on the
    // stash of x_2 (7), the plain 4..8 on two stashes: 2 + 8 + 2 = 12.
    let plan = costs.evaluate_with_modes(&[2, 4], &[ckpt, ckpt]).unwrap();
    assert_eq!(plan.predicted_peak_bytes(), 12);
    assert_eq!(plan.predicted_extra_seconds(), 4.0);
    // 0..2 kept: its 4 bytes (x_2 included) held from its forward on, no stash for
    // 2..4 (x_2 is in them), no recompute of stages 0 and 1. Its own phase:
    // 4 + the last stage's incoming gradient and backward 2 = 6; 2..4: 4 + 6 = 10;
    // plain: 4 + x_4 + 8 + 2 = 15.
    let plan = costs
        .evaluate_with_modes(&[2, 4], &[SegmentMode::Kept, ckpt])
        .unwrap();
    assert_eq!(plan.predicted_peak_bytes(), 15);
    assert_eq!(plan.predicted_extra_seconds(), 2.0);
    assert_eq!(plan.recomputed_stages(), 2);
    assert_eq!(plan.mode(0), SegmentMode::Kept);
    assert_eq!(plan.mode(1), ckpt);
    assert_eq!(plan.mode(2), SegmentMode::Plain);
    assert_eq!(plan.policies(), [Policy::RECOMPUTE_ALL; 2]);
    // A kept segment whose forward temporaries are the peak: stage 0 makes 100.
    let mut big = residual_chain(4);
    big.stages[0].forward_extra_bytes = 100;
    let plan = big.evaluate_with_modes(&[1], &[SegmentMode::Kept]).unwrap();
    assert_eq!(plan.predicted_peak_bytes(), 102);
    assert_eq!(plan.peak_phase(), super::super::Phase::Kept { segment: 0 });
    assert!(
        plan.to_string()
            .contains("during the forward and backward of kept segment 1 of 2 (stages 0..1)"),
        "{plan}"
    );
    // Plain is not a mode for a segment before the last.
    assert!(matches!(
        costs.evaluate_with_modes(&[2], &[SegmentMode::Plain]),
        Err(CkptError::InvalidArgument(_))
    ));
}

/// A budget between all-checkpointed and plain: the planner keeps the stage whose
/// recompute is dear and whose activations are cheap, and a forced stage is never
/// recomputed.
#[test]
fn planner_keeps_within_a_budget_and_forced_stages() {
    let mut costs = residual_chain(8);
    costs.stages[0].forward_seconds = 10.0;
    let all = Keeping::all(8);
    let budget = Objective::Budget(Budget::Bytes(17));
    // Without keeping, 17 bytes allow the plain segment from stage 1 (1 + 14 + 2): stage
    // 0 recomputed, 10 s.
    let none = costs.plan_with(&budget, &[Policy::RECOMPUTE_ALL]).unwrap();
    assert_eq!(none.predicted_extra_seconds(), 10.0);
    // Kept, stage 0 holds its 2 bytes (x_1 included) instead of the stash of x_1, one
    // more byte: 0..1 kept, 1..2 checkpointed (1 s), the plain 2..8 on 2 + 1 bytes:
    // 3 + 12 + 2 = 17.
    let kept = costs
        .plan_keeping(&budget, &[Policy::RECOMPUTE_ALL], &all)
        .unwrap();
    assert_eq!(kept.cuts(), [1, 2], "{kept}");
    assert_eq!(kept.mode(0), SegmentMode::Kept);
    assert_eq!(kept.predicted_extra_seconds(), 1.0);
    assert_eq!(kept.predicted_peak_bytes(), 17);
    let text = kept.explain();
    assert!(
        text.contains(
            "segment 1 (stages 0..1): kept (the planner's choice): runs once, holds 2 B, saves 10.000 s of recompute"
        ),
        "{text}"
    );
    assert!(
        text.contains("(1 checkpointed, 1 kept, the last plain)"),
        "{text}"
    );
    // With a cheaper policy allowed, the saving explain states is that policy's recompute,
    // which is what the planner weighed keeping against, not the forward's 10 s.
    let mut cheap = costs.clone();
    cheap.stages[0].selective = Some(KeepCost {
        kept_bytes: 0,
        recompute_seconds: 4.0,
    });
    let both = [Policy::RECOMPUTE_ALL, Policy::selective()];
    let kept = cheap.plan_keeping(&budget, &both, &all).unwrap();
    assert_eq!(kept.mode(0), SegmentMode::Kept, "{kept}");
    let text = kept.explain();
    assert!(
        text.contains(
            "segment 1 (stages 0..1): kept (the planner's choice): runs once, holds 2 B, saves 4.000 s of recompute (under selective, its cheapest policy)"
        ),
        "{text}"
    );
    // Stage 1 forced kept: in every plan, its segment is kept or the plain one.
    let forced = Keeping::none().with_forced(8, |i| i == 1);
    for objective in [Objective::MinPeak, Objective::Budget(Budget::Bytes(16))] {
        let plan = costs
            .plan_keeping(&objective, &PLANNED_POLICIES, &forced)
            .unwrap();
        assert!(!plan.mode(plan.segment_of(1)).is_checkpointed(), "{plan}");
    }
}
