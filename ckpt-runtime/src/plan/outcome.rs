//! The planner's answer: a [`Plan`] (cuts, each checkpointed segment's policy, the
//! predicted peak and extra time, the phase of the peak), and how it shows itself
//! (`Display`, [`Plan::explain`]).

use std::fmt;
use std::ops::Range;

use super::{ChainCost, MASKS, NARROWING, PLANNED_POLICIES, SegmentMode, StageCost, dp};
use crate::Policy;

/// The phase of a plan in which its predicted peak occurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The forward and backward of the last, plain segment.
    Plain,
    /// The recompute and backward of checkpointed segment `segment` (0-based; shown
    /// 1-based, as segment names are: "segment 1 of 3").
    Recompute {
        /// Index of the segment.
        segment: usize,
    },
    /// The forward or backward of kept segment `segment` (0-based, shown 1-based).
    Kept {
        /// Index of the segment.
        segment: usize,
    },
}

/// Where to cut a chain, with what the [cost model](super) predicts for it; made by
/// [`ChainCost::plan`](super::ChainCost::plan) or [`ChainCost::evaluate`](super::ChainCost::evaluate), run by [`checkpoint_sequential_plan`](super::checkpoint_sequential_plan).
/// `Display` (and [`Plan::explain`]) prints the cuts, the predicted peak and extra time,
/// and the measured peak once attached with [`Plan::set_measured_peak_bytes`].
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub(super) len: usize,
    pub(super) cuts: Vec<usize>,
    /// The policy of each checkpointed segment.
    pub(super) policies: Vec<Policy>,
    /// The mode of each segment but the last (one per cut).
    pub(super) modes: Vec<SegmentMode>,
    pub(super) predicted_peak_bytes: u64,
    pub(super) predicted_extra_seconds: f64,
    pub(super) recomputed_stages: usize,
    pub(super) peak_phase: Phase,
    pub(super) plain_peak_bytes: u64,
    pub(super) budget_bytes: Option<u64>,
    pub(super) measured_peak_bytes: Option<u64>,
    /// The profile the plan was made from, one entry per stage.
    pub(super) stage_costs: Vec<StageCost>,
    /// The stages' names, when the caller knows them ([`Plan::with_stage_names`]).
    pub(super) stage_names: Vec<String>,
    /// The policies the planner chose each checkpointed segment's policy from (empty for a
    /// plan made by [`ChainCost::evaluate`], the one policy of a plan made for it).
    pub(super) allowed: Vec<Policy>,
    /// Per stage: marked keep (`#[keep]`, `#[ckpt::keep]`), so kept in every plan (empty
    /// when none is).
    pub(super) marked: Vec<bool>,
    /// The chain's [`ChainCost::output_bytes`] and [`ChainCost::checkpoint_bytes`], so
    /// that [`Plan::explain`] can evaluate the plan with another policy.
    pub(super) chain_bytes: (u64, u64),
}

impl Plan {
    /// Number of stages of the chain.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the chain has no stage.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stage indices where a new segment starts (strictly increasing, in `1..len`).
    pub fn cuts(&self) -> &[usize] {
        &self.cuts
    }

    /// The policy of each segment but the last (`policies()[j]` for segment `j`, one per
    /// cut; [`Policy::RECOMPUTE_ALL`] for a kept one, see [`Plan::mode`]):
    /// [`Policy::RECOMPUTE_ALL`] unless the planner chose to keep dropout masks or
    /// linear outputs (see [`ChainCost::plan`](super::ChainCost::plan)).
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// How each segment but the last runs (`modes()[j]` for segment `j`, one per cut;
    /// see [`Plan::mode`]).
    pub fn modes(&self) -> &[SegmentMode] {
        &self.modes
    }

    /// How segment `segment` runs: checkpointed with its policy, kept (run once, its
    /// activations held; [`ChainCost::plan_keeping`](super::ChainCost::plan_keeping)), or
    /// [`SegmentMode::Plain`] for the last one (and past the end).
    pub fn mode(&self, segment: usize) -> SegmentMode {
        self.modes
            .get(segment)
            .copied()
            .unwrap_or(SegmentMode::Plain)
    }

    /// The policy segment `segment` runs with: its planned one, or
    /// [`Policy::RECOMPUTE_ALL`] for a kept segment and the last, plain one (which keep
    /// everything).
    pub fn policy_of(&self, segment: usize) -> Policy {
        self.policies
            .get(segment)
            .copied()
            .unwrap_or(Policy::RECOMPUTE_ALL)
    }

