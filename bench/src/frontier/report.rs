//! The frontier report: per configuration and point, medians and spreads over rounds,
//! per-round ratios, the issue's goals, `FRONTIER.md`, `frontier.json`, `frontier.png`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, anyhow, ensure};
use ckpt_bench::measure::median;
use ckpt_bench::util::font;
use plotters::prelude::*;
use serde::Serialize;

use super::Config;
use super::side::{HEAP_RESERVE_BYTES, HEAP_STEADY_FAULTS, MAX_EXTRA_WARMUP, Point, PointResult};

const MIB: f64 = 1048576.0;

/// The two processes of one round.
#[derive(Debug, Clone)]
pub struct Round {
    pub ckpt: Vec<PointResult>,
    pub torch: Vec<PointResult>,
}

/// A median with the spread it came from.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub values: Vec<f64>,
}

impl Spread {
    fn of(values: Vec<f64>) -> Spread {
        Spread {
            median: median(&values),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            values,
        }
    }

    fn show(&self, digits: usize) -> String {
        format!(
            "{:.d$} ({:.d$}..{:.d$})",
            self.median,
            self.min,
            self.max,
            d = digits
        )
    }
}

/// One side's figures for one point over all rounds.
#[derive(Debug, Clone, Serialize)]
pub struct SideFigures {
    /// Per-round median step seconds.
    pub seconds: Spread,
    /// Per-round ratio to the plain point of the same process.
    pub vs_plain: Spread,
    /// Peak bytes: the same in every round (checked), but for a budget point, whose plan
    /// may change with the measured times: then the median over rounds.
    pub peak_bytes: i64,
    /// The peak of each round.
    pub peak_bytes_per_round: Vec<i64>,
    /// Fraction of the plain point's peak saved (0.63 = 63 % less).
    pub saved: f64,
}

/// One point of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct PointFigures {
    pub name: String,
    pub hand_chosen: bool,
    pub ckpt: SideFigures,
    pub torch: Option<SideFigures>,
    /// Per-round ckpt / PyTorch step-time ratio.
    pub time_ratio: Option<Spread>,
    /// For a point whose step runs in `ckpt::compact_dropout` (but `compact` itself):
    /// the per-round ratio to the `compact` point of the same process, the cost of its
    /// checkpointing alone (both draw their masks with ckpt's kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_compact: Option<Spread>,
    pub peak_ratio: Option<f64>,
    /// For a budget point: the plan and its predicted peak.
    pub plan: Option<String>,
    pub predicted_peak_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConfigFigures {
    pub name: String,
    pub seq: i64,
    pub batch: i64,
    pub warmup: usize,
    pub steps: usize,
    /// Its rounds come from an earlier run's raw results (`--reuse-raw`).
    pub reused: bool,
    pub points: Vec<PointFigures>,
    /// The heap during the measured steps, per side; `None` for raw results from before
    /// page faults were recorded.
    pub ckpt_heap: Option<HeapFigures>,
    pub torch_heap: Option<HeapFigures>,
}

/// How settled one side's heap was in its processes of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct HeapFigures {
    /// Warm-up steps a process ran, fewest and most over the rounds.
    pub warmup_steps: (usize, usize),
    /// The most minor page faults of any measured step, and its point.
    pub most_faults: u64,
    pub most_faults_point: String,
    /// Measured steps that faulted at least `side::HEAP_STEADY_FAULTS` pages, and all.
    pub faulting_steps: usize,
    pub steps: usize,
}

