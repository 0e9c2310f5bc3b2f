//! Results: the printed table, the `--json` file, and the sweep's CSV and PNG.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, anyhow};
use ckpt::plan::{Plan, SegmentMode};
use plotters::prelude::*;
use serde::Serialize;

use crate::train::{MIB, RankFigures, RunResult};

/// The run every other is compared with (overheads, memory saved, step-time ratios, the
/// JSON's `reference_run`): the first, the plain run unless `--mode` or `--sweep` chose
/// otherwise. `None` for no runs.
pub fn reference(runs: &[RunResult]) -> Option<&RunResult> {
    runs.first()
}

/// The `--json` document. The fields of the issue keep their names and units (bytes,
/// seconds, fractions 0..1); the rest are additions.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `listops` or `text`.
    pub task: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// Model, data and optimisation settings.
    pub config: ConfigJson,
    /// One entry a run, in the order they ran.
    pub runs: Vec<RunJson>,
    /// Largest absolute difference of any parameter's gradient after the first step,
    /// between the first run and each other run (`null` with a single run).
    pub grad_max_abs_diff: Option<f64>,
    /// Largest absolute difference of the loss at the same step, likewise.
    pub loss_max_abs_diff: Option<f64>,
    /// libtorch's intra-op threads.
    pub threads: i32,
    /// The run that overheads, reductions and differences are relative to.
    pub reference_run: String,
    /// `interleaved` (the runs take turns step by step) or `sequential`.
    pub schedule: String,
    /// Processes that trained each run together (1: no data parallelism).
    pub world_size: usize,
    /// Data-parallel runs: the largest absolute difference of any parameter after
    /// training between a run and one process trained on the same global batches, over
    /// all runs (`null` for a single process).
    pub ddp_max_param_diff: Option<f64>,
}

/// `config` of [`Report`].
#[derive(Debug, Serialize)]
pub struct ConfigJson {
    /// Encoder blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: i64,
    /// Residual width.
    pub d_model: i64,
    /// Tokens a row (padded).
    pub seq_len: usize,
    /// Rows a step.
    pub batch_size: usize,
    /// Training steps of each run.
    pub steps: usize,
    /// Feed-forward width.
    pub ff: i64,
    /// Dropout probability.
    pub dropout: f64,
    /// Passes over the training split.
    pub epochs: usize,
    /// Training examples.
    pub train_size: usize,
    /// Test examples.
    pub test_size: usize,
    /// Token ids.
    pub vocab_size: usize,
    /// Classes.
    pub classes: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Steps of linear learning-rate warm-up.
    pub warmup_steps: usize,
    /// Seed of weights, dropout, data order (and ListOps data).
    pub seed: u64,
}

/// One run in [`Report::runs`].
#[derive(Debug, Serialize)]
pub struct RunJson {
    /// `plain`, `checkpointed` or `segments=N`.
    pub name: String,
    /// Segments (0 = plain).
    pub segments: usize,
    /// What checkpointed segments keep: `full`, `masks`, `narrowing`, `selective`, `auto`
    /// (the planner chose per segment), or `none` (plain).
    pub policy: String,
    /// The run held its dropout masks as bits (`--compact-dropout`; `false` for plain).
    pub compact_dropout: bool,
    /// Peak tensor bytes above the pre-step baseline of a steady training step.
    pub peak_bytes: i64,
    /// Median step wall time, seconds.
    pub step_seconds_median: f64,
    /// Mean epoch wall time, seconds.
    pub epoch_seconds: f64,
    /// Test accuracy, 0..1.
    pub test_accuracy: f64,
    /// Loss of the last training step.
    pub final_loss: f64,
    /// Peak bytes above baseline of the first step (AdamW allocates its state there).
    pub first_step_peak_bytes: i64,
    /// Tensor bytes live before a steady step (parameters, AdamW state and batch, of
    /// every run alive: interleaved runs train side by side).
    pub baseline_bytes: i64,
    /// Step time over the reference run's, minus 1, in percent.
    pub overhead_pct: f64,
    /// This run's step times over the reference run's, step by step (`null` for the
    /// reference, and with fewer than two steps).
    pub step_ratio: Option<StepRatio>,
    /// Peak memory saved against the reference run, in percent.
    pub memory_reduction_pct: f64,
    /// Loss of every step.
    pub losses: Vec<f64>,
    /// Wall time of every step, seconds.
    pub step_seconds: Vec<f64>,
    /// Rows a step of one rank (the global batch for a single process).
    pub rows_per_step: usize,
    /// Figures of each rank, by rank (one entry for a single process).
    pub ranks: Vec<RankJson>,
    /// This data-parallel run's largest parameter difference against its
    /// single-process reference (`null` for a single process).
    pub ddp_max_param_diff: Option<f64>,
    /// The planner's plan the run trained with (`null` unless `--segments auto` or
    /// `--budget` cut it).
    pub plan: Option<PlanJson>,
}

