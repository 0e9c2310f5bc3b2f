//! [`Plan::explain`]'s account of the policies the planner ruled out, on a two-stage
//! chain whose figures are worked out by hand.

use super::super::{Budget, ChainCost, KeepCost, Objective, StageCost};
use super::Plan;
use crate::Policy;

/// Two stages of 4 input bytes, 8 kept bytes and 1 s forward, a 4-byte output. The only
/// cut is `[1]`: stage 0 checkpointed, with a peak of `κ + 4 + 8 + 4` (the stash, stage
/// 1's kept bytes and the output gradient, on top of what the policy keeps `κ`) against
/// 20 B plain. The masks policy keeps `masks.0` bytes and recomputes in `masks.1` s;
/// selective keeps 3 B and recomputes in 0.25 s.
fn chain(masks: (u64, f64)) -> ChainCost {
    let mut stage = StageCost::new(4, 8, 1.0);
    stage.masks = Some(KeepCost {
        kept_bytes: masks.0,
        recompute_seconds: masks.1,
    });
    stage.selective = Some(KeepCost {
        kept_bytes: 3,
        recompute_seconds: 0.25,
    });
    ChainCost::uniform(2, stage)
}

/// The lines of `plan.explain()` that say why a policy was not chosen.
fn ruled_out(plan: &Plan) -> Vec<String> {
    plan.explain()
        .lines()
        .filter(|l| l.trim_start().starts_with("not "))
        .map(|l| l.trim().to_owned())
        .collect()
}

#[test]
fn explain_says_why_each_other_policy_was_ruled_out() {
    // Within 17 B: full peaks at 16 B in 1 s, masks at 17 B in 0.5 s, selective at 19 B.
    let plan = chain((1, 0.5)).plan_within(Budget::Bytes(17)).unwrap();
    assert_eq!(plan.policies(), [Policy::masks()]);
    let text = plan.explain();
    assert!(
        text.contains(
            "\n  segment 1 (stages 0..1): checkpointed, policy masks
     full keeps 0 B, recompute 1.000 s (saves 0 s); *masks keeps 1 B, recompute 500.000 ms (saves 500.000 ms);  selective keeps 3 B, recompute 250.000 ms (saves 750.000 ms)
    not full: saves less time (500.000 ms more: extra time 1.000 s against 500.000 ms)
    not selective: would peak at 19 B > budget 17 B
  stage"
        ),
        "{text}"
    );
    // The least peak: full recompute's 16 B.
    let plan = chain((1, 0.5)).plan_min_peak().unwrap();
    assert_eq!(plan.policies(), [Policy::RECOMPUTE_ALL]);
    assert_eq!(
        ruled_out(&plan),
        [
            "not masks: would peak at 17 B > 16 B, the least peak",
            "not selective: would peak at 19 B > 16 B, the least peak",
        ]
    );
    // Within 17 B, masks as slow as full: the same time, a higher peak.
    let plan = chain((1, 1.0)).plan_within(Budget::Bytes(17)).unwrap();
    assert_eq!(plan.policies(), [Policy::RECOMPUTE_ALL]);
    assert_eq!(
        ruled_out(&plan),
        [
            "not masks: as fast, but would peak higher (17 B > 16 B)",
            "not selective: would peak at 19 B > budget 17 B",
        ]
    );
    // Masks that keep nothing and save nothing tie with full, which comes first.
    let plan = chain((0, 1.0)).plan_within(Budget::Bytes(17)).unwrap();
    assert_eq!(plan.policies(), [Policy::RECOMPUTE_ALL]);
    assert_eq!(
        ruled_out(&plan)[0],
        "not masks: ties with full (peak 16 B, extra time 1.000 s); ties go to full, masks, narrowing, selective in that order"
    );
}

/// No choice, nothing ruled out: a plan for one policy, and a plan evaluated as given.
#[test]
fn explain_rules_out_nothing_without_a_choice() {
    let costs = chain((1, 0.5));
    let fixed = costs
        .plan_with(&Objective::Budget(Budget::Bytes(17)), &[Policy::masks()])
        .unwrap();
    assert_eq!(fixed.policies(), [Policy::masks()]);
    assert!(ruled_out(&fixed).is_empty(), "{}", fixed.explain());
    let given = costs
        .evaluate_with_policies(&[1], &[Policy::selective()])
        .unwrap();
    assert!(ruled_out(&given).is_empty(), "{}", given.explain());
    // Two allowed: only the other one is accounted for.
    let two = costs
        .plan_with(
            &Objective::Budget(Budget::Bytes(17)),
            &[Policy::RECOMPUTE_ALL, Policy::selective()],
        )
        .unwrap();
    assert_eq!(two.policies(), [Policy::RECOMPUTE_ALL]);
    assert_eq!(
        ruled_out(&two),
        ["not selective: would peak at 19 B > budget 17 B"]
    );
}

