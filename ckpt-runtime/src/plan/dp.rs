//! The cost model's evaluation of a plan, phase by phase, and the dynamic programs that
//! choose the cuts and, per checkpointed segment, the policy (see the [parent module](super)
//! for the model and the proofs).

use super::{ChainCost, Phase, SegmentMode};
use crate::CkptError;

/// The predicted peak of `cuts` with `modes` (one per segment but the last: each
/// checkpointed with a policy or kept), the phase where it occurs and the predicted extra
/// seconds, straight from the definition of the cost model (no shared code with the
/// programs below, so that the property tests compare two independent computations).
/// `cuts` and `modes` must be valid (every policy one that
/// [`StageCost::keep`](super::StageCost::keep) models, no [`SegmentMode::Plain`]) and the
/// profile checked.
pub(super) fn evaluate(
    costs: &ChainCost,
    cuts: &[usize],
    modes: &[SegmentMode],
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
    let mode = |j: usize| {
        if j + 1 == k {
            SegmentMode::Plain
        } else {
            modes[j]
        }
    };
    let mut stashes = 0u64;
    let mut seconds = 0.0;
    let mut values = Vec::with_capacity(k);
    for j in 0..k {
        let (a, b) = (bounds[j], bounds[j + 1]);
        let checkpointed = mode(j).is_checkpointed();
        // The segment's input: in the baseline for the first, else held by the stash or
        // by the graph of the first stage, unless the segment before is kept, whose
        // kept bytes hold it already (its last stage's output).
        if a > 0 && mode(j - 1) != SegmentMode::Kept {
            stashes += input(a);
        }
        if let SegmentMode::Checkpointed(policy) = mode(j) {
            stashes += costs.checkpoint_bytes;
            // What the policy keeps lives from the segment's forward until its
            // recompute and backward are done, as a stash does; its recompute costs
            // the stages' forward times less what the policy replays.
            for s in &st[a..b] {
                let (kept, recompute) = s.keep(policy).unwrap_or((0, s.forward_seconds));
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
            let worst = if checkpointed && i == b - 1 {
                s.forward_extra_bytes.max(s.backward_extra_bytes)
            } else {
                s.forward_extra_bytes
                    .max(input(i + 1) + s.backward_extra_bytes)
            };
            term = term.max(kept + worst);
        }
        if checkpointed {
            term += input(b);
        }
        values.push(stashes + term);
        // A kept segment's activations are held by every later phase.
        if mode(j) == SegmentMode::Kept {
            stashes += kept;
        }
    }
    // The phases in time order: the plain segment, then the backward of the segments
    // before it from the last down (a checkpointed one's recompute); ties go to the
    // earliest.
    let mut peak = values[k - 1];
    let mut phase = Phase::Plain;
    for j in (0..k - 1).rev() {
        if values[j] > peak {
            peak = values[j];
            phase = if mode(j) == SegmentMode::Kept {
                Phase::Kept { segment: j }
            } else {
                Phase::Recompute { segment: j }
            };
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
        self.for_each_run(a, |b, seg, _| f(b, seg));
    }

    /// Calls `f(b, in_b + U(a, b), V(a, b))` for every segment `a..b` (`a < b < len`) in
    /// increasing `b`: the term of `a..b` checkpointed and, with
    /// `V(a, b) = max_{a <= i < b} [K(a, i+1) + e_i]`, its term kept; O(1) per step.
    fn for_each_run(&self, a: usize, mut f: impl FnMut(usize, u64, u64)) {
        // `m` = max_{a <= i < b-1} (kept[i+1] + e_i), absolute; `kept[a]` is neutral since
        // every candidate is at least `kept[a]`.
        let mut m = self.kept[a];
        for b in a + 1..self.len {
            let last = self.kept[b] + self.e_hat[b - 1];
            let v = m.max(self.kept[b] + self.e[b - 1]);
            f(
                b,
                self.input[b] + m.max(last) - self.kept[a],
                v - self.kept[a],
            );
            m = v;
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
    let budget = within(budget, least)?;
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
        .any(|s| s.masks.is_some() || s.narrowing.is_some() || s.selective.is_some())
}

pub(super) use front::plan_with_modes;

/// The budget to plan for: `budget`, or the least feasible peak `least` when none is
/// given; [`CkptError::BudgetTooSmall`] when `budget` is under `least`.
pub(super) fn within(budget: Option<u64>, least: u64) -> Result<u64, CkptError> {
    match budget {
        Some(b) if b < least => Err(CkptError::BudgetTooSmall {
            budget_bytes: b,
            min_bytes: least,
            // Filled in by `ChainCost::plan_keeping`, which knows them.
            plain_bytes: 0,
            marked_keep: false,
        }),
        Some(b) => Ok(b),
        None => Ok(least),
    }
}

mod front;
#[cfg(test)]
mod keep_tests;
#[cfg(test)]
mod tests;