/// A plan in [`RunJson::plan`]: the model's stages (the embedding stages, then one per
/// block, then the head) cut into segments.
#[derive(Debug, Serialize)]
pub struct PlanJson {
    /// Stages.
    pub stages: usize,
    /// The first stage of every segment but the first.
    pub cuts: Vec<usize>,
    /// How each segment runs: `kept`, a checkpointed segment's policy (`full`, `masks`,
    /// `narrowing`, `selective`), and `plain` for the last.
    pub modes: Vec<String>,
    /// The cost model's peak of a step's forward and backward, bytes.
    pub predicted_peak_bytes: u64,
    /// The cost model's recompute time of a step, seconds.
    pub predicted_extra_seconds: f64,
}

impl From<&Plan> for PlanJson {
    fn from(plan: &Plan) -> Self {
        PlanJson {
            stages: plan.len(),
            cuts: plan.cuts().to_vec(),
            modes: modes(plan),
            predicted_peak_bytes: plan.predicted_peak_bytes(),
            predicted_extra_seconds: plan.predicted_extra_seconds(),
        }
    }
}

/// How each segment of `plan` runs, as [`PlanJson::modes`] names it.
fn modes(plan: &Plan) -> Vec<String> {
    (0..plan.segments())
        .map(|j| match plan.mode(j) {
            SegmentMode::Kept => "kept".to_owned(),
            SegmentMode::Plain => "plain".to_owned(),
            SegmentMode::Checkpointed(p) => ckpt::plan::policy_name(p).to_owned(),
        })
        .collect()
}

/// One line per run the planner cut: the plan it trained with.
pub fn plan_lines(runs: &[RunResult]) -> String {
    let mut out = String::new();
    for r in runs {
        if let Some(plan) = &r.plan {
            let _ = writeln!(
                out,
                "{} ({}): trained with cuts {:?}, segments {} (predicted peak {:.1} MiB)",
                r.name,
                r.policy,
                plan.cuts(),
                modes(plan).join(" | "),
                plan.predicted_peak_bytes() as f64 / MIB
            );
        }
    }
    out
}

/// A run's step times over the reference run's, step by step, leaving out the first
/// step (it allocates AdamW's state and makes the planner's profile): with the runs
/// interleaved, each pair of steps ran back to back, so the ratios see the same load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepRatio {
    /// Steps compared (steps 2 to `steps + 1`).
    pub steps: usize,
    /// Median of the per-step ratios.
    pub median: f64,
    /// First quartile (`np.quantile` linear, as [`ckpt_models::stats::quantile`]).
    pub q1: f64,
    /// Third quartile.
    pub q3: f64,
}

/// `run`'s [`StepRatio`] against `reference`, over the steps both made; `None` when `run`
/// is `reference` or with fewer than two steps.
pub fn step_ratio(run: &RunResult, reference: &RunResult) -> Option<StepRatio> {
    if std::ptr::eq(run, reference) {
        return None;
    }
    let ratios: Vec<f64> = run
        .step_seconds
        .iter()
        .zip(&reference.step_seconds)
        .skip(1)
        .map(|(a, b)| a / b)
        .collect();
    let q = |x| ckpt_models::stats::quantile(&ratios, x);
    Some(StepRatio {
        steps: ratios.len(),
        median: q(0.5)?,
        q1: q(0.25)?,
        q3: q(0.75)?,
    })
}

/// One line per run but the [`reference`]: its [`StepRatio`] against the reference, and
/// a line for `--compact-dropout`'s runs.
pub fn ratio_lines(runs: &[RunResult], schedule: &str) -> String {
    let mut out = String::new();
    let Some(reference) = reference(runs) else {
        return out;
    };
    for r in runs {
        if let Some(s) = step_ratio(r, reference) {
            let _ = writeln!(
                out,
                "{} ({}): step time / {}'s, step by step ({schedule}, steps 2-{}): median \
                 {:.3} (IQR {:.3}-{:.3})",
                r.name,
                r.policy,
                reference.name,
                s.steps + 1,
                s.median,
                s.q1,
                s.q3
            );
        }
    }
    if runs.iter().any(|r| r.compact_dropout) {
        let _ = writeln!(
            out,
            "--compact-dropout: every run but plain held its dropout masks as bits \
             (ckpt::compact_dropout)"
        );
    }
    out
}

