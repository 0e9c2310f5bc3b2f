//! The cost model's evaluation of a plan, phase by phase, and the dynamic programs that
//! choose the cuts and, per checkpointed segment, the policy (see the [parent module](super)
//! for the model and the proofs).

use super::{ChainCost, Phase};
use crate::{CkptError, Policy};

/// The predicted peak of `cuts` with `policies` (one per checkpointed segment), the phase
/// where it occurs and the predicted extra seconds, straight from the definition of the
/// cost model (no shared code with the programs below, so that the property tests
/// compare two independent computations). `cuts` and `policies` must be valid (every
/// policy one that [`StageCost::keep`](super::StageCost::keep) models) and the profile
/// checked.
pub(super) fn evaluate(
    costs: &ChainCost,
    cuts: &[usize],
    policies: &[Policy],
) -> (u64, Phase, f64) {
    let st = &costs.stages;
    let len = st.len();
    let input = |i: usize| {
        if i == len {
            costs.output_bytes
        } else {
            st[i].input_bytes
        }
    };
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(len);
    let k = bounds.len() - 1;
    let mut stashes = 0u64;
    let mut seconds = 0.0;
    let mut values = Vec::with_capacity(k);
    for j in 0..k {
        let (a, b) = (bounds[j], bounds[j + 1]);
        let plain = j == k - 1;
        if a > 0 {
            stashes += input(a);
        }
        if !plain {
            stashes += costs.checkpoint_bytes;
            // What the policy keeps lives from the segment's forward until its
            // recompute and backward are done, as a stash does; its recompute costs
            // the stages' forward times less what the policy replays.
            for s in &st[a..b] {
                let (kept, recompute) = s.keep(policies[j]).unwrap_or((0, s.forward_seconds));
                stashes += kept;
                seconds += recompute;
            }
        }
        // The segment's own term: each stage's worst moment on top of the kept bytes of
        // the stages before it, plus the held output gradient of a checkpointed segment.
        let mut term = 0u64;
        let mut kept = 0u64;
        for (i, s) in st.iter().enumerate().take(b).skip(a) {
            kept += s.kept_bytes;
            let worst = if !plain && i == b - 1 {
                s.forward_extra_bytes.max(s.backward_extra_bytes)
            } else {
                s.forward_extra_bytes
                    .max(input(i + 1) + s.backward_extra_bytes)
            };
            term = term.max(kept + worst);
        }
        if !plain {
            term += input(b);
        }
        values.push(stashes + term);
    }
    // The phases in time order: the plain segment, then the recomputes from the last
    // checkpointed segment down; ties go to the earliest.
    let mut peak = values[k - 1];
    let mut phase = Phase::Plain;
    for j in (0..k - 1).rev() {
        if values[j] > peak {
            peak = values[j];
            phase = Phase::Recompute { segment: j };
        }
    }
    (peak, phase, seconds)
}

/// Marks a suffix or prefix that has no valid plan.
const INF: u64 = u64::MAX;

/// The per-stage figures the programs use, as prefix sums and maxima.
struct Tables {
    len: usize,
    /// `kept[i]` = kept bytes of stages `0..i` (length `len + 1`).
    kept: Vec<u64>,
    /// `input[i]` = `in_i`, with `input[len]` the output bytes (length `len + 1`).
    input: Vec<u64>,
    /// `e[i] = max(f_i, in_{i+1} + t_i)`.
    e: Vec<u64>,
    /// `ê[i] = max(f_i, t_i)`.
    e_hat: Vec<u64>,
    /// `w[a]` = `W(a)`, the plain segment `a..len`'s term (length `len`).
    w: Vec<u64>,
    checkpoint_bytes: u64,
}

impl Tables {
    fn new(costs: &ChainCost) -> Self {
        let st = &costs.stages;
        let len = st.len();
        let mut kept = Vec::with_capacity(len + 1);
        kept.push(0);
        for s in st {
            kept.push(kept.last().copied().unwrap_or(0) + s.kept_bytes);
        }
        let mut input: Vec<u64> = st.iter().map(|s| s.input_bytes).collect();
        input.push(costs.output_bytes);
        let e: Vec<u64> = (0..len)
            .map(|i| {
                st[i]
                    .forward_extra_bytes
                    .max(input[i + 1] + st[i].backward_extra_bytes)
            })
            .collect();
        let e_hat = st
            .iter()
            .map(|s| s.forward_extra_bytes.max(s.backward_extra_bytes))
            .collect();
        // W(a) = max_{a <= i < len} (kept[i+1] + e_i) - kept[a], by a suffix maximum.
        let mut w = vec![0; len];
        let mut m = 0;
        for a in (0..len).rev() {
            m = m.max(kept[a + 1] + e[a]);
            w[a] = m - kept[a];
        }
        Tables {
            len,
            kept,
            input,
            e,
            e_hat,
            w,
            checkpoint_bytes: costs.checkpoint_bytes,
        }
    }