    /// Number of segments (`cuts().len() + 1`); all but the last are checkpointed or
    /// kept ([`Plan::mode`]).
    pub fn segments(&self) -> usize {
        self.cuts.len() + 1
    }

    /// The segments as stage ranges; the last one runs plainly.
    pub fn ranges(&self) -> Vec<Range<usize>> {
        ckpt_budget::cut_ranges(&self.cuts, self.len)
    }

    /// The predicted peak, in bytes above the baseline (see the [module docs](super)).
    pub fn predicted_peak_bytes(&self) -> u64 {
        self.predicted_peak_bytes
    }

    /// The predicted extra time of a training step, in seconds: the recompute of every
    /// stage of a checkpointed segment.
    pub fn predicted_extra_seconds(&self) -> f64 {
        self.predicted_extra_seconds
    }

    /// Number of stages recomputed in backward (those of the checkpointed segments).
    pub fn recomputed_stages(&self) -> usize {
        self.recomputed_stages
    }

    /// The phase in which the predicted peak occurs.
    pub fn peak_phase(&self) -> Phase {
        self.peak_phase
    }

    /// The predicted peak of the same chain without checkpointing, in bytes.
    pub fn plain_peak_bytes(&self) -> u64 {
        self.plain_peak_bytes
    }

    /// The budget the plan was made for, in bytes (`None` for [`Objective::MinPeak`](super::Objective::MinPeak) and
    /// for [`ChainCost::evaluate`](super::ChainCost::evaluate)).
    pub fn budget_bytes(&self) -> Option<u64> {
        self.budget_bytes
    }

    /// The measured peak attached with [`Plan::set_measured_peak_bytes`], in bytes.
    pub fn measured_peak_bytes(&self) -> Option<u64> {
        self.measured_peak_bytes
    }

    /// Attaches a measured peak (bytes above the baseline, e.g.
    /// `memory::measure(..).1.peak_above_baseline_bytes` around forward and backward), so
    /// that [`Plan::explain`] compares it with the prediction.
    pub fn set_measured_peak_bytes(&mut self, bytes: u64) {
        self.measured_peak_bytes = Some(bytes);
    }

    /// The profiled costs of the stages the plan was made from, in order.
    pub fn stage_costs(&self) -> &[StageCost] {
        &self.stage_costs
    }

    /// The stages' names (empty unless given with [`Plan::with_stage_names`]; the plans of
    /// `#[checkpointed]` functions and `model!`'s `plan_for` name theirs).
    pub fn stage_names(&self) -> &[String] {
        &self.stage_names
    }

    /// The plan with names for its stages (`names.len()` should be [`Plan::len`]; missing
    /// names print as the stage index), for [`Plan::explain`].
    pub fn with_stage_names(mut self, names: Vec<String>) -> Self {
        self.stage_names = names;
        self
    }

    /// The segment (0-based) that holds stage `i`.
    pub fn segment_of(&self, stage: usize) -> usize {
        self.cuts.iter().take_while(|&&c| c <= stage).count()
    }

    /// Whether stage `stage` is marked keep (`model!`'s `#[keep]`, `#[ckpt::keep]`), which
    /// the planner kept in every plan (in a kept segment or the plain last one).
    pub fn marked_keep(&self, stage: usize) -> bool {
        self.marked.get(stage).copied().unwrap_or(false)
    }

    /// The plan with the stages for which `marked` holds marked keep (a fixed schedule's
    /// plan, whose kept segments are the marked runs).
    pub(crate) fn with_marked(mut self, marked: impl Fn(usize) -> bool) -> Self {
        self.marked = (0..self.len).map(marked).collect();
        self
    }

    /// What checkpointed segment `segment` keeps (bytes) and what its recompute costs
    /// (seconds) under `policy`, from the profile (`None` for a policy the planner does
    /// not model, or a plan without its profile).
    pub fn segment_keep(&self, segment: usize, policy: Policy) -> Option<(u64, f64)> {
        let range = self.ranges().get(segment)?.clone();
        let stages = self.stage_costs.get(range)?;
        let mut out = (0u64, 0.0);
        for s in stages {
            let (k, t) = s.keep(policy)?;
            out.0 += k;
            out.1 += t;
        }
        Some(out)
    }