/// One rank in [`RunJson::ranks`].
#[derive(Debug, Serialize)]
pub struct RankJson {
    /// Peak tensor bytes above the pre-step baseline of a steady step, on this rank.
    pub peak_bytes: i64,
    /// Median step wall time on this rank, seconds.
    pub step_seconds_median: f64,
    /// This rank's rows a step over its median step time.
    pub samples_per_second: f64,
}

impl From<&RankFigures> for RankJson {
    fn from(f: &RankFigures) -> Self {
        RankJson {
            peak_bytes: f.peak_bytes,
            step_seconds_median: f.step_seconds_median,
            samples_per_second: f.samples_per_second,
        }
    }
}

/// Overhead (%) and memory reduction (%) of `run` against `reference`.
pub fn compare(run: &RunResult, reference: &RunResult) -> (f64, f64) {
    let overhead = (run.step_seconds_median / reference.step_seconds_median - 1.0) * 100.0;
    let saved = (1.0 - run.peak_bytes as f64 / reference.peak_bytes as f64) * 100.0;
    (overhead, saved)
}

impl RunJson {
    /// The JSON form of `run`, compared with `reference`.
    pub fn new(run: &RunResult, reference: &RunResult) -> Self {
        let (overhead_pct, memory_reduction_pct) = compare(run, reference);
        RunJson {
            name: run.name.clone(),
            segments: run.segments,
            policy: run.policy.to_owned(),
            compact_dropout: run.compact_dropout,
            peak_bytes: run.peak_bytes,
            step_seconds_median: run.step_seconds_median,
            epoch_seconds: run.epoch_seconds,
            test_accuracy: run.test_accuracy,
            final_loss: run.final_loss(),
            first_step_peak_bytes: run.first_step_peak_bytes,
            baseline_bytes: run.baseline_bytes,
            overhead_pct,
            step_ratio: step_ratio(run, reference),
            memory_reduction_pct,
            losses: run.losses.clone(),
            step_seconds: run.step_seconds.clone(),
            rows_per_step: run.rows_per_step,
            ranks: run.ranks.iter().map(RankJson::from).collect(),
            ddp_max_param_diff: run.ddp_max_param_diff,
            plan: run.plan.as_ref().map(PlanJson::from),
        }
    }
}

/// Writes `report` as pretty JSON.
///
/// # Errors
///
/// When the file cannot be written.
pub fn write_json(path: &Path, report: &Report) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text + "\n").with_context(|| format!("{}: cannot write", path.display()))
}

/// The comparison table; the [`reference`] run is the reference of its overhead and
/// memory-saved columns.
pub fn table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>8} {:>9} {:>10} {:>12} {:>10} {:>9} {:>10} {:>9} {:>11}",
        "run",
        "segments",
        "policy",
        "peak MiB",
        "step s (med)",
        "epoch s",
        "overhead",
        "mem saved",
        "test acc",
        "final loss"
    );
    let Some(reference) = reference(runs) else {
        return out;
    };
    for r in runs {
        let (overhead, saved) = compare(r, reference);
        let (overhead, saved) = if std::ptr::eq(r, reference) {
            ("-".to_owned(), "-".to_owned())
        } else {
            (format!("{overhead:+.1}%"), format!("{saved:.1}%"))
        };
        let segments = if r.segments == 0 {
            "-".to_owned()
        } else {
            r.segments.to_string()
        };
        let _ = writeln!(
            out,
            "{:<14} {:>8} {:>9} {:>10.1} {:>12.3} {:>10.1} {:>9} {:>10} {:>9.3} {:>11.4}",
            r.name,
            segments,
            if r.policy == "none" { "-" } else { r.policy },
            r.peak_bytes as f64 / MIB,
            r.step_seconds_median,
            r.epoch_seconds,
            overhead,
            saved,
            r.test_accuracy,
            r.final_loss()
        );
    }
    out
}

/// The per-rank table of data-parallel runs: each rank's peak memory, median step time
/// and samples per second, the group's samples per second (the global batch over the
/// slowest rank's median step), and the largest parameter difference against one
/// process trained on the same global batches.
pub fn rank_table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>5} {:>10} {:>12} {:>10} {:>16}",
        "run", "rank", "peak MiB", "step s (med)", "samples/s", "max param diff"
    );
    for r in runs {
        for (rank, f) in r.ranks.iter().enumerate() {
            let diff = match (rank, r.ddp_max_param_diff) {
                (0, Some(d)) => format!("{d:.3e}"),
                _ => "-".to_owned(),
            };
            let _ = writeln!(
                out,
                "{:<14} {:>5} {:>10.1} {:>12.3} {:>10.1} {:>16}",
                r.name,
                rank,
                f.peak_bytes as f64 / MIB,
                f.step_seconds_median,
                f.samples_per_second,
                diff
            );
        }
        let slowest = r
            .ranks
            .iter()
            .map(|f| f.step_seconds_median)
            .fold(0.0, f64::max);
        let global = (r.rows_per_step * r.ranks.len()) as f64;
        let _ = writeln!(
            out,
            "{:<14} {:>5} {:>10} {:>12.3} {:>10.1} {:>16}",
            r.name,
            "all",
            "",
            slowest,
            global / slowest,
            ""
        );
    }
    out
}

