//! `segments = auto` against every hand-chosen `segments`, on a 6-layer transformer
//! encoder (`ckpt-models/src/encoder.rs`: 6 pre-LN blocks, 4 heads, d_model 256, feed-forward
//! 1024; here with 256 tokens, batch 16).
//!
//! ```text
//! cargo run --release --example plan_encoder                  # 6 layers, seq 256, batch 16 (~2 min on 2 cores)
//! cargo run --release --example plan_encoder -- --quick       # d_model 64, seq 64: seconds
//! cargo run --release --example plan_encoder -- --budget 50% --json target/plan_encoder.json
//! ```
//!
//! One model, one declaration (`#[checkpointed(segments = 3)]` in `encoder.rs`): the
//! generated `set_segments` sweeps `segments = 1 ..= stages` (the 11 stages of the chain:
//! `tok`, `dropout`, 6 blocks, `ln_f`, the pooling closure, `head`), and `set_auto` /
//! `set_budget` switch to the planner. For each, one training step (forward, cross-entropy,
//! backward) is measured with `ckpt::memory` (exact tensor bytes above the step's start,
//! parameter gradients already allocated by a warm-up step), next to the cost model's
//! prediction (`plan_for`). The program fails when `auto`'s measured peak is above the
//! best hand-chosen one.

use ckpt_models::encoder;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

use encoder::{Config, Encoder};

/// Compare `segments = auto` (and a budget) with every `segments = N` on the encoder.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Batch size.
    #[arg(long, default_value_t = 16)]
    batch: i64,
    /// Tokens per example.
    #[arg(long, default_value_t = 256)]
    seq: i64,
    /// Encoder blocks.
    #[arg(long, default_value_t = 6)]
    layers: usize,
    /// Width of the residual stream.
    #[arg(long, default_value_t = 256)]
    d_model: i64,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: i64,
    /// Also plan for this budget ("512 MiB", "40%").
    #[arg(long)]
    budget: Option<String>,
    /// d_model 64, feed-forward 256, seq 64: a run of seconds.
    #[arg(long)]
    quick: bool,
    /// cpu, or cuda (device 0).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Write the rows as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// One measured schedule.
