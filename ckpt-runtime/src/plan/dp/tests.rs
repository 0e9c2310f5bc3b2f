//! The dynamic programs against exhaustive search over cuts and per-segment policies
//! (property tests), and their edge cases.

use super::super::{Budget, ChainCost, KeepCost, Objective, PLANNED_POLICIES, Plan, StageCost};
use super::*;
use crate::Policy;
use proptest::prelude::*;

/// Every cut set of `0..len`, as (peak, extra seconds).
fn all_plans(costs: &ChainCost) -> Vec<(Vec<usize>, u64, f64)> {
    let len = costs.len();
    let inner = len.saturating_sub(1);
    (0u32..1 << inner)
        .map(|mask| {
            let cuts: Vec<usize> = (1..len).filter(|c| mask & (1 << (c - 1)) != 0).collect();
            let p = costs.evaluate(&cuts).unwrap();
            (cuts, p.predicted_peak_bytes(), p.predicted_extra_seconds())
        })
        .collect()
}

fn stage() -> impl Strategy<Value = StageCost> {
    (
        0u64..1000,
        0u64..1000,
        0u64..300,
        0u64..300,
        prop_oneof![Just(0.0), 0.0f64..10.0],
    )
        .prop_map(|(i, k, f, b, s)| StageCost {
            input_bytes: i,
            kept_bytes: k,
            forward_extra_bytes: f,
            backward_extra_bytes: b,
            forward_seconds: s,
            ..StageCost::default()
        })
}

/// Chains of up to `max` stages drawn by `stage`, with random output and checkpoint
/// bytes.
pub(super) fn chain_of(
    stage: impl Strategy<Value = StageCost>,
    max: usize,
) -> impl Strategy<Value = ChainCost> {
    (prop::collection::vec(stage, 0..=max), 0u64..1000, 0u64..50).prop_map(
        |(stages, output_bytes, checkpoint_bytes)| ChainCost {
            stages,
            output_bytes,
            checkpoint_bytes,
        },
    )
}

