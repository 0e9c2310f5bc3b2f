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

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};
use ckpt_bench::measure::{self, Measured};
use ckpt_bench::models::{self, classifier};
use ckpt_bench::util::{self, font};
use clap::Parser;
use plotters::prelude::*;
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
    /// Intra-op threads on both sides.
    #[arg(long, default_value_t = 2)]
    threads: i32,
    /// A Python with PyTorch 2.13.0 (the venv that `./x.sh` sets up).
    #[arg(long)]
    python: PathBuf,
    /// `libckpt_bench.so`, which the PyTorch side loads to count tensor bytes.
    #[arg(long)]
    meter: PathBuf,
    /// The PyTorch side's script.
    #[arg(long, default_value = "bench/torch_side.py")]
    script: PathBuf,
    /// Machine description for the report.
    #[arg(long, default_value = "unknown machine")]
    machine: String,
    /// Date for the report.
    #[arg(long, default_value = "unknown date")]
    date: String,
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
    util::last_json_line(
        Command::new(&args.python)
            .arg(&args.script)
            .arg("--meter")
            .arg(&args.meter)
            .arg("--threads")
            .arg(args.threads.to_string())
            .arg("--request")
            .arg(request.to_string()),
    )
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
    tch::set_num_threads(args.threads);
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

/// Everything one run measured, and the files made from it.
struct Report {
    machine: String,
    date: String,
    threads: i32,
    quick: bool,
    configs: Vec<(Config, SideResult, SideResult)>,
    scaling: Vec<ScalingRun>,
    exponents: Vec<(&'static str, f64)>,
    overhead_us: (f64, f64),
    torch_overhead_us: (f64, f64),
}

impl Report {
    fn new(
        args: &Args,
        configs: Vec<(Config, SideResult, SideResult)>,
        scaling: Vec<ScalingRun>,
        overhead_us: (f64, f64),
        torch_overhead: Value,
    ) -> Self {
        let exponents = ["plain", "sqrt", "per-layer"]
            .into_iter()
            .map(|s| {
                let runs: Vec<&ScalingRun> = scaling.iter().filter(|r| r.schedule == s).collect();
                let xs: Vec<f64> = runs.iter().map(|r| r.layers as f64).collect();
                let ys: Vec<f64> = runs.iter().map(|r| r.peak_bytes as f64).collect();
                (s, measure::fitted_exponent(&xs, &ys))
            })
            .collect();
        Report {
            machine: args.machine.clone(),
            date: args.date.clone(),
            threads: args.threads,
            quick: args.quick,
            configs,
            scaling,
            exponents,
            overhead_us,
            torch_overhead_us: (
                torch_overhead["plain_us"].as_f64().unwrap_or(f64::NAN),
                torch_overhead["checkpointed_us"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            ),
        }
    }

    fn exponent(&self, schedule: &str) -> f64 {
        self.exponents
            .iter()
            .find(|(s, _)| *s == schedule)
            .map_or(f64::NAN, |e| e.1)
    }

    fn json(&self) -> Value {
        let configs: Vec<Value> = self
            .configs
            .iter()
            .map(|(c, ours, theirs)| {
                json!({
                    "name": c.name,
                    "config": c,
                    "ckpt_step_seconds": ours.checkpointed.step_seconds_median,
                    "torch_step_seconds": theirs.checkpointed.step_seconds_median,
                    "ckpt_peak_bytes": ours.checkpointed.peak_bytes,
                    "torch_peak_bytes": theirs.checkpointed.peak_bytes,
                    "ckpt_plain_step_seconds": ours.plain.step_seconds_median,
                    "ckpt_plain_peak_bytes": ours.plain.peak_bytes,
                    "torch_plain_step_seconds": theirs.plain.step_seconds_median,
                    "torch_plain_peak_bytes": theirs.plain.peak_bytes,
                    "step_ratio_ckpt_over_torch": ours.checkpointed.step_seconds_median / theirs.checkpointed.step_seconds_median,
                    "peak_ratio_ckpt_over_torch": ours.checkpointed.peak_bytes as f64 / theirs.checkpointed.peak_bytes as f64,
                    "ckpt_overhead_ratio": ours.checkpointed.step_seconds_median / ours.plain.step_seconds_median,
                    "ckpt": ours,
                    "torch": theirs,
                })
            })
            .collect();
        json!({
            "machine": self.machine,
            "date": self.date,
            "threads": self.threads,
            "libtorch": "2.13.0",
            "quick": self.quick,
            "configs": configs,
            "scaling": {
                "L": self.scaling.iter().filter(|r| r.schedule == "plain").map(|r| r.layers).collect::<Vec<_>>(),
                "exponent_plain": self.exponent("plain"),
                "exponent_sqrt": self.exponent("sqrt"),
                "exponent_per_layer": self.exponent("per-layer"),
                "runs": self.scaling,
            },
            "segment_overhead_us": self.overhead_us.1 - self.overhead_us.0,
            "segment_overhead": {
                "ckpt_plain_us": self.overhead_us.0,
                "ckpt_checkpointed_us": self.overhead_us.1,
                "torch_plain_us": self.torch_overhead_us.0,
                "torch_checkpointed_us": self.torch_overhead_us.1,
                "torch_overhead_us": self.torch_overhead_us.1 - self.torch_overhead_us.0,
            },
        })
    }

    fn markdown_tables(&self) -> String {
        let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
        let mut s = String::new();
        s += "| config | segments | PyTorch plain | PyTorch checkpointed | ckpt plain (tch) | ckpt checkpointed | time ckpt / PyTorch | peak ckpt / PyTorch |\n";
        s += "|---|---|---|---|---|---|---|---|\n";
        for (c, ours, theirs) in &self.configs {
            let cell = |m: &Measured| {
                format!(
                    "{:.3} s, {:.1} MiB",
                    m.step_seconds_median,
                    mib(m.peak_bytes)
                )
            };
            s += &format!(
                "| {} | {} | {} | {} | {} | {} | {:.3} | {:.4} |\n",
                c.name,
                c.segments,
                cell(&theirs.plain),
                cell(&theirs.checkpointed),
                cell(&ours.plain),
                cell(&ours.checkpointed),
                ours.checkpointed.step_seconds_median / theirs.checkpointed.step_seconds_median,
                ours.checkpointed.peak_bytes as f64 / theirs.checkpointed.peak_bytes as f64,
            );
        }
        s +=
            "\nScaling (residual MLP, [128, 256] activations, hidden 512; forward + backward):\n\n";
        s += "| L | plain | sqrt(L) segments | one segment per layer |\n|---|---|---|---|\n";
        let lengths: Vec<usize> = self
            .scaling
            .iter()
            .filter(|r| r.schedule == "plain")
            .map(|r| r.layers)
            .collect();
        for l in lengths {
            let cell = |schedule: &str| {
                self.scaling
                    .iter()
                    .find(|r| r.layers == l && r.schedule == schedule)
                    .map_or(String::new(), |r| {
                        format!("{:.2} MiB, {:.3} s", mib(r.peak_bytes), r.step_seconds)
                    })
            };
            let sqrt_segments = self
                .scaling
                .iter()
                .find(|r| r.layers == l && r.schedule == "sqrt")
                .map_or(0, |r| r.segments);
            s += &format!(
                "| {l} | {} | {} ({sqrt_segments}) | {} |\n",
                cell("plain"),
                cell("sqrt"),
                cell("per-layer")
            );
        }
        s += &format!(
            "\nFitted exponent of peak bytes against L: plain {:.3}, sqrt(L) segments {:.3}, one per layer {:.3}.\n",
            self.exponent("plain"),
            self.exponent("sqrt"),
            self.exponent("per-layer")
        );
        s += &format!(
            "\nPer-call cost of a segment on a 4-element tensor (forward + backward): ckpt {:.1} µs checkpointed vs {:.1} µs plain (+{:.1} µs); PyTorch `checkpoint(use_reentrant=False)` {:.1} µs vs {:.1} µs (+{:.1} µs).\n",
            self.overhead_us.1,
            self.overhead_us.0,
            self.overhead_us.1 - self.overhead_us.0,
            self.torch_overhead_us.1,
            self.torch_overhead_us.0,
            self.torch_overhead_us.1 - self.torch_overhead_us.0,
        );
        s
    }

    fn targets(&self) -> String {
        let worst_time = self
            .configs
            .iter()
            .map(|(_, o, t)| {
                o.checkpointed.step_seconds_median / t.checkpointed.step_seconds_median
            })
            .fold(0.0, f64::max);
        let worst_peak = self
            .configs
            .iter()
            .map(|(_, o, t)| o.checkpointed.peak_bytes as f64 / t.checkpointed.peak_bytes as f64)
            .fold(0.0, f64::max);
        let mlp_overhead = self
            .configs
            .iter()
            .find(|(c, _, _)| c.model == "mlp")
            .map_or(f64::NAN, |(_, o, _)| {
                o.checkpointed.step_seconds_median / o.plain.step_seconds_median
            });
        let mark = |ok: bool| if ok { "met" } else { "**not met**" };
        format!(
            "| target | measured | |\n|---|---|---|\n\
             | checkpointed step time ckpt / PyTorch <= 1.0 on every config | worst {worst_time:.3} | {} |\n\
             | peak bytes ckpt / PyTorch <= 1.02 on every config | worst {worst_peak:.4} | {} |\n\
             | sqrt(L) schedule exponent <= 0.6 | {:.3} | {} |\n\
             | checkpointed / plain time <= 1.35 on the MLP chain | {mlp_overhead:.3} | {} |\n",
            mark(worst_time <= 1.0),
            mark(worst_peak <= 1.02),
            self.exponent("sqrt"),
            mark(self.exponent("sqrt") <= 0.6),
            mark(mlp_overhead <= 1.35),
        )
    }

    fn write(&self, out: &Path) -> Result<()> {
        let json_path = out.join("results.json");
        std::fs::write(
            &json_path,
            serde_json::to_string_pretty(&self.json())? + "\n",
        )
        .with_context(|| format!("cannot write {}", json_path.display()))?;
        self.plot_configs(&out.join("side_by_side.png"))?;
        self.plot_scaling(&out.join("scaling.png"))?;
        let md = format!(
            "<!-- generated by `./x.sh bench` (bench/src/main.rs); edit the generator, not this file -->\n\
             # Benchmarks: ckpt vs PyTorch on the same libtorch\n\n\
             Measured {date} on {machine}, {threads} threads, libtorch 2.13.0 (the PyPI wheel of \
             PyTorch 2.13.0 on both sides){quick}.\n\n\
             ```sh\n./x.sh bench            # about 2.5 minutes on 2 cores; ./x.sh bench --quick for a smoke run\n```\n\n\
             ## Targets\n\n{targets}\n\
             ## Results\n\n\
             Median step time and peak tensor memory of a training step above the bytes live \
             before it (AdamW; the step is zero-grad, forward, backward, optimizer step).\n\n\
             {tables}\n\
             ![step time and peak memory per configuration](side_by_side.png)\n\n\
             ![peak memory against chain length](scaling.png)\n\n\
             ## Method\n\n\
             - **Same libraries.** `ckpt` links the libtorch of the PyTorch 2.13.0 wheel that \
             `./x.sh` installs; the PyTorch side (`bench/torch_side.py`) runs in that wheel's venv. \
             Both use {threads} intra-op threads.\n\
             - **Same models.** `mlp16`: 16 residual blocks `x + W2 gelu(W1 x)`, width 256, hidden \
             1024, batch 256, loss `mean(y^2)`, 4 segments, PyTorch's `checkpoint_sequential(.., \
             use_reentrant=False)` against `ckpt::checkpoint_sequential`. `encoder-*`: the main \
             program's transformer encoder classifier (`ckpt-models/src/classifier.rs`, \
             declared with `ckpt::model!`: 6 pre-LN blocks, 4 heads, d_model 256, feed-forward \
             1024, dropout 0.1, learned positions, mean pooling, linear head), cross-entropy, \
             3 segments over the blocks (two blocks a segment, the last segment plain); the \
             PyTorch side (`torch_side.py`) builds the same stages and cuts them at the same \
             places, each checkpointed segment through `checkpoint(.., use_reentrant=False)`.\n\
             - **Same measurement.** Steps after warm-up (optimizer state and `.grad` allocated), \
             median time. Peak bytes come from one counter: `ckpt`'s counting wrapper around \
             libtorch's CPU allocator. The PyTorch process loads it from `libckpt_bench.so` \
             (`ctypes`), which installs it into the same libtorch; so both columns count the same \
             allocations in the same way, exactly.\n\
             - **Scaling** runs forward + backward only (no optimizer), `ckpt` alone, and fits \
             `peak ≈ c·L^a` by least squares on log-log.\n\
             - Time figures are noisy on a shared 2-core machine (each is a median of one \
             sequential pass); byte figures repeat exactly. **A time ratio is a claim only when \
             its spread supports it**: re-run on a quiet machine, the ckpt / PyTorch ratios of \
             this pass read 1.19 (seq 256) and 0.85 (seq 512). The frontier benchmark below \
             alternates the sides in rounds and reports spreads; read its verdicts, not this \
             table's ratios.\n\
             - **Frontier.** `bench/frontier.sh` measures plain, full recompute (3 and 6 \
             segments), selective checkpointing (the same policy on both sides: PyTorch's \
             `create_selective_checkpoint_contexts`) and ckpt's planner at 30/50/70 % budgets \
             on the seed transformer at seq 256 and 1024, in interleaved rounds: \
             [FRONTIER.md](FRONTIER.md), `frontier.png`.\n\
             - **Data-parallel.** `bench/ddp_encoder.sh` compares `ckpt::dist`'s DDP with \
             PyTorch's on the encoder (2 processes x 1 thread, Gloo): [DDP.md](DDP.md).\n",
            date = self.date,
            machine = self.machine,
            threads = self.threads,
            quick = if self.quick {
                " — a --quick run (fewer steps, chains up to 32)"
            } else {
                ""
            },
            targets = self.targets(),
            tables = self.markdown_tables(),
        );
        let md_path = out.join("README.md");
        std::fs::write(&md_path, md)
            .with_context(|| format!("cannot write {}", md_path.display()))?;
        Ok(())
    }

    fn plot_configs(&self, path: &Path) -> Result<()> {
        font()?;
        let draw = |e: &dyn std::fmt::Display| anyhow!("{}: drawing failed: {e}", path.display());
        let root = BitMapBackend::new(path, (1200, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(&e))?;
        let (left, right) = root.split_horizontally(600);
        let series = ["PyTorch plain", "PyTorch ckpt", "ckpt plain", "ckpt ckpt"];
        let colors = [
            RGBColor(240, 160, 80),
            RGBColor(200, 90, 20),
            RGBColor(120, 170, 230),
            RGBColor(30, 90, 180),
        ];
        let values = |f: &dyn Fn(&Measured) -> f64| -> Vec<[f64; 4]> {
            self.configs
                .iter()
                .map(|(_, o, t)| {
                    [
                        f(&t.plain),
                        f(&t.checkpointed),
                        f(&o.plain),
                        f(&o.checkpointed),
                    ]
                })
                .collect()
        };
        let panels = [
            (
                &left,
                "median step time (s)",
                values(&|m| m.step_seconds_median),
            ),
            (
                &right,
                "peak tensor memory (MiB)",
                values(&|m| m.peak_bytes as f64 / 1048576.0),
            ),
        ];
        for (area, title, vals) in panels {
            let n = self.configs.len();
            let y_max = vals
                .iter()
                .flat_map(|v| v.iter())
                .fold(0.0f64, |a, b| a.max(*b))
                * 1.15;
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 20))
                .margin(16)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..n as f64, 0.0..y_max)
                .map_err(|e| draw(&e))?;
            let names: Vec<&str> = self.configs.iter().map(|(c, _, _)| c.name).collect();
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(n * 2 + 1)
                .x_label_formatter(&|x| {
                    let i = x.floor() as usize;
                    if (x - i as f64 - 0.5).abs() < 0.26 && i < names.len() {
                        names[i].to_owned()
                    } else {
                        String::new()
                    }
                })
                .y_label_formatter(&|y| format!("{y:.1}"))
                .label_style(("sans-serif", 13))
                .draw()
                .map_err(|e| draw(&e))?;
            for (k, (name, color)) in series.iter().zip(colors).enumerate() {
                let bars = vals.iter().enumerate().map(|(i, v)| {
                    let x0 = i as f64 + 0.1 + 0.2 * k as f64;
                    Rectangle::new([(x0, 0.0), (x0 + 0.18, v[k])], color.filled())
                });
                chart
                    .draw_series(bars)
                    .map_err(|e| draw(&e))?
                    .label(*name)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| draw(&e))?;
        }
        root.present().map_err(|e| draw(&e))?;
        Ok(())
    }