    /// The stash of a plain segment starting at `a` (`x_0` is in the baseline).
    fn stash_plain(&self, a: usize) -> u64 {
        if a == 0 { 0 } else { self.input[a] }
    }

    /// The stash of a checkpointed segment starting at `a`, with the RNG state copy.
    fn stash_ckpt(&self, a: usize) -> u64 {
        self.stash_plain(a) + self.checkpoint_bytes
    }

    /// Calls `f(b, in_b + U(a, b))` for every checkpointed segment `a..b` (`a < b < len`),
    /// in increasing `b`, keeping `U` up to date in O(1) per step.
    fn for_each_segment(&self, a: usize, mut f: impl FnMut(usize, u64)) {
        // `m` = max_{a <= i < b-1} (kept[i+1] + e_i), absolute; `kept[a]` is neutral since
        // every candidate is at least `kept[a]`.
        let mut m = self.kept[a];
        for b in a + 1..self.len {
            let last = self.kept[b] + self.e_hat[b - 1];
            f(b, self.input[b] + m.max(last) - self.kept[a]);
            m = m.max(self.kept[b] + self.e[b - 1]);
        }
    }

    /// `G` restricted to plans whose plain segment starts where `plain_ok` says: the least
    /// peak of each suffix (`INF` if none) and the first segment's end that achieves it
    /// (`len` for "the rest is plain").
    fn least_peak(&self, plain_ok: impl Fn(usize) -> bool) -> (Vec<u64>, Vec<usize>) {
        let len = self.len;
        let mut g = vec![INF; len + 1];
        let mut next = vec![len; len];
        for a in (0..len).rev() {
            let mut best = INF;
            let mut choice = len;
            if plain_ok(a) {
                best = self.stash_plain(a) + self.w[a];
            }
            let stash = self.stash_ckpt(a);
            self.for_each_segment(a, |b, seg| {
                if g[b] != INF {
                    let c = stash + seg.max(g[b]);
                    if c < best {
                        best = c;
                        choice = b;
                    }
                }
            });
            g[a] = best;
            next[a] = choice;
        }
        (g, next)
    }

    /// `E`: for each boundary `b < len`, the least stash sum of a cut set of `0..b` whose
    /// phases all fit in `budget` (`INF` if none).
    fn least_stash(&self, budget: u64) -> Vec<u64> {
        let mut e = vec![INF; self.len];
        if self.len == 0 {
            return e;
        }
        e[0] = 0;
        for a in 0..self.len {
            if e[a] == INF {
                continue;
            }
            let base = e[a] + self.stash_ckpt(a);
            if base > budget {
                continue;
            }
            self.for_each_segment(a, |b, seg| {
                if base + seg <= budget && base < e[b] {
                    e[b] = base;
                }
            });
        }
        e
    }
}

/// The cuts for the least extra time within `budget` bytes, or (`None`) for the least
/// peak; ties broken by the other objective. The profile must be checked.
pub(super) fn plan(costs: &ChainCost, budget: Option<u64>) -> Result<Vec<usize>, CkptError> {
    let len = costs.len();
    if len == 0 {
        return Ok(Vec::new());
    }
    let t = Tables::new(costs);
    let (g, _) = t.least_peak(|_| true);
    let least = g[0];
    let budget = match budget {
        None => least,
        Some(b) if b < least => {
            return Err(CkptError::BudgetTooSmall {
                budget_bytes: b,
                min_bytes: least,
            });
        }
        Some(b) => b,
    };
    let e = t.least_stash(budget);
    let time = costs.time_prefix();
    let fastest = (0..len)
        .filter(|&p| e[p] != INF && e[p] + t.stash_plain(p) + t.w[p] <= budget)
        .map(|p| time[p])
        .fold(f64::INFINITY, f64::min);
    debug_assert!(fastest.is_finite(), "G(0) <= budget, so some plan fits");
    let (g, next) = t.least_peak(|p| time[p] == fastest);
    debug_assert!(g[0] <= budget);
    let mut cuts = Vec::new();
    let mut a = 0;
    while next[a] != len {
        a = next[a];
        cuts.push(a);
    }
    Ok(cuts)
}