fn chain() -> impl Strategy<Value = ChainCost> {
    chain_of(stage(), 14)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Least peak, then least time among those: equals exhaustive search.
    #[test]
    fn min_peak_equals_exhaustive(costs in chain()) {
        let plan = costs.plan(&Objective::MinPeak).unwrap();
        let all = all_plans(&costs);
        let best_peak = all.iter().map(|p| p.1).min().unwrap();
        let best_time = all
            .iter()
            .filter(|p| p.1 == best_peak)
            .map(|p| p.2)
            .fold(f64::INFINITY, f64::min);
        prop_assert_eq!(plan.predicted_peak_bytes(), best_peak);
        prop_assert_eq!(plan.predicted_extra_seconds(), best_time);
    }

    /// Least time within a budget, then least peak among those: equals exhaustive
    /// search; a budget below the least peak is an error stating the least peak.
    #[test]
    fn budget_equals_exhaustive(costs in chain(), sel in 0u64..1200) {
        let all = all_plans(&costs);
        let least = all.iter().map(|p| p.1).min().unwrap();
        let plain = all[0].1;
        // Below the least peak (infeasible unless `sel` = 0), or between it and a
        // tenth above the plain run's.
        let budget = if sel < 100 {
            least.saturating_sub(sel)
        } else {
            least + (plain - least) * (sel - 100) / 1000
        };
        let fits: Vec<_> = all.iter().filter(|p| p.1 <= budget).collect();
        match costs.plan(&Objective::Budget(Budget::Bytes(budget))) {
            Ok(plan) => {
                let best_time = fits.iter().map(|p| p.2).fold(f64::INFINITY, f64::min);
                let best_peak = fits.iter().filter(|p| p.2 == best_time).map(|p| p.1).min().unwrap();
                prop_assert_eq!(plan.predicted_extra_seconds(), best_time);
                prop_assert_eq!(plan.predicted_peak_bytes(), best_peak);
                prop_assert!(plan.predicted_peak_bytes() <= budget);
                prop_assert_eq!(plan.budget_bytes(), Some(budget));
            }
            Err(CkptError::BudgetTooSmall { budget_bytes, min_bytes, .. }) => {
                prop_assert!(fits.is_empty());
                prop_assert_eq!(budget_bytes, budget);
                prop_assert_eq!(min_bytes, least);
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }
}

/// Every cut set of `0..len` with every policy of [`PLANNED_POLICIES`] per
/// checkpointed segment, as (peak, extra seconds).
fn all_plans_with_policies(costs: &ChainCost) -> Vec<(u64, f64)> {
    let len = costs.len();
    let inner = len.saturating_sub(1);
    let mut out = Vec::new();
    for mask in 0u32..1 << inner {
        let cuts: Vec<usize> = (1..len).filter(|c| mask & (1 << (c - 1)) != 0).collect();
        let n = PLANNED_POLICIES.len();
        for choice in 0..n.pow(cuts.len() as u32) {
            let policies: Vec<Policy> = (0..cuts.len())
                .map(|j| PLANNED_POLICIES[choice / n.pow(j as u32) % n])
                .collect();
            let p = costs.evaluate_with_policies(&cuts, &policies).unwrap();
            assert_eq!(p.policies(), &policies[..]);
            out.push((p.predicted_peak_bytes(), p.predicted_extra_seconds()));
        }
    }
    out
}

/// Seconds in quarters, so that every sum is exact and ties are real ties.
pub(super) fn quarters(max: u32) -> impl Strategy<Value = f64> {
    (0..=max * 4).prop_map(|q| f64::from(q) / 4.0)
}

pub(super) fn keep_cost() -> impl Strategy<Value = Option<KeepCost>> {
    prop::option::weighted(
        0.8,
        (0u64..600, quarters(10)).prop_map(|(kept_bytes, recompute_seconds)| KeepCost {
            kept_bytes,
            recompute_seconds,
        }),
    )
}

pub(super) fn policy_stage() -> impl Strategy<Value = StageCost> {
    (
        (0u64..1000, 0u64..1000, 0u64..300, 0u64..300),
        quarters(10),
        keep_cost(),
        keep_cost(),
        keep_cost(),
    )
        .prop_map(|((i, k, f, b), s, masks, narrowing, selective)| StageCost {
            input_bytes: i,
            kept_bytes: k,
            forward_extra_bytes: f,
            backward_extra_bytes: b,
            forward_seconds: s,
            masks,
            narrowing,
            selective,
        })
}

fn policy_chain() -> impl Strategy<Value = ChainCost> {
    chain_of(policy_stage(), 7)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// With a policy per segment: least peak, then least time among those, equals
    /// exhaustive search over cut sets x policies.
    #[test]
    fn min_peak_with_policies_equals_exhaustive(costs in policy_chain()) {
        let plan = costs.plan(&Objective::MinPeak).unwrap();
        prop_assert_eq!(plan.policies().len(), plan.cuts().len());
        let all = all_plans_with_policies(&costs);
        let best_peak = all.iter().map(|p| p.0).min().unwrap();
        let best_time = all
            .iter()
            .filter(|p| p.0 == best_peak)
            .map(|p| p.1)
            .fold(f64::INFINITY, f64::min);
        prop_assert_eq!(plan.predicted_peak_bytes(), best_peak);
        prop_assert_eq!(plan.predicted_extra_seconds(), best_time);
        // The plan's figures are those of evaluating its cuts and policies.
        let again = costs.evaluate_with_policies(plan.cuts(), plan.policies()).unwrap();
        prop_assert_eq!(again.predicted_peak_bytes(), plan.predicted_peak_bytes());
    }

    /// With a policy per segment: least time within a budget, then least peak,
    /// equals exhaustive search; too small a budget states the least peak.
    #[test]
    fn budget_with_policies_equals_exhaustive(costs in policy_chain(), sel in 0u64..1200) {
        let all = all_plans_with_policies(&costs);
        let budget = budget_between(&all, sel);
        let plan = costs.plan(&Objective::Budget(Budget::Bytes(budget)));
        check_budget_plan(plan.as_ref(), &all, budget)?;
    }
}

/// A budget for property tests from the (peak, seconds) of every plan: below the least
/// peak (infeasible unless `sel` = 0) for `sel < 100`, else between it and a tenth above
/// the plain run's (`all[0]`).
pub(super) fn budget_between(all: &[(u64, f64)], sel: u64) -> u64 {
    let least = all.iter().map(|p| p.0).min().unwrap();
    if sel < 100 {
        least.saturating_sub(sel)
    } else {
        least + (all[0].0.max(least) - least) * (sel - 100) / 1000
    }
}

/// Checks the planner's answer for `budget` against exhaustive search (`all`, the
/// (peak, seconds) of every plan): the least time within the budget, then the least
/// peak; too small a budget states the least peak.
pub(super) fn check_budget_plan(
    plan: Result<&Plan, &CkptError>,
    all: &[(u64, f64)],
    budget: u64,
) -> Result<(), TestCaseError> {
    let least = all.iter().map(|p| p.0).min().unwrap();
    let fits: Vec<_> = all.iter().filter(|p| p.0 <= budget).collect();
    match plan {
        Ok(plan) => {
            let best_time = fits.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
            let best_peak = fits
                .iter()
                .filter(|p| p.1 == best_time)
                .map(|p| p.0)
                .min()
                .unwrap();
            prop_assert_eq!(plan.predicted_extra_seconds(), best_time);
            prop_assert_eq!(plan.predicted_peak_bytes(), best_peak);
            prop_assert!(plan.predicted_peak_bytes() <= budget);
        }
        Err(&CkptError::BudgetTooSmall {
            budget_bytes,
            min_bytes,
            ..
        }) => {
            prop_assert!(fits.is_empty());
            prop_assert_eq!(budget_bytes, budget);
            prop_assert_eq!(min_bytes, least);
        }
        Err(e) => prop_assert!(false, "unexpected error {e}"),
    }
    Ok(())
}

/// Without the choice (a user-fixed policy), or without figures, every segment
/// recomputes everything, and the plans are those of the program without policies.
#[test]
fn no_policy_figures_or_no_choice_is_full_recompute() {
    let mut costs = residual_chain(16);
    let plain = costs.plan_min_peak().unwrap();
    assert!(plain.policies().iter().all(|&p| p == Policy::RECOMPUTE_ALL));
    // Dropout masks: 1 byte kept of 2 per stage, and half the recompute saved.
    for s in &mut costs.stages {
        s.masks = Some(KeepCost {
            kept_bytes: 1,
            recompute_seconds: 0.5,
        });
    }
    let fixed = costs
        .plan_with(&Objective::MinPeak, &[Policy::RECOMPUTE_ALL])
        .unwrap();
    assert_eq!(fixed.cuts(), plain.cuts());
    assert!(fixed.policies().iter().all(|&p| p == Policy::RECOMPUTE_ALL));
    // A loose budget: keeping masks in the checkpointed segments costs bytes but
    // halves their recompute, so the planner keeps them where the budget allows.
    let plan = costs.plan_within(Budget::Bytes(30)).unwrap();
    assert!(plan.policies().contains(&super::super::MASKS), "{plan:?}");
    let full = costs
        .plan_with(
            &Objective::Budget(Budget::Bytes(30)),
            &[Policy::RECOMPUTE_ALL],
        )
        .unwrap();
    // Only masks allowed: every checkpointed segment keeps them.
    let masks = costs
        .plan_with(
            &Objective::Budget(Budget::Bytes(30)),
            &[super::super::MASKS],
        )
        .unwrap();
    assert!(masks.policies().iter().all(|&p| p == super::super::MASKS));
    assert!(costs.plan_with(&Objective::MinPeak, &[]).is_err());
    assert!(plan.predicted_extra_seconds() < full.predicted_extra_seconds());
    assert!(plan.predicted_peak_bytes() <= 30);
    // A policy the planner does not model is an error in evaluate.
    assert!(matches!(
        costs.evaluate_with_policies(&[4], &[Policy::selective().save_dropout_masks(false)]),
        Err(CkptError::InvalidArgument(_))
    ));
    assert!(matches!(
        costs.evaluate_with_policies(&[4], &[]),
        Err(CkptError::InvalidArgument(_))
    ));
}

/// A uniform chain: the stage `x + relu(linear(x))` of `tests/plan.rs`, in units of
/// one activation (input 1, kept 2, forward temporaries 1, backward 1).
pub(super) fn residual_chain(len: usize) -> ChainCost {
    ChainCost::uniform(
        len,
        StageCost {
            input_bytes: 1,
            kept_bytes: 2,
            forward_extra_bytes: 1,
            backward_extra_bytes: 1,
            forward_seconds: 1.0,
            ..StageCost::default()
        },
    )
}

#[test]
fn uniform_chain_gets_about_sqrt_len_segments() {
    let costs = residual_chain(64);
    let plan = costs.plan_min_peak().unwrap();
    // Plain: 64 stages kept (128) + the last stage's incoming gradient and
    // backward temporaries (2).
    assert_eq!(plan.plain_peak_bytes(), 130);
    // Segments shrink by one stage every two, as later segments are recomputed
    // on top of more stashes: 8, 7, 7, 6, 6, .. , 2, 2, 1 and the plain 1.
    assert_eq!(
        plan.cuts(),
        [8, 15, 22, 28, 34, 39, 44, 48, 52, 55, 58, 60, 62, 63]
    );
    assert_eq!(plan.predicted_peak_bytes(), 18);
    assert_eq!(plan.segments(), 15); // about sqrt(4 * 64) = 16
    // Every equal split (`segments = n`, PyTorch's grouping: the last group takes the
    // rest) is worse; the best are n = 8 (7 stashes + 8 stages kept twice + 2) and
    // n = 16.
    let best_equal = (1..=64)
        .map(|n| {
            let r = crate::sequential_segments(64, n).unwrap();
            let cuts: Vec<usize> = r[1..].iter().map(|r| r.start).collect();
            costs.evaluate(&cuts).unwrap().predicted_peak_bytes()
        })
        .min()
        .unwrap();
    assert_eq!(best_equal, 25);
    // Within a budget, the least recompute: 30 bytes let the plain segment start at
    // stage 52 (its 12 stages, 26 bytes with the last one's backward, are not
    // recomputed).
    let plan = costs.plan_within(Budget::Bytes(30)).unwrap();
    assert_eq!(plan.recomputed_stages(), 52);
    assert_eq!(plan.predicted_extra_seconds(), 52.0);
    assert!(plan.predicted_peak_bytes() <= 30);
}

#[test]
fn impossible_budget_states_the_least_peak() {
    let costs = residual_chain(64);
    let err = costs.plan_within(Budget::Bytes(17)).unwrap_err();
    assert_eq!(
        err,
        CkptError::BudgetTooSmall {
            budget_bytes: 17,
            min_bytes: 18,
            plain_bytes: 130,
            marked_keep: false,
        }
    );
    assert_eq!(
        err.to_string(),
        "memory budget of 17 B (17 B, 13.1 % of the plain run's peak) is too small: the smallest feasible peak of this chain is 18 B (18 B, 13.8 % of the plain run's peak)"
    );
    // 13.8 % of the plain 130 bytes is 17 bytes (rounded down).
    assert!(matches!(
        costs.plan_within(Budget::FractionOfPlain(0.138)),
        Err(CkptError::BudgetTooSmall {
            budget_bytes: 17,
            min_bytes: 18,
            ..
        })
    ));
    assert!(costs.plan_within(Budget::FractionOfPlain(0.139)).is_ok());
}

#[test]
fn empty_and_single_stage_chains() {
    let plan = residual_chain(0).plan_min_peak().unwrap();
    assert_eq!((plan.cuts(), plan.predicted_peak_bytes()), (&[][..], 0));
    assert_eq!(plan.ranges(), vec![0..0]);
    let plan = residual_chain(1).plan_min_peak().unwrap();
    assert_eq!((plan.cuts(), plan.predicted_peak_bytes()), (&[][..], 4));
}

#[test]
fn evaluate_rejects_bad_cuts_and_profiles() {
    let costs = residual_chain(4);
    for cuts in [&[0][..], &[2, 2], &[3, 1], &[4]] {
        assert!(matches!(
            costs.evaluate(cuts),
            Err(CkptError::InvalidArgument(_))
        ));
    }
    let mut bad = costs.clone();
    bad.stages[1].forward_seconds = f64::NAN;
    assert!(matches!(
        bad.plan_min_peak(),
        Err(CkptError::InvalidArgument(_))
    ));
    let mut huge = costs;
    huge.stages[0].kept_bytes = u64::MAX;
    assert!(matches!(
        huge.plan_min_peak(),
        Err(CkptError::InvalidArgument(_))
    ));
}

#[test]
fn explain_prints_the_plan() {
    let mut plan = residual_chain(8).plan_within(Budget::Bytes(12)).unwrap();
    plan.set_measured_peak_bytes(11);
    assert!(plan.explain().starts_with(&plan.to_string()));
    assert_eq!(
        plan.to_string(),
        "plan for 8 stages: 2 segments (1 checkpointed, the last plain)
  cuts: [4]
  segments: 0..4 | 4..8
  predicted peak: 11 B (11 B), during the forward and backward of the plain segment
  plain run, predicted: 18 B (61.1 % of it)
  budget: 12 B (12 B)
  predicted extra time: 4.000 s (recompute of 4 stages)
  measured peak: 11 B (11 B) (+0.0 % vs predicted)"
    );
}

#[test]
fn explain_lists_the_stages_with_their_segments() {
    let plan = residual_chain(8)
        .plan_within(Budget::Bytes(12))
        .unwrap()
        .with_stage_names((0..8).map(|i| format!("block {i}")).collect());
    assert_eq!(plan.cuts(), [4]);
    let text = plan.explain();
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("stage"))
        .collect();
    assert_eq!(rows.len(), 9, "{text}");
    assert!(
        rows[1].contains("block 0") && rows[1].contains("1 (recomputed, full)"),
        "{text}"
    );
    assert!(
        rows[4].contains("block 3") && rows[4].contains("1 (recomputed, full)"),
        "{text}"
    );
    assert!(
        rows[5].contains("block 4") && rows[5].contains("2 (plain)"),
        "{text}"
    );
    assert_eq!(plan.segment_of(3), 0);
    assert_eq!(plan.segment_of(4), 1);
}

#[test]
fn peak_phase_is_reported() {
    let costs = residual_chain(8);
    // Stages 0..6 recomputed on top of their held output gradient: 6 * 2 + 1 + 1.
    let plan = costs.evaluate(&[6]).unwrap();
    assert_eq!(plan.peak_phase(), Phase::Recompute { segment: 0 });
    assert_eq!(plan.predicted_peak_bytes(), 14);
    assert!(
        plan.explain()
            .contains("14 B (14 B), during the recompute of segment 1 of 2 (stages 0..6)")
    );
    let plan = costs.evaluate(&[2]).unwrap();
    assert_eq!(plan.peak_phase(), Phase::Plain);
    assert_eq!(plan.predicted_peak_bytes(), 1 + 6 * 2 + 2);
}

/// The planner's own run time on 1,000-stage chains (a benchmark: run with
/// `cargo test -p ckpt-runtime --release --lib plan_1000_stages -- --ignored --nocapture`).
#[test]
#[ignore = "benchmark; prints timings"]
fn plan_1000_stages() {
    use std::time::Instant;
    let uniform = residual_chain(1000);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % m
    };
    let random = ChainCost {
        stages: (0..1000)
            .map(|_| StageCost {
                input_bytes: 1 + next(1 << 20),
                kept_bytes: next(4 << 20),
                forward_extra_bytes: next(1 << 20),
                backward_extra_bytes: next(2 << 20),
                forward_seconds: next(1000) as f64 * 1e-6,
                ..StageCost::default()
            })
            .collect(),
        output_bytes: 1 << 20,
        checkpoint_bytes: 5056,
    };
    for (name, costs) in [("uniform", &uniform), ("random", &random)] {
        for (label, objective) in [
            ("min peak", Objective::MinPeak),
            (
                "budget 30%",
                Objective::Budget(Budget::FractionOfPlain(0.3)),
            ),
        ] {
            let runs = 20;
            let start = Instant::now();
            let mut plan = None;
            for _ in 0..runs {
                plan = Some(costs.plan(&objective).unwrap());
            }
            let each = start.elapsed().as_secs_f64() / f64::from(runs);
            let plan = plan.unwrap();
            println!(
                "1000-stage {name} chain, {label}: {:.3} ms per plan, {} segments, peak {:.1} % of plain",
                each * 1e3,
                plan.segments(),
                100.0 * plan.predicted_peak_bytes() as f64 / plan.plain_peak_bytes() as f64
            );
        }
    }
}