/// A narrowing figure between masks' and selective's: chosen where it fits, named where
/// the profile has it, left out of the account where it has none (the tests above).
#[test]
fn explain_names_narrowing_where_the_profile_has_it() {
    let mut costs = chain((1, 0.5));
    for s in &mut costs.stages {
        s.narrowing = Some(KeepCost {
            kept_bytes: 2,
            recompute_seconds: 0.375,
        });
    }
    // Within 18 B: full 16 B in 1 s, masks 17 B in 0.5 s, narrowing 18 B in 0.375 s,
    // selective 19 B.
    let plan = costs.plan_within(Budget::Bytes(18)).unwrap();
    assert_eq!(plan.policies(), [Policy::narrowing()]);
    assert_eq!(plan.predicted_peak_bytes(), 18);
    let text = plan.explain();
    assert!(
        text.contains("checkpointed, policy narrowing\n     full keeps 0 B, recompute 1.000 s (saves 0 s);  masks keeps 1 B, recompute 500.000 ms (saves 500.000 ms); *narrowing keeps 2 B, recompute 375.000 ms (saves 625.000 ms);  selective keeps 3 B"),
        "{text}"
    );
    assert_eq!(
        ruled_out(&plan),
        [
            "not full: saves less time (625.000 ms more: extra time 1.000 s against 375.000 ms)",
            "not masks: saves less time (125.000 ms more: extra time 500.000 ms against 375.000 ms)",
            "not selective: would peak at 19 B > budget 18 B",
        ]
    );
    // The least peak: full again, and each other policy's peak said.
    let plan = costs.plan_min_peak().unwrap();
    assert_eq!(
        ruled_out(&plan),
        [
            "not masks: would peak at 17 B > 16 B, the least peak",
            "not narrowing: would peak at 18 B > 16 B, the least peak",
            "not selective: would peak at 19 B > 16 B, the least peak",
        ]
    );
}

/// A stage without a narrowing linear (masks and selective keep the same: no linear at
/// all) keeps and costs under `narrowing` what it does under `masks`, which is what the
/// runtime keeps there; `explain` does not offer `narrowing` for a segment of such
/// stages alone.
#[test]
fn narrowing_costs_a_stage_without_a_narrowing_linear_as_masks() {
    let figure = |kept_bytes, recompute_seconds| {
        Some(KeepCost {
            kept_bytes,
            recompute_seconds,
        })
    };
    let mut dropout_only = StageCost::new(4, 8, 1.0);
    dropout_only.masks = figure(1, 0.5);
    dropout_only.selective = figure(1, 0.5);
    let mut block = StageCost::new(4, 8, 1.0);
    block.masks = figure(1, 0.5);
    block.narrowing = figure(2, 0.25);
    block.selective = figure(3, 0.125);
    assert_eq!(dropout_only.keep(Policy::narrowing()), Some((1, 0.5)));
    assert_eq!(block.keep(Policy::narrowing()), Some((2, 0.25)));
    let costs = ChainCost {
        stages: vec![dropout_only, block, StageCost::new(4, 8, 1.0)],
        output_bytes: 4,
        checkpoint_bytes: 0,
    };
    let both = costs
        .evaluate_with_policies(&[2], &[Policy::narrowing()])
        .unwrap();
    assert_eq!(both.segment_keep(0, Policy::narrowing()), Some((3, 0.75)));
    assert_eq!(both.predicted_extra_seconds(), 0.75);
    assert!(
        both.explain().contains("*narrowing keeps 3 B"),
        "{}",
        both.explain()
    );
    let alone = costs
        .evaluate_with_policies(&[1], &[Policy::masks()])
        .unwrap();
    let text = alone.explain();
    assert!(text.contains("*masks keeps 1 B"), "{text}");
    assert!(!text.contains("narrowing keeps"), "{text}");
    // A policy equal to selective (save_linear implies the narrowing outputs) plans as
    // selective.
    let same = Policy::selective().save_narrowing_linear(true);
    let plan = costs.plan_with(&Objective::MinPeak, &[same]).unwrap();
    assert!(plan.policies().iter().all(|&p| p == Policy::selective()));
}