/// Whether any stage has a figure for a selective policy, so that the planner has a
/// choice of policy to make.
pub(super) fn has_policies(costs: &ChainCost) -> bool {
    costs
        .stages
        .iter()
        .any(|s| s.masks.is_some() || s.selective.is_some())
}

/// One partial plan of the prefix `0..at` in the budget program with policies: the stash
/// sum `A` its checkpointed segments hold (their inputs, RNG copies and kept bytes), its
/// recompute seconds, the largest of its phases' peaks, and how it was made.
#[derive(Debug, Clone, Copy)]
struct Label {
    stash: u64,
    seconds: f64,
    peak: u64,
    /// The label of the prefix before the last segment, and that segment's policy
    /// (`None` for the empty prefix).
    from: Option<(usize, Policy)>,
    at: usize,
}

impl Label {
    fn dominates(&self, other: &Label) -> bool {
        self.stash <= other.stash && self.seconds <= other.seconds && self.peak <= other.peak
    }
}

/// The planner with a choice of policy per checkpointed segment among `allowed` (some of
/// [`PLANNED_POLICIES`], at least one): the cuts and policies for the least extra time
/// within `budget` bytes, or (`None`) for the least peak; ties broken by the other
/// objective, then by the order of `allowed`. The profile must be checked.
pub(super) fn plan_with_policies(
    costs: &ChainCost,
    budget: Option<u64>,
    allowed: &[Policy],
) -> Result<(Vec<usize>, Vec<Policy>), CkptError> {
    let len = costs.len();
    if len == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let t = Tables::new(costs);
    let st = &costs.stages;
    let keep = |i: usize, p: Policy| st[i].keep(p).unwrap_or((0, st[i].forward_seconds));
    // The least peak, G with a policy per segment: a checkpointed first segment a..b
    // with policy P holds σ_ckpt(a) + κ(a, b, P) in every phase from its forward on.
    let mut g = vec![INF; len + 1];
    for a in (0..len).rev() {
        let mut best = t.stash_plain(a) + t.w[a];
        let stash = t.stash_ckpt(a);
        let mut kept = vec![0u64; allowed.len()];
        t.for_each_segment(a, |b, seg| {
            for (q, &p) in allowed.iter().enumerate() {
                kept[q] += keep(b - 1, p).0;
                if g[b] != INF {
                    best = best.min(stash + kept[q] + seg.max(g[b]));
                }
            }
        });
        g[a] = best;
    }
    let least = g[0];
    let budget = match budget {
        None => least,
        Some(b) if b < least => {
            return Err(CkptError::BudgetTooSmall {
                budget_bytes: b,
                min_bytes: least,
            });
        }
        Some(b) => b,
    };
    // Least time within the budget: the Pareto front of (stash sum, seconds, peak so far)
    // per boundary. Whether a prefix can be completed within the budget, and what the
    // completion adds to time and peak, depend on the prefix only through its stash sum;
    // time adds and peaks take maxima, so a prefix no better in all three than another
    // at the same boundary is never needed (dominance), and the fronts hold every
    // optimum.
    let mut labels: Vec<Label> = vec![Label {
        stash: 0,
        seconds: 0.0,
        peak: 0,
        from: None,
        at: 0,
    }];
    let mut pending: Vec<Vec<usize>> = vec![Vec::new(); len];
    pending[0].push(0);
    // The best complete plan: (seconds, peak, label at the plain segment's start).
    let mut best: Option<(f64, u64, usize)> = None;
    for a in 0..len {
        let mut front: Vec<usize> = Vec::new();
        for &l in &pending[a] {
            let cand = labels[l];
            if front.iter().any(|&f| labels[f].dominates(&cand)) {
                continue;
            }
            front.retain(|&f| !cand.dominates(&labels[f]));
            front.push(l);
        }
        for &l in &front {
            let label = labels[l];
            let peak = label.peak.max(label.stash + t.stash_plain(a) + t.w[a]);
            if peak <= budget {
                let better = best
                    .is_none_or(|(s, p, _)| label.seconds < s || (label.seconds == s && peak < p));
                if better {
                    best = Some((label.seconds, peak, l));
                }
            }
            let base = label.stash + t.stash_ckpt(a);
            if base > budget {
                continue;
            }
            let mut kept = vec![0u64; allowed.len()];
            let mut seconds = vec![label.seconds; allowed.len()];
            let mut made = Vec::new();
            t.for_each_segment(a, |b, seg| {
                for (q, &p) in allowed.iter().enumerate() {
                    let (k, s) = keep(b - 1, p);
                    kept[q] += k;
                    seconds[q] += s;
                    let stash = base + kept[q];
                    let phase = stash + seg;
                    // A policy that keeps nothing more and saves no time than an earlier
                    // one in the list is the same plan; skip it.
                    let same = (0..q).any(|r| kept[r] == kept[q] && seconds[r] == seconds[q]);
                    if phase <= budget && !same {
                        made.push((
                            b,
                            Label {
                                stash,
                                seconds: seconds[q],
                                peak: label.peak.max(phase),
                                from: Some((l, p)),
                                at: b,
                            },
                        ));
                    }
                }
            });
            for (b, label) in made {
                pending[b].push(labels.len());
                labels.push(label);
            }
        }
        pending[a] = front;
    }
    let (_, _, mut l) = best.expect("G(0) <= budget, so some plan fits");
    let mut cuts = Vec::new();
    let mut policies = Vec::new();
    while let Some((prev, p)) = labels[l].from {
        cuts.push(labels[l].at);
        policies.push(p);
        l = prev;
    }
    cuts.reverse();
    policies.reverse();
    // The loop above records the start of each segment after the first: the last entry
    // is the plain segment's start, every entry a cut.
    Ok((cuts, policies))
}

