//! `ckpt-bench`: `ckpt` against PyTorch on the same libtorch, memory scaling, and the
//! per-segment overhead, in one run. `bench/run.sh` (`./x.sh bench`) builds it and the
//! meter library and passes the paths; it writes `results.json`, `README.md` and PNG
//! plots into `--out`.
//!
//! Method (the same on both sides; `torch_side.py` is the PyTorch side):
//! - same libtorch 2.13.0 build (the PyPI wheel: tch links its libraries, Python imports
//!   them), same thread count, same model, batch and optimizer (AdamW; gradients zeroed
//!   in place, `zero_grad(set_to_none=False)` in PyTorch, as tch does);
//! - a step is zero-grad + forward + backward + optimizer step; warm-up steps first (they
//!   allocate optimizer state and `.grad`), then the median of the measured steps;
//! - peak tensor bytes of a step above the bytes live before it, from the same counting
//!   CPU allocator (`ckpt::memory`; the PyTorch process loads it from
//!   `libckpt_bench.so`), so the figures are exact and comparable to the byte.

mod report;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use ckpt_bench::measure::{self, Measured};
use ckpt_bench::models::{self, classifier};
use ckpt_bench::util;
use clap::Parser;
use report::Report;
use serde::Serialize;
use serde_json::{Value, json};
use tch::nn::{self, Module, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// Runs every benchmark and writes the results.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Fewer steps and smaller scaling chains: a smoke run of about two minutes.
    #[arg(long)]
    quick: bool,
    /// Directory for results.json, README.md and the PNG plots.
    #[arg(long, default_value = "bench")]
    out: PathBuf,
    /// The PyTorch side's script.
    #[arg(long, default_value = "bench/torch_side.py")]
    script: PathBuf,
    /// What both programs take: threads, the PyTorch side, the report's header.
    #[command(flatten)]
    common: util::CommonArgs,
}

/// One side-by-side configuration.
#[derive(Debug, Clone, Serialize)]
struct Config {
    name: &'static str,
    /// `"mlp"` or `"encoder"`.
    model: &'static str,
    segments: usize,
    batch: i64,
    /// MLP: blocks, width, hidden width.
    layers: usize,
    d: i64,
    hidden: i64,
    /// Encoder: sequence length.
    seq: i64,
    warmup: usize,
    steps: usize,
}

/// Both variants of one side.
#[derive(Debug, Clone, Serialize)]
struct SideResult {
    plain: Measured,
    checkpointed: Measured,
}

fn configs(quick: bool) -> Vec<Config> {
    let (warmup, steps) = if quick { (1, 3) } else { (2, 9) };
    let mlp = Config {
        name: "mlp16",
        model: "mlp",
        segments: 4,
        batch: 256,
        layers: 16,
        d: 256,
        hidden: 1024,
        seq: 0,
        warmup,
        steps,
    };
    let encoder = |seq: i64, batch: i64, segments: usize| Config {
        name: if seq == 256 {
            "encoder-seq256-batch16"
        } else {
            "encoder-seq512-batch8"
        },
        model: "encoder",
        segments,
        batch,
        layers: 6,
        d: 256,
        hidden: 1024,
        seq,
        warmup,
        steps: if quick { 2 } else { 5 },
    };
    vec![mlp, encoder(256, 16, 3), encoder(512, 8, 3)]
}

fn adamw(vs: &nn::VarStore) -> Result<nn::Optimizer> {
    Ok(nn::AdamW::default().build(vs, 1e-4)?)
}

/// The Rust side of one configuration: `ckpt`'s plain (tch) and checkpointed runs.
fn rust_side(cfg: &Config) -> Result<SideResult> {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    match cfg.model {
        "mlp" => {
            let blocks = models::residual_mlp(&vs.root(), cfg.layers, cfg.d, cfg.hidden);
            let x = Tensor::randn([cfg.batch, cfg.d], (Kind::Float, Device::Cpu));
            let run = |segments: usize| -> Result<Measured> {
                let mut opt = adamw(&vs)?;
                Ok(measure::steps(cfg.warmup, cfg.steps, || {
                    let y = if segments == 0 {
                        blocks.iter().fold(x.shallow_clone(), |h, b| b.forward(&h))
                    } else {
                        ckpt::checkpoint_sequential(&blocks, segments, &x)
                    };
                    opt.backward_step(&y.square().mean(Kind::Float));
                }))
            };
            Ok(SideResult {
                plain: run(0)?,
                checkpointed: run(cfg.segments)?,
            })
        }
        "encoder" => {
            let c = encoder_config(cfg);
            let mut model = classifier::Classifier::new(vs.root(), &c);
            let ids = Tensor::randint_low(
                1,
                c.vocab_size,
                [cfg.batch, cfg.seq],
                (Kind::Int64, Device::Cpu),
            );
            let labels = Tensor::randint(c.n_classes, [cfg.batch], (Kind::Int64, Device::Cpu));
            let mut run = |strategy: classifier::Strategy| -> Result<Measured> {
                strategy.apply(&mut model, c.layers)?;
                let mut opt = adamw(&vs)?;
                Ok(measure::steps(cfg.warmup, cfg.steps, || {
                    let loss = model
                        .forward_t(&ids, true)
                        .cross_entropy_for_logits(&labels);
                    opt.backward_step(&loss);
                }))
            };
            Ok(SideResult {
                plain: run(classifier::Strategy::Plain)?,
                checkpointed: run(classifier::Strategy::Checkpointed(cfg.segments))?,
            })
        }
        other => bail!("unknown model {other}"),
    }
}