    /// A human-readable account of the plan: segments, cuts, predicted peak (and the phase
    /// where it occurs), plain-run peak, budget, predicted extra time, measured peak
    /// (`Display` prints these); then one line per checkpointed segment: its policy, and
    /// why — what each policy the planner chooses from would keep and cost to recompute
    /// there (bytes kept against time saved); then one line per stage: its name, the
    /// segment that holds it (checkpointed, so recomputed in backward, or the plain last
    /// one), its profiled input bytes (what a segment starting there stashes), kept bytes
    /// (what it keeps for backward, its output included), forward time, and under its
    /// segment's policy what is kept from forward (`policy kept`) and what its recompute
    /// costs (`recompute`; `-` in the plain segment).
    ///
    /// For a plan made with a choice of policies ([`ChainCost::plan`](super::ChainCost::plan),
    /// or [`ChainCost::plan_with`](super::ChainCost::plan_with) with more than one), each
    /// checkpointed segment's line is followed by one line for every other policy the
    /// planner could have chosen there, saying why it did not: the plan with that
    /// segment's policy swapped (the same cuts, the others' policies unchanged) "would
    /// peak at X > budget Y" (or, planned for the least peak, "> Y, the least peak"), or
    /// "saves less time (Z more)" with its predicted extra time, or, at the same time, it
    /// peaks higher, or it ties and the order full, masks, narrowing, selective decided.
    /// `narrowing` is left out of a segment without a narrowing linear (there it is
    /// `masks`).
    pub fn explain(&self) -> String {
        use std::fmt::Write;
        let mut out = self.to_string();
        if self.stage_costs.len() != self.len {
            return out;
        }
        let last = self.segments() - 1;
        let ranges = self.ranges();
        for (j, r) in ranges.iter().enumerate().take(last) {
            if self.mode(j) == SegmentMode::Kept {
                let stages = &self.stage_costs[r.clone()];
                let held: u64 = stages.iter().map(|s| s.kept_bytes).sum();
                // What checkpointing it would recompute at best, which the planner
                // weighed against keeping it: the least recompute among the allowed
                // policies, else (no policy figures) its forward time.
                let best = self
                    .allowed
                    .iter()
                    .filter_map(|&p| self.segment_keep(j, p).map(|(_, t)| (t, p)))
                    .min_by(|a, b| a.0.total_cmp(&b.0));
                let saved = match best {
                    Some((t, p)) if self.allowed.len() > 1 => {
                        format!(
                            "{} of recompute (under {}, its cheapest policy)",
                            human_seconds(t),
                            policy_name(p)
                        )
                    }
                    Some((t, _)) => format!("{} of recompute", human_seconds(t)),
                    None => format!(
                        "{} of recompute",
                        human_seconds(stages.iter().map(|s| s.forward_seconds).sum())
                    ),
                };
                let why = if r.clone().any(|i| self.marked_keep(i)) {
                    " (marked keep)"
                } else if !self.allowed.is_empty() {
                    " (the planner's choice)"
                } else {
                    ""
                };
                let _ = write!(
                    out,
                    "\n  segment {} (stages {}..{}): kept{why}: runs once, holds {}, saves {saved}",
                    j + 1,
                    r.start,
                    r.end,
                    human_bytes(held),
                );
                continue;
            }
            let chosen = self.policy_of(j);
            let _ = write!(
                out,
                "\n  segment {} (stages {}..{}): checkpointed, policy {}",
                j + 1,
                r.start,
                r.end,
                policy_name(chosen)
            );
            let full = self.segment_keep(j, Policy::RECOMPUTE_ALL);
            let options: Vec<String> = PLANNED_POLICIES
                .iter()
                .filter(|&&p| self.offers(j, p))
                .filter_map(|&p| {
                    let (k, t) = self.segment_keep(j, p)?;
                    let saved = full.map_or(0.0, |f| f.1 - t);
                    let mark = if p == chosen { "*" } else { " " };
                    // A replay the profile timed slower than the plain recompute is shown
                    // as what it costs, not as a saving of nothing.
                    let effect = if saved < 0.0 {
                        format!("costs {} more", human_seconds(-saved))
                    } else {
                        format!("saves {}", human_seconds(saved))
                    };
                    Some(format!(
                        "{mark}{} keeps {}, recompute {} ({effect})",
                        policy_name(p),
                        human_bytes(k),
                        human_seconds(t),
                    ))
                })
                .collect();
            if !options.is_empty() {
                let _ = write!(out, "\n    {}", options.join("; "));
            }
            for line in self.ruled_out(j) {
                let _ = write!(out, "\n    {line}");
            }
        }
        let width = self
            .stage_names
            .iter()
            .map(|n| n.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(5, 60);
        let _ = write!(
            out,
            "\n  {:>5}  {:<width$}  {:<26}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}",
            "stage", "name", "segment", "input", "kept", "forward", "policy kept", "recompute"
        );
        for (i, cost) in self.stage_costs.iter().enumerate() {
            let name = self.stage_names.get(i).map_or("", String::as_str);
            let segment = self.segment_of(i);
            let (held, policy_kept, recompute) =
                if segment == last || !self.mode(segment).is_checkpointed() {
                    let how = if segment == last { "plain" } else { "kept" };
                    let mark = if self.marked_keep(i) {
                        ", marked keep"
                    } else {
                        ""
                    };
                    (
                        format!("{} ({how}{mark})", segment + 1),
                        "-".to_string(),
                        "-".to_string(),
                    )
                } else {
                    let p = self.policy_of(segment);
                    let (k, t) = cost.keep(p).unwrap_or((0, cost.forward_seconds));
                    (
                        format!("{} (recomputed, {})", segment + 1, policy_name(p)),
                        human_bytes(k),
                        human_seconds(t),
                    )
                };
            let _ = write!(
                out,
                "\n  {i:>5}  {name:<width$}  {held:<26}  {:>11}  {:>11}  {:>11}  {policy_kept:>11}  {recompute:>11}",
                human_bytes(cost.input_bytes),
                human_bytes(cost.kept_bytes),
                human_seconds(cost.forward_seconds),
            );
        }
        out
    }
}

impl Plan {
    /// Whether explaining `segment` should name `policy`: every policy but `narrowing`
    /// where no stage of the segment has a narrowing linear (it would keep and cost what
    /// `masks` does there), unless it is the chosen one.
    fn offers(&self, segment: usize, policy: Policy) -> bool {
        policy != NARROWING
            || policy == self.policy_of(segment)
            || self.ranges().get(segment).is_some_and(|r| {
                self.stage_costs
                    .get(r.clone())
                    .is_some_and(|stages| stages.iter().any(|s| s.narrowing.is_some()))
            })
    }

