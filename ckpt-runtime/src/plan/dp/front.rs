//! The planner with a choice per segment: checkpointed with one of the allowed policies,
//! or kept (run once with grad, activations held), under the stages' [`Keeping`]
//! constraints. The least peak by the recursion `G` from the right; the least time within
//! a budget by Pareto fronts of partial plans from the left (see the
//! [planner's docs](super::super) for the model and the proofs).

use super::{INF, Tables, within};
use crate::plan::{ChainCost, Keeping, SegmentMode};
use crate::{CkptError, Policy};

/// One partial plan of the prefix `0..at` in the budget program: the bytes `A` it holds
/// from here on (the checkpointed segments' inputs, RNG copies and policies' kept bytes,
/// the kept segments' activations, and `x_at` itself), its recompute seconds, the largest
/// of its phases' peaks, and how it was made.
#[derive(Debug, Clone, Copy)]
struct Label {
    stash: u64,
    seconds: f64,
    peak: u64,
    /// The label of the prefix before the last segment, and that segment's mode (`None`
    /// for the empty prefix).
    from: Option<(usize, SegmentMode)>,
    at: usize,
}

impl Label {
    fn dominates(&self, other: &Label) -> bool {
        self.stash <= other.stash && self.seconds <= other.seconds && self.peak <= other.peak
    }
}

/// The cuts and the mode of each segment but the last, for the least extra time within
/// `budget` bytes, or (`None`) for the least peak; ties broken by the other objective,
/// then checkpointed before kept and by the order of `allowed` (some of
/// [`PLANNED_POLICIES`](crate::plan::PLANNED_POLICIES), at least one). A segment is
/// checkpointed only when it holds no stage that `keeping` forces kept, kept only when
/// all its stages may be. The profile must be checked.
pub(in crate::plan) fn plan_with_modes(
    costs: &ChainCost,
    budget: Option<u64>,
    allowed: &[Policy],
    keeping: &Keeping,
) -> Result<(Vec<usize>, Vec<SegmentMode>), CkptError> {
    let len = costs.len();
    if len == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let t = Tables::new(costs);
    let st = &costs.stages;
    let keep = |i: usize, p: Policy| st[i].keep(p).unwrap_or((0, st[i].forward_seconds));
    // The input of the segment that starts at `b` after a checkpointed one (after a kept
    // one it is in the kept bytes).
    let held = |b: usize| t.input[b];
    // The least peak, `G(a)` relative to what the segments before `a` hold, `x_a`
    // included: plain `W(a)`; checkpointed `a..b` with policy `P`
    // `o + κ(a, b, P) + max(in_b + U(a, b), in_b + G(b))`; kept `max(V(a, b), K(a, b) + G(b))`.
    let mut g = vec![INF; len + 1];
    for a in (0..len).rev() {
        let mut best = t.w[a];
        let mut kept = vec![0u64; allowed.len()];
        let (mut ckpt_ok, mut keep_ok) = (true, true);
        t.for_each_run(a, |b, seg, v| {
            ckpt_ok &= !keeping.must(b - 1);
            keep_ok &= keeping.may(b - 1);
            for (q, &p) in allowed.iter().enumerate() {
                kept[q] += keep(b - 1, p).0;
                if ckpt_ok && g[b] != INF {
                    let c = t.checkpoint_bytes + kept[q] + seg.max(held(b) + g[b]);
                    best = best.min(c);
                }
            }
            if keep_ok && g[b] != INF {
                best = best.min(v.max(t.kept[b] - t.kept[a] + g[b]));
            }
        });
        g[a] = best;
    }
    let budget = within(budget, g[0])?;
    // Least time within the budget: the Pareto front of (held bytes, seconds, peak so
    // far) per boundary. Whether a prefix can be completed within the budget, and what
    // the completion adds to time and peak, depend on the prefix only through its held
    // bytes; time adds and peaks take maxima, so a prefix no better in all three than
    // another at the same boundary is never needed (dominance), and the fronts hold
    // every optimum.
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
            let peak = label.peak.max(label.stash + t.w[a]);
            if peak <= budget {
                let better = best
                    .is_none_or(|(s, p, _)| label.seconds < s || (label.seconds == s && peak < p));
                if better {
                    best = Some((label.seconds, peak, l));
                }
            }
            if label.stash > budget {
                continue;
            }
            let base = label.stash + t.checkpoint_bytes;
            let mut kept = vec![0u64; allowed.len()];
            let mut seconds = vec![label.seconds; allowed.len()];
            let (mut ckpt_ok, mut keep_ok) = (true, true);
            let mut made = Vec::new();
            t.for_each_run(a, |b, seg, v| {
                ckpt_ok &= !keeping.must(b - 1);
                keep_ok &= keeping.may(b - 1);
                for (q, &p) in allowed.iter().enumerate() {
                    let (k, s) = keep(b - 1, p);
                    kept[q] += k;
                    seconds[q] += s;
                    let stash = base + kept[q];
                    let phase = stash + seg;
                    // A policy that keeps nothing more and saves no time than an earlier
                    // one in the list is the same plan; skip it.
                    let same = (0..q).any(|r| kept[r] == kept[q] && seconds[r] == seconds[q]);
                    if ckpt_ok && phase <= budget && !same {
                        made.push(Label {
                            stash: stash + held(b),
                            seconds: seconds[q],
                            peak: label.peak.max(phase),
                            from: Some((l, SegmentMode::Checkpointed(p))),
                            at: b,
                        });
                    }
                }
                let phase = label.stash + v;
                if keep_ok && phase <= budget {
                    made.push(Label {
                        stash: label.stash + (t.kept[b] - t.kept[a]),
                        seconds: label.seconds,
                        peak: label.peak.max(phase),
                        from: Some((l, SegmentMode::Kept)),
                        at: b,
                    });
                }
            });
            for label in made {
                pending[label.at].push(labels.len());
                labels.push(label);
            }
        }
        pending[a] = front;
    }
    let (_, _, mut l) = best.expect("G(0) <= budget, so some plan fits");
    let mut cuts = Vec::new();
    let mut modes = Vec::new();
    while let Some((prev, mode)) = labels[l].from {
        cuts.push(labels[l].at);
        modes.push(mode);
        l = prev;
    }
    cuts.reverse();
    modes.reverse();
    // The loop above records the start of each segment after the first: the last entry
    // is the plain segment's start, every entry a cut.
    Ok((cuts, modes))
}