fn encoder_config(cfg: &Config) -> classifier::ModelConfig {
    classifier::ModelConfig {
        vocab_size: 20,
        n_classes: 10,
        seq_len: cfg.seq,
        layers: cfg.layers,
        heads: 4,
        d_model: cfg.d,
        ff: cfg.hidden,
        dropout: 0.1,
    }
}

/// Runs `torch_side.py` with `request` and parses the JSON object it prints last.
fn python(args: &Args, request: &Value) -> Result<Value> {
    args.common.run_torch_side(&args.script, request)
}

fn measured(v: &Value) -> Result<Measured> {
    Ok(serde_json::from_value::<MeasuredJson>(v.clone())?.into())
}

/// `Measured` as `torch_side.py` prints it.
#[derive(Debug, serde::Deserialize)]
struct MeasuredJson {
    step_seconds_median: f64,
    step_seconds: Vec<f64>,
    peak_bytes: i64,
}

impl From<MeasuredJson> for Measured {
    fn from(m: MeasuredJson) -> Self {
        Measured {
            step_seconds_median: m.step_seconds_median,
            step_seconds: m.step_seconds,
            peak_bytes: m.peak_bytes,
        }
    }
}

/// One chain length and schedule of the scaling study.
#[derive(Debug, Clone, Serialize)]
struct ScalingRun {
    layers: usize,
    schedule: &'static str,
    segments: usize,
    peak_bytes: i64,
    step_seconds: f64,
}

/// Residual MLP chains of `layers` blocks ([128, 256] activations, hidden 512), forward +
/// backward, plain and with `round(sqrt(L))` and `L` segments.
fn scaling(lengths: &[usize], steps: usize) -> Vec<ScalingRun> {
    let mut runs = Vec::new();
    for &layers in lengths {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let blocks = models::residual_mlp(&vs.root(), layers, 256, 512);
        let x = Tensor::randn([128, 256], (Kind::Float, Device::Cpu));
        let sqrt = ((layers as f64).sqrt().round() as usize).max(1);
        for (schedule, segments) in [("plain", 0), ("sqrt", sqrt), ("per-layer", layers)] {
            let m = measure::steps(1, steps, || {
                for v in vs.trainable_variables() {
                    let mut g = v.grad();
                    if g.defined() {
                        let _ = g.zero_();
                    }
                }
                let y = if segments == 0 {
                    blocks.iter().fold(x.shallow_clone(), |h, b| b.forward(&h))
                } else {
                    ckpt::checkpoint_sequential(&blocks, segments, &x)
                };
                y.square().mean(Kind::Float).backward();
            });
            eprintln!(
                "  L = {layers:3} {schedule:9} peak {:>12} B  {:.4} s",
                m.peak_bytes, m.step_seconds_median
            );
            runs.push(ScalingRun {
                layers,
                schedule,
                segments,
                peak_bytes: m.peak_bytes,
                step_seconds: m.step_seconds_median,
            });
        }
    }
    runs
}

/// Per-call cost of a checkpointed segment on a 4-element tensor: forward + backward of
/// `x * 2 + 1`, checkpointed and not, in microseconds (medians over rounds).
fn overhead(rounds: usize, calls: usize) -> (f64, f64) {
    let x = Tensor::randn([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let time = |checkpointed: bool| {
        let per_call: Vec<f64> = (0..rounds)
            .map(|_| {
                let start = std::time::Instant::now();
                for _ in 0..calls {
                    let y = if checkpointed {
                        ckpt::checkpoint(|x: Tensor| x * 2.0 + 1.0, x.shallow_clone())
                    } else {
                        &x * 2.0 + 1.0
                    };
                    y.sum(Kind::Float).backward();
                }
                start.elapsed().as_secs_f64() * 1e6 / calls as f64
            })
            .collect();
        measure::median(&per_call)
    };
    let plain = time(false);
    (plain, time(true))
}

fn main() -> Result<()> {
    let args = Args::parse();
    tch::set_num_threads(args.common.threads);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;

    let mut configs_out = Vec::new();
    for cfg in configs(args.quick) {
        eprintln!("{}: ckpt (tch) ...", cfg.name);
        let ours = rust_side(&cfg)?;
        eprintln!("{}: PyTorch ...", cfg.name);
        let theirs = python(&args, &json!({"kind": "config", "config": cfg}))?;
        let theirs = SideResult {
            plain: measured(&theirs["plain"])?,
            checkpointed: measured(&theirs["checkpointed"])?,
        };
        eprintln!(
            "  ckpt {:.3} s {} B | torch {:.3} s {} B",
            ours.checkpointed.step_seconds_median,
            ours.checkpointed.peak_bytes,
            theirs.checkpointed.step_seconds_median,
            theirs.checkpointed.peak_bytes
        );
        configs_out.push((cfg, ours, theirs));
    }

    eprintln!("scaling ...");
    let lengths: &[usize] = if args.quick {
        &[8, 16, 32]
    } else {
        &[8, 16, 32, 64, 128]
    };
    let scaling = scaling(lengths, if args.quick { 2 } else { 3 });

    eprintln!("overhead ...");
    let (rounds, calls) = if args.quick { (5, 200) } else { (15, 1000) };
    let (plain_us, ckpt_us) = overhead(rounds, calls);
    let torch_overhead = python(
        &args,
        &json!({"kind": "overhead", "rounds": rounds, "calls": calls}),
    )?;

    let report = Report::new(
        &args,
        configs_out,
        scaling,
        (plain_us, ckpt_us),
        torch_overhead,
    );
    report.write(&args.out)?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