    /// Why the planner did not give checkpointed segment `segment` each other policy it
    /// chose from: one line each, from the cost model's prediction for this plan with
    /// that segment's policy swapped (`dp::evaluate`, as the planner's own figures).
    fn ruled_out(&self, segment: usize) -> Vec<String> {
        let chosen = self.policy_of(segment);
        if self.allowed.len() < 2 || !self.modes.get(segment).is_some_and(|m| m.is_checkpointed()) {
            return Vec::new();
        }
        let chain = ChainCost {
            stages: self.stage_costs.clone(),
            output_bytes: self.chain_bytes.0,
            checkpoint_bytes: self.chain_bytes.1,
        };
        let (peak, extra) = (self.predicted_peak_bytes, self.predicted_extra_seconds);
        // Times are sums of measured seconds in different orders: equal within rounding.
        let same_time = |t: f64| (t - extra).abs() <= 1e-9 * extra.abs().max(t.abs());
        let mut out = Vec::new();
        for &p in self
            .allowed
            .iter()
            .filter(|&&p| p != chosen && self.offers(segment, p))
        {
            let mut modes = self.modes.clone();
            modes[segment] = SegmentMode::Checkpointed(p);
            let (p_peak, _, p_extra) = dp::evaluate(&chain, &self.cuts, &modes);
            let why = match self.budget_bytes {
                Some(b) if p_peak > b => format!(
                    "would peak at {} > budget {}",
                    human_bytes(p_peak),
                    human_bytes(b)
                ),
                None if p_peak > peak => format!(
                    "would peak at {} > {}, the least peak",
                    human_bytes(p_peak),
                    human_bytes(peak)
                ),
                _ if p_extra > extra && !same_time(p_extra) => format!(
                    "saves less time ({} more: extra time {} against {})",
                    human_seconds(p_extra - extra),
                    human_seconds(p_extra),
                    human_seconds(extra)
                ),
                _ if p_peak > peak => format!(
                    "as fast, but would peak higher ({} > {})",
                    human_bytes(p_peak),
                    human_bytes(peak)
                ),
                _ if same_time(p_extra) && p_peak == peak => format!(
                    "ties with {} (peak {}, extra time {}); ties go to full, masks, narrowing, selective in that order",
                    policy_name(chosen),
                    human_bytes(p_peak),
                    human_seconds(p_extra)
                ),
                _ => format!(
                    "not taken (peak {}, extra time {})",
                    human_bytes(p_peak),
                    human_seconds(p_extra)
                ),
            };
            out.push(format!("not {}: {why}", policy_name(p)));
        }
        out
    }
}

/// The name of a policy in plans: `full`, `masks`, `narrowing`, `selective` (the main
/// program's `--policy` values), `linear` for any other (linear outputs without masks).
pub fn policy_name(policy: Policy) -> &'static str {
    if policy == Policy::RECOMPUTE_ALL {
        "full"
    } else if policy == MASKS {
        "masks"
    } else if policy == NARROWING {
        "narrowing"
    } else if policy == Policy::selective() {
        "selective"
    } else {
        "linear"
    }
}