/// Writes the sweep as CSV, one row a run, compared with the [`reference`] run.
///
/// # Errors
///
/// When the file cannot be written.
pub fn write_csv(path: &Path, runs: &[RunResult]) -> Result<()> {
    let mut out = String::from(
        "segments,peak_bytes,peak_mib,first_step_peak_bytes,step_seconds_median,epoch_seconds,\
         overhead_pct,memory_reduction_pct,test_accuracy,final_loss\n",
    );
    for r in runs {
        let (overhead, saved) = compare(r, reference(runs).unwrap_or(r));
        let _ = writeln!(
            out,
            "{},{},{:.3},{},{:.6},{:.3},{:.2},{:.2},{:.4},{:.6}",
            r.segments,
            r.peak_bytes,
            r.peak_bytes as f64 / MIB,
            r.first_step_peak_bytes,
            r.step_seconds_median,
            r.epoch_seconds,
            overhead,
            saved,
            r.test_accuracy,
            r.final_loss()
        );
    }
    std::fs::write(path, out).with_context(|| format!("{}: cannot write", path.display()))
}

/// Plots median step time against peak memory, one labelled point per segment count
/// (counts with the same peak share a point), joined in order of memory, as a PNG.
/// Text uses the Hack font shipped inside the binary (`epaint_default_fonts`), so no
/// system fonts are needed (plotters' `ab_glyph` backend; its glyph placement ignores
/// side bearings, which a monospaced font hides).
///
/// # Errors
///
/// When drawing or writing fails.
pub fn write_plot(path: &Path, runs: &[RunResult], title: &str) -> Result<()> {
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| anyhow!("the built-in font cannot be loaded"))?;
    let draw = |e: &dyn std::fmt::Display| anyhow!("{}: drawing failed: {e}", path.display());

    // Points: (MiB, seconds, label), merging segment counts with equal peaks (with 6
    // blocks, 4 and 2 segments both keep 3 blocks' worth, for example).
    let reference = &runs[0];
    let close = |a: i64, b: i64| (a - b).abs() as f64 <= 0.01 * reference.peak_bytes as f64;
    let mut groups: Vec<(i64, Vec<&RunResult>)> = Vec::new();
    for r in runs {
        match groups
            .iter_mut()
            .find(|(peak, _)| close(*peak, r.peak_bytes))
        {
            Some((_, members)) => members.push(r),
            None => groups.push((r.peak_bytes, vec![r])),
        }
    }
    groups.sort_by_key(|(peak, _)| *peak);
    let points: Vec<(f64, f64, String)> = groups
        .iter()
        .map(|(peak, members)| {
            let counts: Vec<String> = members.iter().map(|r| r.segments.to_string()).collect();
            let seconds = crate::train::median(
                &members
                    .iter()
                    .map(|r| r.step_seconds_median)
                    .collect::<Vec<_>>(),
            );
            let label = if members.iter().all(|r| r.segments <= 1) {
                "plain (1 segment)".to_owned()
            } else {
                let saved = (1.0 - *peak as f64 / reference.peak_bytes as f64) * 100.0;
                let overhead = (seconds / reference.step_seconds_median - 1.0) * 100.0;
                format!(
                    "{} segments: {saved:.0}% less memory, {overhead:+.0}% time",
                    counts.join(", ")
                )
            };
            (*peak as f64 / MIB, seconds, label)
        })
        .collect();
    let x_max = points.iter().map(|p| p.0).fold(0.0, f64::max);
    let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max);

    let root = BitMapBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(24)
        .x_label_area_size(56)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..x_max * 1.1, 0.0..y_max * 1.2)
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc("peak tensor memory of a training step above its baseline (MiB)")
        .y_desc("median step time (s)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(|e| draw(&e))?;
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.0, p.1)),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| draw(&e))?;
    chart
        .draw_series(points.iter().map(|(x, y, label)| {
            // Labels of points in the right half go to their left, so they stay inside.
            let width = (label.chars().count() as f64 * 7.2) as i32;
            let dx = if *x > x_max * 0.55 { -width - 8 } else { 8 };
            EmptyElement::at((*x, *y))
                + Circle::new((0, 0), 5, BLUE.filled())
                + Text::new(label.clone(), (dx, -24), ("sans-serif", 15))
        }))
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}