    fn plot_scaling(&self, path: &Path) -> Result<()> {
        font()?;
        let draw = |e: &dyn std::fmt::Display| anyhow!("{}: drawing failed: {e}", path.display());
        let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(&e))?;
        let mib = |b: i64| b as f64 / 1048576.0;
        let x_max = self.scaling.iter().map(|r| r.layers).max().unwrap_or(1) as f64;
        let y_min = self
            .scaling
            .iter()
            .map(|r| mib(r.peak_bytes))
            .fold(f64::INFINITY, f64::min);
        let y_max = self
            .scaling
            .iter()
            .map(|r| mib(r.peak_bytes))
            .fold(0.0, f64::max);
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "peak tensor memory of forward + backward vs chain length",
                ("sans-serif", 20),
            )
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (6.0..x_max * 1.3).log_scale(),
                (y_min * 0.7..y_max * 1.5).log_scale(),
            )
            .map_err(|e| draw(&e))?;
        chart
            .configure_mesh()
            .x_desc("residual blocks L")
            .y_desc("peak MiB (log)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .draw()
            .map_err(|e| draw(&e))?;
        let styles = [
            ("plain", RGBColor(200, 60, 40)),
            ("sqrt", RGBColor(30, 90, 180)),
            ("per-layer", RGBColor(60, 150, 60)),
        ];
        for (schedule, color) in styles {
            let pts: Vec<(f64, f64)> = self
                .scaling
                .iter()
                .filter(|r| r.schedule == schedule)
                .map(|r| (r.layers as f64, mib(r.peak_bytes)))
                .collect();
            let label = match schedule {
                "plain" => format!("plain: exponent {:.2}", self.exponent(schedule)),
                "sqrt" => format!(
                    "round(sqrt(L)) segments: exponent {:.2}",
                    self.exponent(schedule)
                ),
                _ => format!(
                    "one segment per layer: exponent {:.2}",
                    self.exponent(schedule)
                ),
            };
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| draw(&e))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))
                .map_err(|e| draw(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| draw(&e))?;
        root.present().map_err(|e| draw(&e))?;
        Ok(())
    }
}