/// `per_round`: one side's processes; `None` when none recorded its faults.
fn heap_figures(per_round: &[&[PointResult]]) -> Option<HeapFigures> {
    let points = || per_round.iter().flat_map(|r| r.iter());
    if points().all(|p| p.step_faults.is_empty()) {
        return None;
    }
    let warmups = per_round
        .iter()
        .filter_map(|r| r.first())
        .map(|p| p.warmup_steps);
    let (fewest, most) = warmups.fold((usize::MAX, 0), |(a, b), w| (a.min(w), b.max(w)));
    let steps = || points().flat_map(|p| p.step_faults.iter().map(move |&f| (f, &p.name)));
    let (most_faults, most_faults_point) = steps()
        .max_by_key(|&(f, _)| f)
        .map(|(f, name)| (f, name.clone()))
        .unwrap_or_default();
    Some(HeapFigures {
        warmup_steps: (fewest, most),
        most_faults,
        most_faults_point,
        faulting_steps: steps().filter(|&(f, _)| f >= HEAP_STEADY_FAULTS).count(),
        steps: steps().count(),
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: String,
    pub date: String,
    pub threads: i32,
    pub rounds: usize,
    /// How both sides' processes ran glibc's malloc: the `GLIBC_TUNABLES` they had, or
    /// empty for glibc's defaults (set by `ckpt-frontier run --malloc`).
    pub malloc: String,
    pub configs: Vec<ConfigFigures>,
}

/// `planned`: a budget point, whose plan (and so its peak) may differ between rounds,
/// since the planner weighs measured times; every other point's peak must repeat.
fn side_figures(
    per_round: &[&[PointResult]],
    name: &str,
    planned: bool,
) -> Result<Option<SideFigures>> {
    let find = |results: &[PointResult], n: &str| results.iter().find(|r| r.name == n).cloned();
    let mut seconds = Vec::new();
    let mut vs_plain = Vec::new();
    let mut peaks = Vec::new();
    let mut plain_peak = 0;
    for results in per_round {
        let Some(p) = find(results, name) else {
            return Ok(None);
        };
        let plain = find(results, "plain").ok_or_else(|| anyhow!("no plain point"))?;
        seconds.push(p.step_seconds_median);
        vs_plain.push(p.step_seconds_median / plain.step_seconds_median);
        peaks.push(p.peak_bytes);
        plain_peak = plain.peak_bytes;
    }
    ensure!(
        planned || peaks.windows(2).all(|w| w[0] == w[1]),
        "{name}: peak bytes differ between rounds: {peaks:?}"
    );
    let peak_bytes = median(&peaks.iter().map(|&p| p as f64).collect::<Vec<_>>()) as i64;
    Ok(Some(SideFigures {
        seconds: Spread::of(seconds),
        vs_plain: Spread::of(vs_plain),
        peak_bytes,
        saved: 1.0 - peak_bytes as f64 / plain_peak as f64,
        peak_bytes_per_round: peaks,
    }))
}

impl Report {
    pub fn new(
        machine: &str,
        date: &str,
        threads: i32,
        rounds: usize,
        measured: Vec<(Config, Vec<Round>)>,
    ) -> Result<Report> {
        let mut configs = Vec::new();
        for (cfg, rounds_of) in measured {
            let ours: Vec<&[PointResult]> = rounds_of.iter().map(|r| &r.ckpt[..]).collect();
            let theirs: Vec<&[PointResult]> = rounds_of.iter().map(|r| &r.torch[..]).collect();
            let mut points = Vec::new();
            for point in &cfg.points {
                let name = point.name();
                let planned = !point.hand_chosen();
                let ckpt = side_figures(&ours, &name, planned)?
                    .ok_or_else(|| anyhow!("ckpt did not run {name}"))?;
                let torch = if point.on_both_sides() {
                    side_figures(&theirs, &name, false)?
                } else {
                    None
                };
                let time_ratio = torch.as_ref().map(|_| {
                    Spread::of(
                        rounds_of
                            .iter()
                            .map(|r| {
                                let t = |v: &[PointResult]| {
                                    v.iter()
                                        .find(|p| p.name == name)
                                        .map_or(f64::NAN, |p| p.step_seconds_median)
                                };
                                t(&r.ckpt) / t(&r.torch)
                            })
                            .collect(),
                    )
                });
                let compact = Point::Compact.name();
                let vs_compact = (point.compact() && name != compact)
                    .then(|| {
                        let ratios: Option<Vec<f64>> = ours
                            .iter()
                            .map(|r| {
                                let t = |n: &str| {
                                    r.iter()
                                        .find(|p| p.name == n)
                                        .map(|p| p.step_seconds_median)
                                };
                                Some(t(&name)? / t(&compact)?)
                            })
                            .collect();
                        ratios.map(Spread::of)
                    })
                    .flatten();
                let last = rounds_of
                    .last()
                    .and_then(|r| r.ckpt.iter().find(|p| p.name == name));
                points.push(PointFigures {
                    peak_ratio: torch
                        .as_ref()
                        .map(|t| ckpt.peak_bytes as f64 / t.peak_bytes as f64),
                    name,
                    hand_chosen: point.hand_chosen(),
                    ckpt,
                    torch,
                    time_ratio,
                    vs_compact,
                    plan: last.and_then(|p| p.plan.clone()),
                    predicted_peak_bytes: last.and_then(|p| p.predicted_peak_bytes),
                });
            }
            configs.push(ConfigFigures {
                name: cfg.name.clone(),
                seq: cfg.shape.seq,
                batch: cfg.shape.batch,
                warmup: cfg.shape.warmup,
                steps: cfg.shape.steps,
                reused: cfg.reused,
                points,
                ckpt_heap: heap_figures(&ours),
                torch_heap: heap_figures(&theirs),
            });
        }
        Ok(Report {
            machine: machine.into(),
            date: date.into(),
            threads,
            rounds,
            malloc: String::new(),
            configs,
        })
    }

    /// Writes `FRONTIER.md`, `frontier.json` and `frontier.png` into `out`.
    pub fn write(&self, out: &Path) -> Result<()> {
        let json = out.join("frontier.json");
        std::fs::write(&json, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("cannot write {}", json.display()))?;
        let md = out.join("FRONTIER.md");
        std::fs::write(&md, self.markdown())
            .with_context(|| format!("cannot write {}", md.display()))?;
        self.plot(&out.join("frontier.png"))
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "<!-- generated by `bench/frontier.sh` (bench/src/frontier/); edit the generator, not this file -->\n\
             # The memory/time frontier: selective checkpointing, ckpt and PyTorch\n\n\
             Measured {} on {}, {} intra-op threads a process, libtorch 2.13.0 on both sides, \
             {} rounds a configuration; {}.\n\n\
             ```sh\nbench/frontier.sh            # all rounds; bench/frontier.sh --quick for a smoke run\n```\n",
            self.date,
            self.machine,
            self.threads,
            self.rounds,
            if self.malloc.is_empty() {
                "glibc's malloc with its defaults on both sides".to_string()
            } else {
                format!(
                    "glibc's malloc with `GLIBC_TUNABLES={}` on both sides (allocations \
                     of any size reuse the heap instead of being mapped and page-faulted \
                     afresh each step; `bench/README.md` says why)",
                    self.malloc
                )
            }
        );
        let _ = writeln!(
            s,
            "The seed transformer (the main program's encoder: 6 pre-LN blocks, 4 heads, d_model 256, \
             feed-forward 1024, dropout 0.1, AdamW), cross-entropy on random tokens. Points: \
             `plain`; `full/N`: `checkpoint_sequential(blocks, N)` cuts (the last segment plain), \
             full recompute; `selective/3`: the same 3-segment cuts, each checkpointed segment \
             keeping its Linear outputs and recomputing the rest (ckpt: \
             `Policy::selective().save_dropout_masks(false)`; PyTorch: \
             `checkpoint(.., use_reentrant=False, context_fn=..)` with \
             `create_selective_checkpoint_contexts` and `MUST_SAVE` for `aten.addmm`, \
             `PREFER_RECOMPUTE` otherwise); ckpt only: `masks/3` (dropout masks kept, 1 bit an \
             element), `narrowing/3` (`Policy::narrowing()`: the masks and the feed-forward \
             down-projection's output), `selective+masks/3` (`Policy::selective()`), `budget P%` \
             (`segments = auto` within P % of plain's predicted peak), `compact` (plain, the \
             step in `ckpt::compact_dropout`: every dropout mask drawn by ckpt's kernel \
             straight into bits, the same draws as libtorch's serial `bernoulli_`, and held \
             for backward as bits instead of a float noise tensor), `compact budget P%` (the \
             planner in a compact step: P % of a compact plain run's predicted peak; \
             `x compact` in the goals is its per-round ratio to `compact`, what its \
             checkpointing alone costs).\n"
        );
        let _ = writeln!(
            s,
            "Each round runs one process a side, the order alternating (ckpt first in odd rounds); \
             inside a process the points take turns step by step. Time: a point's median step in \
             a round; the table gives the median over rounds and (min..max). `x plain`: the \
             per-round ratio to the plain point of the same process (median, min..max). \
             `ckpt / PyTorch`: the per-round ratio of the same point's times. Peak: tensor bytes \
             above the step's baseline, from one counting allocator on both sides; exact, and \
             checked equal in every round.\n\n\
             **Reading the spreads.** A time ratio is a claim only when its spread supports it: \
             the goals below say `met` or `not met` only when every round's ratio falls on the \
             same side of the goal, and `undecided` otherwise. Bytes repeat exactly.\n"
        );
        for c in &self.configs {
            // The warm-up the processes ran (more than asked for once the heap rule adds
            // steps), or the one asked for when older raw results did not record it.
            let warmup = match (&c.ckpt_heap, &c.torch_heap) {
                (Some(a), Some(b)) => {
                    let (lo, hi) = (
                        a.warmup_steps.0.min(b.warmup_steps.0),
                        a.warmup_steps.1.max(b.warmup_steps.1),
                    );
                    if lo == hi {
                        lo.to_string()
                    } else {
                        format!("{lo}..{hi}")
                    }
                }
                _ => c.warmup.to_string(),
            };
            let _ = writeln!(
                s,
                "## {} (seq {}, batch {}; {} warm-up + {} measured steps a process)\n",
                c.name, c.seq, c.batch, warmup, c.steps
            );
            if c.reused {
                s.push_str(
                    "Rounds of an earlier run, read from `frontier_raw/` (`--reuse-raw`) \
                     instead of measured again with the other configurations; \
                     `git log bench/frontier_raw` dates them.\n\n",
                );
            }
            s.push_str(
                "| point | ckpt peak | saved | ckpt step (s) | ckpt x plain | PyTorch peak | PyTorch step (s) | PyTorch x plain | time ckpt / PyTorch | peak ckpt / PyTorch |\n\
                 |---|---|---|---|---|---|---|---|---|---|\n",
            );
            for p in &c.points {
                let (tp, ts, tx) =
                    p.torch
                        .as_ref()
                        .map_or(("".into(), "".into(), "".into()), |t| {
                            (
                                format!("{:.1} MiB", t.peak_bytes as f64 / MIB),
                                t.seconds.show(3),
                                t.vs_plain.show(3),
                            )
                        });
                let _ = writeln!(
                    s,
                    "| {} | {:.1} MiB | {:.1} % | {} | {} | {} | {} | {} | {} | {} |",
                    p.name,
                    p.ckpt.peak_bytes as f64 / MIB,
                    p.ckpt.saved * 100.0,
                    p.ckpt.seconds.show(3),
                    p.ckpt.vs_plain.show(3),
                    tp,
                    ts,
                    tx,
                    p.time_ratio.as_ref().map_or(String::new(), |r| r.show(3)),
                    p.peak_ratio.map_or(String::new(), |r| format!("{r:.4}")),
                );
            }
            s.push('\n');
            s.push_str(&self.heap(c));
            for p in c.points.iter().filter(|p| p.plan.is_some()) {
                let rounds = &p.ckpt.peak_bytes_per_round;
                if rounds.windows(2).any(|w| w[0] != w[1]) {
                    let _ = writeln!(
                        s,
                        "`{}`: the planner chose different plans in different rounds (it weighs the measured times): peaks {} MiB by round; the table gives their median, the plan below is the last round's.\n",
                        p.name,
                        rounds
                            .iter()
                            .map(|b| format!("{:.1}", *b as f64 / MIB))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                let predicted = p.predicted_peak_bytes.unwrap_or(0) as f64;
                let measured = rounds.last().copied().unwrap_or(p.ckpt.peak_bytes);
                let _ = writeln!(
                    s,
                    "`{}` (last round): predicted peak {:.1} MiB, measured {:.1} MiB (error {:+.1} %).\n\n```text\n{}\n```\n",
                    p.name,
                    predicted / MIB,
                    measured as f64 / MIB,
                    (predicted / measured as f64 - 1.0) * 100.0,
                    p.plan.as_deref().unwrap_or("")
                );
            }
            s.push_str(&self.goals(c));
        }
        s.push_str("![peak memory against step time](frontier.png)\n");
        s
    }

    /// The paragraph on the heap during the measured steps.
    fn heap(&self, c: &ConfigFigures) -> String {
        let side = |name: &str, h: &Option<HeapFigures>| match h {
            None => format!("{name}: page faults not recorded (older raw results)"),
            Some(h) => {
                let most = if h.most_faults == 0 {
                    "no measured step faulted".to_string()
                } else {
                    format!(
                        "the most {} faults in a step (`{}`)",
                        h.most_faults, h.most_faults_point
                    )
                };
                format!(
                    "{name}: {}..{} warm-up steps a process, {} of {} measured steps with \
                     {HEAP_STEADY_FAULTS} faults or more, {most}",
                    h.warmup_steps.0, h.warmup_steps.1, h.faulting_steps, h.steps,
                )
            }
        };
        let headroom = if self.malloc.is_empty() {
            "with glibc's defaults the block is mapped and unmapped, no headroom"
        } else {
            "touched headroom, as this heap is never trimmed; growth into it faults nothing, \
             so the check that follows cannot see it"
        };
        format!(
            "Heap: after {} warm-up steps a process writes and frees a {} MiB block on top \
             of its heap (`HEAP_RESERVE_BYTES`; {headroom}), then warms up until a cycle (a \
             step of every point) in which no step had {HEAP_STEADY_FAULTS} minor page faults \
             (4 MiB of new heap), at most {MAX_EXTRA_WARMUP} more steps; every measured \
             step's faults are recorded. {}; {}.\n\n",
            c.warmup,
            HEAP_RESERVE_BYTES >> 20,
            side("ckpt", &c.ckpt_heap),
            side("PyTorch", &c.torch_heap)
        )
    }

    /// `met` / `not met` when every round agrees, `undecided` otherwise.
    fn verdict(values: &[f64], goal: f64) -> &'static str {
        if values.iter().all(|v| *v <= goal) {
            "met"
        } else if values.iter().all(|v| *v > goal) {
            "not met"
        } else {
            "undecided"
        }
    }

    fn goals(&self, c: &ConfigFigures) -> String {
        let mut s = String::from("Goals:\n\n");
        // >= 60 % less peak than plain at <= 1.15x plain.
        let small: Vec<&PointFigures> = c.points.iter().filter(|p| p.ckpt.saved >= 0.60).collect();
        match small
            .iter()
            .min_by(|a, b| a.ckpt.vs_plain.median.total_cmp(&b.ckpt.vs_plain.median))
        {
            Some(best) => {
                let _ = writeln!(
                    s,
                    "- at >= 60 % less peak than plain, step time <= 1.15x plain: fastest such ckpt point `{}` ({:.1} % less) at {} x plain: {}",
                    best.name,
                    best.ckpt.saved * 100.0,
                    best.ckpt.vs_plain.show(3),
                    Self::verdict(&best.ckpt.vs_plain.values, 1.15)
                );
                if let Some(vc) = &best.vs_compact {
                    let _ = writeln!(
                        s,
                        "  - its checkpointing alone, against `compact` (nothing checkpointed, the same mask draw): {} x compact: {}",
                        vc.show(3),
                        Self::verdict(&vc.values, 1.15)
                    );
                }
            }
            None => s.push_str("- at >= 60 % less peak: no ckpt point saves 60 %: not met\n"),
        }
        for p in c.points.iter().filter(|p| p.name.starts_with("selective/")) {
            if let (Some(t), Some(pr)) = (&p.time_ratio, p.peak_ratio) {
                let _ = writeln!(
                    s,
                    "- selective, the same policy, ckpt / PyTorch: time {} <= 1.0: {}; peak {:.4} <= 1.02: {}",
                    t.show(3),
                    Self::verdict(&t.values, 1.0),
                    pr,
                    if pr <= 1.02 { "met" } else { "not met" }
                );
            }
        }
        // Budget points against every hand-chosen point of either side.
        let mut hand: Vec<(String, f64, i64)> = Vec::new();
        for p in c.points.iter().filter(|p| p.hand_chosen) {
            hand.push((
                format!("ckpt {}", p.name),
                p.ckpt.seconds.median,
                p.ckpt.peak_bytes,
            ));
            if let Some(t) = &p.torch {
                hand.push((
                    format!("PyTorch {}", p.name),
                    t.seconds.median,
                    t.peak_bytes,
                ));
            }
        }
        for p in c.points.iter().filter(|p| !p.hand_chosen) {
            let ahead: Vec<&str> = hand
                .iter()
                .filter(|(_, secs, bytes)| {
                    *secs < p.ckpt.seconds.median && *bytes < p.ckpt.peak_bytes
                })
                .map(|(n, _, _)| n.as_str())
                .collect();
            let _ = writeln!(
                s,
                "- `{}` ({:.1} MiB, {:.3} s): {}",
                p.name,
                p.ckpt.peak_bytes as f64 / MIB,
                p.ckpt.seconds.median,
                if ahead.is_empty() {
                    "on or ahead of the hand-chosen frontier (no hand-chosen point is both faster and smaller)".to_string()
                } else {
                    format!(
                        "behind: faster and smaller by median time: {}",
                        ahead.join(", ")
                    )
                }
            );
        }
        s.push('\n');
        s
    }

    fn plot(&self, path: &Path) -> Result<()> {
        font()?;
        let draw = |e: &dyn std::fmt::Display| anyhow!("{}: drawing failed: {e}", path.display());
        let width = 700 * self.configs.len() as u32;
        let root = BitMapBackend::new(path, (width.max(700), 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(&e))?;
        let panels = root.split_evenly((1, self.configs.len().max(1)));
        let ours = RGBColor(30, 90, 180);
        let theirs = RGBColor(200, 90, 20);
        for (area, c) in panels.iter().zip(&self.configs) {
            let mut pts: Vec<(String, f64, f64, f64, f64, bool)> = Vec::new();
            for p in &c.points {
                pts.push((
                    p.name.clone(),
                    p.ckpt.seconds.median,
                    p.ckpt.seconds.min,
                    p.ckpt.seconds.max,
                    p.ckpt.peak_bytes as f64 / MIB,
                    true,
                ));
                if let Some(t) = &p.torch {
                    pts.push((
                        p.name.clone(),
                        t.seconds.median,
                        t.seconds.min,
                        t.seconds.max,
                        t.peak_bytes as f64 / MIB,
                        false,
                    ));
                }
            }
            let x_max = pts.iter().map(|p| p.3).fold(0.0, f64::max) * 1.1;
            let x_min = pts.iter().map(|p| p.2).fold(f64::INFINITY, f64::min) * 0.9;
            let y_max = pts.iter().map(|p| p.4).fold(0.0, f64::max) * 1.1;
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!("{}: peak against step time", c.name),
                    ("sans-serif", 18),
                )
                .margin(16)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(x_min..x_max, 0.0..y_max)
                .map_err(|e| draw(&e))?;
            chart
                .configure_mesh()
                .x_desc("median step time (s), bars: min..max over rounds")
                .y_desc("peak tensor memory (MiB)")
                .label_style(("sans-serif", 12))
                .draw()
                .map_err(|e| draw(&e))?;
            for (name, med, lo, hi, mib, is_ours) in &pts {
                let color = if *is_ours { ours } else { theirs };
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(*lo, *mib), (*hi, *mib)],
                        color.stroke_width(1),
                    )))
                    .map_err(|e| draw(&e))?;
                // The marker, and its name a few pixels to the right and above it.
                let style = ("sans-serif", 11).into_font().color(&color);
                if *is_ours {
                    chart
                        .draw_series([EmptyElement::at((*med, *mib))
                            + Circle::new((0, 0), 5, color.filled())
                            + Text::new(name.clone(), (7, -14), style)])
                        .map_err(|e| draw(&e))?;
                } else {
                    chart
                        .draw_series([EmptyElement::at((*med, *mib))
                            + TriangleMarker::new((0, 0), 6, color.filled())
                            + Text::new(name.clone(), (7, 4), style)])
                        .map_err(|e| draw(&e))?;
                }
            }
            chart
                .draw_series([Circle::new((x_min, 0.0), 0, ours.filled())])
                .map_err(|e| draw(&e))?
                .label("ckpt")
                .legend(move |(x, y)| Circle::new((x + 6, y), 5, ours.filled()));
            chart
                .draw_series([Circle::new((x_min, 0.0), 0, theirs.filled())])
                .map_err(|e| draw(&e))?
                .label("PyTorch")
                .legend(move |(x, y)| TriangleMarker::new((x + 6, y), 6, theirs.filled()));
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(|e| draw(&e))?;
        }
        root.present().map_err(|e| draw(&e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;
    use crate::side::{Point, Shape};

    fn result(name: &str, secs: f64, peak: i64) -> PointResult {
        PointResult {
            name: name.into(),
            step_seconds_median: secs,
            step_seconds: vec![secs],
            peak_bytes: peak,
            plan: None,
            predicted_peak_bytes: None,
            warmup_steps: 3,
            step_faults: vec![0],
        }
    }

    /// The heap paragraph counts every measured step of every point of a side; raw
    /// results without faults give `None`.
    #[test]
    fn heap_of_rounds() {
        let with = |name: &str, warmup: usize, faults: Vec<u64>| PointResult {
            warmup_steps: warmup,
            step_faults: faults,
            ..result(name, 1.0, 1)
        };
        let a = [
            with("plain", 3, vec![0, 50_000]),
            with("full/3", 3, vec![10, 0]),
        ];
        let b = [
            with("plain", 5, vec![2, 3]),
            with("full/3", 5, vec![1024, 7]),
        ];
        let h = heap_figures(&[&a, &b]).unwrap();
        assert_eq!(h.warmup_steps, (3, 5));
        assert_eq!(
            (h.most_faults, h.most_faults_point.as_str()),
            (50_000, "plain")
        );
        assert_eq!((h.faulting_steps, h.steps), (2, 8));
        let old = [PointResult {
            step_faults: Vec::new(),
            ..result("plain", 1.0, 1)
        }];
        assert!(heap_figures(&[&old]).is_none());
    }

    /// A budget point's peak may change between rounds (the planner weighs measured
    /// times); a hand-chosen point's may not. Ratios are per round.
    #[test]
    fn report_of_rounds() {
        let cfg = Config {
            name: "c".into(),
            shape: Shape {
                seq: 4,
                batch: 2,
                warmup: 1,
                steps: 1,
            },
            points: vec![Point::Plain, Point::Budget { fraction: 0.5 }],
            reused: false,
        };
        let round = |budget_peak: i64, plain_secs: f64| Round {
            ckpt: vec![
                result("plain", plain_secs, 100),
                PointResult {
                    plan: Some("the plan".into()),
                    predicted_peak_bytes: Some(45),
                    ..result("budget 50%", 2.0 * plain_secs, budget_peak)
                },
            ],
            torch: vec![result("plain", 1.0, 110)],
        };
        let rounds = vec![round(40, 1.0), round(50, 2.0), round(40, 1.5)];
        let r = Report::new("m", "d", 2, 3, vec![(cfg.clone(), rounds)]).unwrap();
        let plain = &r.configs[0].points[0];
        assert_eq!(
            plain.time_ratio.as_ref().unwrap().values,
            vec![1.0, 2.0, 1.5]
        );
        let budget = &r.configs[0].points[1];
        assert_eq!(budget.ckpt.peak_bytes, 40);
        assert_eq!(budget.ckpt.peak_bytes_per_round, vec![40, 50, 40]);
        assert_eq!(budget.ckpt.vs_plain.values, vec![2.0, 2.0, 2.0]);
        let md = r.markdown();
        assert!(md.contains("different plans in different rounds"), "{md}");
        // A hand-chosen point whose bytes change is an error.
        let bad = vec![
            Round {
                ckpt: vec![result("plain", 1.0, 100), result("budget 50%", 1.0, 1)],
                torch: vec![result("plain", 1.0, 110)],
            },
            Round {
                ckpt: vec![result("plain", 1.0, 101), result("budget 50%", 1.0, 1)],
                torch: vec![result("plain", 1.0, 110)],
            },
        ];
        assert!(Report::new("m", "d", 2, 2, vec![(cfg, bad)]).is_err());
    }
}