/// A segment mode's name in plans: its policy's name ([`policy_name`]) when
/// checkpointed, `kept`, `plain`.
fn mode_name(mode: SegmentMode) -> &'static str {
    match mode {
        SegmentMode::Checkpointed(p) => policy_name(p),
        SegmentMode::Kept => "kept",
        SegmentMode::Plain => "plain",
    }
}

/// `bytes` as `12.50 MiB` (binary units).
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn human_seconds(s: f64) -> String {
    if s == 0.0 {
        "0 s".to_owned()
    } else if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.3} µs", s * 1e6)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.segments();
        writeln!(
            f,
            "plan for {} stages: {} segment{} ({} checkpointed, {}the last plain)",
            self.len,
            k,
            if k == 1 { "" } else { "s" },
            self.modes.iter().filter(|m| m.is_checkpointed()).count(),
            match self
                .modes
                .iter()
                .filter(|&&m| m == SegmentMode::Kept)
                .count()
            {
                0 => String::new(),
                n => format!("{n} kept, "),
            }
        )?;
        writeln!(f, "  cuts: {:?}", self.cuts)?;
        let ranges: Vec<String> = self
            .ranges()
            .iter()
            .map(|r| format!("{}..{}", r.start, r.end))
            .collect();
        writeln!(f, "  segments: {}", ranges.join(" | "))?;
        if self
            .modes
            .iter()
            .any(|&m| m != SegmentMode::Checkpointed(Policy::RECOMPUTE_ALL))
        {
            let names: Vec<&str> = self.modes.iter().map(|&m| mode_name(m)).collect();
            writeln!(
                f,
                "  modes of the segments before the last: {}",
                names.join(" | ")
            )?;
        }
        let phase = match self.peak_phase {
            Phase::Plain => "forward and backward of the plain segment".to_string(),
            Phase::Recompute { segment } | Phase::Kept { segment } => {
                let r = &self.ranges()[segment];
                let what = if matches!(self.peak_phase, Phase::Kept { .. }) {
                    "forward and backward of kept"
                } else {
                    "recompute of"
                };
                format!(
                    "{what} segment {} of {k} (stages {}..{})",
                    segment + 1,
                    r.start,
                    r.end
                )
            }
        };
        writeln!(
            f,
            "  predicted peak: {} ({} B), during the {phase}",
            human_bytes(self.predicted_peak_bytes),
            self.predicted_peak_bytes
        )?;
        let ratio = if self.plain_peak_bytes > 0 {
            format!(
                " ({:.1} % of it)",
                100.0 * self.predicted_peak_bytes as f64 / self.plain_peak_bytes as f64
            )
        } else {
            String::new()
        };
        writeln!(
            f,
            "  plain run, predicted: {}{ratio}",
            human_bytes(self.plain_peak_bytes)
        )?;
        if let Some(b) = self.budget_bytes {
            writeln!(f, "  budget: {} ({b} B)", human_bytes(b))?;
        }
        write!(
            f,
            "  predicted extra time: {} (recompute of {} stage{})",
            human_seconds(self.predicted_extra_seconds),
            self.recomputed_stages,
            if self.recomputed_stages == 1 { "" } else { "s" }
        )?;
        if let Some(m) = self.measured_peak_bytes {
            let diff = if self.predicted_peak_bytes > 0 {
                format!(
                    " ({:+.1} % vs predicted)",
                    100.0 * (m as f64 - self.predicted_peak_bytes as f64)
                        / self.predicted_peak_bytes as f64
                )
            } else {
                String::new()
            };
            write!(f, "\n  measured peak: {} ({m} B){diff}", human_bytes(m))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