#[derive(Debug, Serialize)]
struct Row {
    schedule: String,
    segments: usize,
    cuts: Vec<usize>,
    predicted_peak_bytes: u64,
    measured_peak_bytes: u64,
    predicted_extra_seconds: f64,
    step_seconds: f64,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let device = match args.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::Cuda(0),
        other => anyhow::bail!("--device {other}: expected cpu or cuda"),
    };
    let (d_model, seq) = if args.quick {
        (64, 64)
    } else {
        (args.d_model, args.seq)
    };
    let c = Config {
        vocab: 1000,
        classes: 10,
        seq_len: seq,
        layers: args.layers,
        heads: args.heads,
        d_model,
        ff: 4 * d_model,
        dropout: 0.1,
    };
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let mut model = Encoder::new(vs.root(), &c);
    let ids = Tensor::randint_low(1, c.vocab, [args.batch, seq], (Kind::Int64, device));
    let lengths = Tensor::randint_low(seq / 2, seq + 1, [args.batch, 1], (Kind::Int64, device));
    let positions = Tensor::arange(seq, (Kind::Int64, device)).unsqueeze(0);
    let ids = ids.masked_fill(&positions.ge_tensor(&lengths), 0);
    let labels = Tensor::randint(c.classes, [args.batch], (Kind::Int64, device));
    let stages = model.stage_names();
    println!(
        "encoder: {} blocks, d_model {d_model}, {} heads, batch {} x {seq} tokens, {device:?}",
        c.layers, c.heads, args.batch
    );
    println!("chain of {} stages: {}", stages.len(), stages.join(" → "));

    let step = |model: &Encoder| -> Result<(u64, f64)> {
        let start = Instant::now();
        let ((), report) = ckpt::memory::f_measure(device, || {
            let loss = model
                .forward_t(&ids, true)
                .cross_entropy_for_logits(&labels);
            loss.backward();
        })?;
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
        let peak = u64::try_from(report.peak_above_baseline_bytes)?;
        Ok((peak, start.elapsed().as_secs_f64()))
    };
    // Parameter gradients are allocated by the first step: measure from the second.
    model.set_segments(1)?;
    step(&model)?;

    let mut schedules: Vec<ckpt::plan::Schedule> = (1..=stages.len())
        .map(ckpt::plan::Schedule::Segments)
        .collect();
    schedules.push(ckpt::plan::Schedule::Auto(ckpt::plan::Objective::MinPeak));
    if let Some(b) = &args.budget {
        let budget: ckpt::plan::Budget = b.parse()?;
        schedules.push(ckpt::plan::Schedule::Auto(ckpt::plan::Objective::Budget(
            budget,
        )));
    }
    let bar = ProgressBar::new(schedules.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").context("progress style")?,
    );
    let mut rows = Vec::new();
    let mut auto_plan = None;
    for schedule in schedules {
        bar.set_message(schedule.to_string());
        model.set_schedule(schedule.clone())?;
        let mut plan = model.plan_for(&ids, true)?;
        let (measured, seconds) = step(&model)?;
        plan.set_measured_peak_bytes(measured);
        if let ckpt::plan::Schedule::Auto(_) = schedule {
            bar.suspend(|| println!("{schedule}:\n{plan}\n"));
            if auto_plan.is_none() {
                auto_plan = Some(plan.clone());
            }
        }
        rows.push(Row {
            schedule: schedule.to_string(),
            segments: plan.segments(),
            cuts: plan.cuts().to_vec(),
            predicted_peak_bytes: plan.predicted_peak_bytes(),
            measured_peak_bytes: measured,
            predicted_extra_seconds: plan.predicted_extra_seconds(),
            step_seconds: seconds,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();

    println!(
        "{:<34} {:>8} {:>12} {:>12} {:>8} {:>9}",
        "schedule", "segments", "predicted", "measured", "error", "step"
    );
    for r in &rows {
        println!(
            "{:<34} {:>8} {:>8.2} MiB {:>8.2} MiB {:>+7.1}% {:>8.2}s",
            r.schedule,
            r.segments,
            mib(r.predicted_peak_bytes),
            mib(r.measured_peak_bytes),
            100.0 * (r.measured_peak_bytes as f64 - r.predicted_peak_bytes as f64)
                / r.predicted_peak_bytes as f64,
            r.step_seconds
        );
    }
    let best = rows
        .iter()
        .filter(|r| r.schedule.starts_with("segments = ") && !r.schedule.ends_with("auto"))
        .min_by_key(|r| r.measured_peak_bytes)
        .context("the sweep")?;
    let auto = rows
        .iter()
        .find(|r| r.schedule == "segments = auto")
        .context("the auto row")?;
    let plain = &rows[0];
    println!(
        "\nplain: {:.2} MiB; best hand-chosen: {} at {:.2} MiB; auto: {:.2} MiB ({:+.1} % vs the best, {:.1} % of plain), cuts {:?}",
        mib(plain.measured_peak_bytes),
        best.schedule,
        mib(best.measured_peak_bytes),
        mib(auto.measured_peak_bytes),
        100.0 * (auto.measured_peak_bytes as f64 - best.measured_peak_bytes as f64)
            / best.measured_peak_bytes as f64,
        100.0 * auto.measured_peak_bytes as f64 / plain.measured_peak_bytes as f64,
        auto.cuts,
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    ensure!(
        auto.measured_peak_bytes <= best.measured_peak_bytes,
        "segments = auto ({} B) is above the best hand-chosen {} ({} B)",
        auto.measured_peak_bytes,
        best.schedule,
        best.measured_peak_bytes
    );
    Ok(())
}