#[cfg(test)]
mod tests {
    use super::super::{Budget, ChainCost, KeepCost, Objective, PLANNED_POLICIES, StageCost};
    use super::*;
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
    fn chain_of(
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
                Err(CkptError::BudgetTooSmall { budget_bytes, min_bytes }) => {
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
    fn quarters(max: u32) -> impl Strategy<Value = f64> {
        (0..=max * 4).prop_map(|q| f64::from(q) / 4.0)
    }

    fn keep_cost() -> impl Strategy<Value = Option<KeepCost>> {
        prop::option::weighted(
            0.8,
            (0u64..600, quarters(10)).prop_map(|(kept_bytes, recompute_seconds)| KeepCost {
                kept_bytes,
                recompute_seconds,
            }),
        )
    }

    fn policy_stage() -> impl Strategy<Value = StageCost> {
        (
            (0u64..1000, 0u64..1000, 0u64..300, 0u64..300),
            quarters(10),
            keep_cost(),
            keep_cost(),
        )
            .prop_map(|((i, k, f, b), s, masks, selective)| StageCost {
                input_bytes: i,
                kept_bytes: k,
                forward_extra_bytes: f,
                backward_extra_bytes: b,
                forward_seconds: s,
                masks,
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
            let least = all.iter().map(|p| p.0).min().unwrap();
            let plain = all[0].0;
            let budget = if sel < 100 {
                least.saturating_sub(sel)
            } else {
                least + (plain.max(least) - least) * (sel - 100) / 1000
            };
            let fits: Vec<_> = all.iter().filter(|p| p.0 <= budget).collect();
            match costs.plan(&Objective::Budget(Budget::Bytes(budget))) {
                Ok(plan) => {
                    let best_time = fits.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
                    let best_peak = fits.iter().filter(|p| p.1 == best_time).map(|p| p.0).min().unwrap();
                    prop_assert_eq!(plan.predicted_extra_seconds(), best_time);
                    prop_assert_eq!(plan.predicted_peak_bytes(), best_peak);
                    prop_assert!(plan.predicted_peak_bytes() <= budget);
                }
                Err(CkptError::BudgetTooSmall { budget_bytes, min_bytes }) => {
                    prop_assert!(fits.is_empty());
                    prop_assert_eq!(budget_bytes, budget);
                    prop_assert_eq!(min_bytes, least);
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
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
    fn residual_chain(len: usize) -> ChainCost {
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
                min_bytes: 18
            }
        );
        assert_eq!(
            err.to_string(),
            "memory budget of 17 B (17 B) is too small: the smallest feasible peak of this chain is 18 B (18 B)"
        );
        // 13.8 % of the plain 130 bytes is 17 bytes (rounded down).
        assert!(matches!(
            costs.plan_within(Budget::FractionOfPlain(0.138)),
            Err(CkptError::BudgetTooSmall {
                budget_bytes: 17,
                min_bytes: 18
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
}
