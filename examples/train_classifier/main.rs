//! Train a transformer encoder classifier with and without activation checkpointing and
//! compare peak memory, time and numbers: `ckpt`'s main program.
//!
//! ```text
//! cargo run --release --example train_classifier              # ListOps, plain vs 3 segments
//! cargo run --release --example train_classifier -- --quick   # the same, 4 steps (< 90 s on 2 cores)
//! cargo run --release --example train_classifier -- --sweep --quick     # segments 1..=layers, PNG + CSV
//! cargo run --release --example train_classifier -- --data aclImdb      # IMDB-layout corpus
//! cargo run --release --example train_classifier -- --device cuda --json out.json
//! cargo run --release --example train_classifier -- --nproc 2  # data-parallel, 2 processes
//! torchrun --no-python --nproc-per-node 2 target/release/examples/train_classifier
//! ```
//!
//! Both runs start from the same seed: same weights, same batches, same dropout masks
//! (the checkpointed segments replay dropout with the saved RNG state), so on CPU with
//! the same thread count their gradients and losses are bit-identical and the table
//! shows only what checkpointing changes: peak tensor memory (exact bytes from
//! `ckpt::memory`) and time. The runs take turns step by step (`--sequential` to train
//! one after the other), so load from other processes slows both alike.
//!
//! Data-parallel (`--nproc N`, or under torchrun): every run trains on N processes
//! (Gloo on CPU, `ckpt::dist::DistributedDataParallel`), each rank on its
//! `DistributedSampler` share of every global batch of `--batch-size` rows; rank 0 then
//! trains each run again as one process on the same global batches and reports the
//! largest parameter difference, beside each rank's peak memory, step time and samples
//! per second.
//!
//! Modules: [`listops`] and [`text`] make the data, [`model`] the network, [`train`] the
//! runs and measurements, [`report`] the outputs.

mod data;
mod listops;
mod model;
mod report;
mod text;
mod train;

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{Context, Result, ensure};
use clap::{Parser, ValueEnum};
use indicatif::{MultiProgress, ProgressDrawTarget};
use tch::Device;

use crate::listops::ListOpsConfig;
use crate::model::{ModelConfig, Strategy};
use crate::report::{ConfigJson, Report, RunJson};
use crate::text::VocabConfig;
use crate::train::{RunSpec, Schedule, Sharding, TrainConfig};

// The data's padding id is the model's.
const _: () = assert!(data::PAD == model::PAD);

/// Which runs to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Plain, then checkpointed, from the same seed, and compare.
    Both,
    /// Only the plain run.
    Plain,
    /// Only the checkpointed run.
    Checkpointed,
}

/// `--policy`: what the checkpointed runs keep from each segment's forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PolicyArg {
    /// Keep only each segment's input; recompute everything (PyTorch's `checkpoint`).
    Full,
    /// Also keep every Linear output and dropout mask; recompute the attention core,
    /// norms and activations (`ckpt::Policy::selective`).
    Selective,
    /// Keep the dropout masks (1 bit an element) instead of drawing them again;
    /// recompute the rest.
    Masks,
}

impl PolicyArg {
    fn policy(self) -> ckpt::Policy {
        match self {
            PolicyArg::Full => ckpt::Policy::RECOMPUTE_ALL,
            PolicyArg::Selective => ckpt::Policy::selective(),
            PolicyArg::Masks => ckpt::Policy::RECOMPUTE_ALL.save_dropout_masks(true),
        }
    }
}

/// `--device`: `cpu`, `cuda`, `cuda:N` or `auto` (CUDA device 0 when available).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceArg {
    Cpu,
    Cuda(usize),
    Auto,
}

impl FromStr for DeviceArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceArg::Cpu),
            "cuda" => Ok(DeviceArg::Cuda(0)),
            "auto" => Ok(DeviceArg::Auto),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|i| i.parse().ok())
                .map(DeviceArg::Cuda)
                .ok_or_else(|| format!("`{s}`: expected cpu, cuda, cuda:N or auto")),
        }
    }
}

/// `--segments`: a count, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SegmentsArg {
    Count(usize),
    Auto,
}

impl FromStr for SegmentsArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(SegmentsArg::Auto),
            _ => s
                .parse()
                .map(SegmentsArg::Count)
                .map_err(|_| format!("`{s}`: expected a number of segments or `auto`")),
        }
    }
}

impl DeviceArg {
    fn resolve(self) -> Result<Device> {
        match self {
            DeviceArg::Cpu => Ok(Device::Cpu),
            DeviceArg::Auto => Ok(if tch::Cuda::is_available() {
                Device::Cuda(0)
            } else {
                Device::Cpu
            }),
            DeviceArg::Cuda(i) => {
                let count = if tch::Cuda::is_available() {
                    tch::Cuda::device_count() as usize
                } else {
                    0
                };
                ensure!(
                    i < count,
                    "--device cuda:{i}: CUDA is not available here ({count} CUDA device(s) \
                     visible to libtorch; a CPU-only libtorch sees none)"
                );
                Ok(Device::Cuda(i))
            }
        }
    }
}

fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_owned(),
    }
}

/// Train a transformer encoder classifier (declared with ckpt::model!) plain and with
/// activation checkpointing, and compare peak tensor memory, step time, accuracy and
/// gradients.
///
/// Data: ListOps generated from --seed (default), or a folder-per-class text corpus in
/// the aclImdb layout (--data DIR). Defaults: 6 layers, 4 heads, d_model 256, ff 1024,
/// seq 256, batch 16, 384 training examples (24 steps) a run, about 1.5 minutes on 2
/// CPU cores. --quick: the same model and shapes (so the same peak memory), 4 steps.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Which runs to make.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    mode: Mode,
    /// Segments over the blocks, as checkpoint_sequential cuts them; the last one is not
    /// checkpointed, so 3 segments over 6 blocks checkpoint blocks 0-1 and 2-3. `auto`:
    /// the cuts ckpt's planner chooses for the least peak memory (from a profile of the
    /// model's stages on the first batch).
    #[arg(long, default_value = "3")]
    segments: SegmentsArg,
    /// What each checkpointed segment keeps from its forward: `full` keeps only its
    /// input; `selective` also keeps Linear outputs and dropout masks, `masks` only the
    /// dropout masks (more memory, less recompute; gradients unchanged). Repeat it
    /// (`--policy full --policy selective`) to train one checkpointed run per policy,
    /// all taking turns with the plain run.
    #[arg(long, value_enum, default_values_t = [PolicyArg::Full])]
    policy: Vec<PolicyArg>,
    /// Print the plan `--segments auto` makes for the first training batch, before
    /// training: first with each checkpointed segment's policy chosen by the planner,
    /// then for each --policy (a fixed policy, as the auto run uses it); per segment
    /// the policy and what each policy would keep and save, per stage what is kept and
    /// recomputed, bytes and seconds (`ckpt::plan::Plan::explain`).
    #[arg(long)]
    explain: bool,
    /// Train the runs one after the other instead of taking turns step by step
    /// (interleaving keeps the time comparison fair when other processes load the
    /// machine; the numbers are the same either way).
    #[arg(long)]
    sequential: bool,
    /// Run segments = 1 (plain) ..= layers and write sweep.png and sweep.csv into
    /// --out-dir (memory against time); combine with --quick for a fast curve.
    #[arg(long, conflicts_with_all = ["mode", "segments"])]
    sweep: bool,
    /// Folder for the sweep's PNG and CSV.
    #[arg(long, value_name = "DIR", default_value = "target/train_classifier")]
    out_dir: PathBuf,
    /// Short preset that finishes in under 90 s on a 2-core CPU: the default shapes
    /// (so the same peak memory), 64 training examples (4 steps) and 32 test examples;
    /// explicit flags still win.
    #[arg(long)]
    quick: bool,
    /// Folder-per-class text corpus in the aclImdb layout (DIR/train/<class>/*.txt,
    /// DIR/test/<class>/*.txt) instead of ListOps.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// cpu, cuda, cuda:N or auto (CUDA when available).
    #[arg(long, default_value = "auto")]
    device: DeviceArg,
    /// libtorch intra-op threads (default: libtorch's choice, one per core).
    #[arg(long)]
    threads: Option<i32>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Train data-parallel on N processes of this machine (127.0.0.1; Gloo on CPU, NCCL
    /// on CUDA with the `nccl` feature, rank i on cuda:i), each on its share of every
    /// global batch of --batch-size rows; rank 0 also trains one process on the same
    /// global batches and reports the largest parameter difference. Under torchrun
    /// (`RANK` set) every process is a rank whatever N.
    #[arg(long, default_value_t = 1)]
    nproc: usize,
    /// Data-parallel runs: skip rank 0's single-process reference (no parameter
    /// difference then), for timing only.
    #[arg(long)]
    skip_reference: bool,

    /// Encoder blocks.
    #[arg(long, default_value_t = 6, help_heading = "Model")]
    layers: usize,
    /// Attention heads (d_model must be a multiple).
    #[arg(long, default_value_t = 4, help_heading = "Model")]
    heads: i64,
    /// Width of the residual stream.
    #[arg(long, default_value_t = 256, help_heading = "Model")]
    d_model: i64,
    /// Width of the feed-forward layer.
    #[arg(long, default_value_t = 1024, help_heading = "Model")]
    ff: i64,
    /// Dropout probability.
    #[arg(long, default_value_t = 0.1, help_heading = "Model")]
    dropout: f64,

    /// Tokens a row, padded or truncated [default: 256].
    #[arg(long, help_heading = "Training")]
    seq_len: Option<usize>,
    /// Rows a step [default: 16].
    #[arg(long, help_heading = "Training")]
    batch_size: Option<usize>,
    /// Training examples (steps an epoch = train-size / batch-size, the last partial
    /// batch dropped) [default: 384; --quick: 64].
    #[arg(long, help_heading = "Training")]
    train_size: Option<usize>,
    /// Test examples [default: 256; --quick: 32].
    #[arg(long, help_heading = "Training")]
    test_size: Option<usize>,
    /// Passes over the training examples [default: 1].
    #[arg(long, help_heading = "Training")]
    epochs: Option<usize>,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 3e-4, help_heading = "Training")]
    lr: f64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.01, help_heading = "Training")]
    weight_decay: f64,
    /// Steps of linear learning-rate warm-up [default: an eighth of the steps].
    #[arg(long, help_heading = "Training")]
    warmup_steps: Option<usize>,
    /// Seed of the weights, dropout, batch order and ListOps data.
    #[arg(long, default_value_t = 0, help_heading = "Training")]
    seed: u64,

    /// ListOps: depth at which nodes are always digits (the root is depth 1).
    #[arg(long, default_value_t = 10, help_heading = "ListOps")]
    listops_max_depth: usize,
    /// ListOps: most arguments of an operator.
    #[arg(long, default_value_t = 10, help_heading = "ListOps")]
    listops_max_args: usize,
    /// ListOps: expressions are longer than this, in tokens [default: seq-len / 4].
    #[arg(long, help_heading = "ListOps")]
    listops_min_length: Option<usize>,
    /// ListOps: expressions are shorter than this, in tokens [default: seq-len + 1].
    #[arg(long, help_heading = "ListOps")]
    listops_max_length: Option<usize>,

    /// Text corpus: words seen fewer times in the training split become <unk>.
    #[arg(long, default_value_t = 2, help_heading = "Text corpus (--data)")]
    min_freq: usize,
    /// Text corpus: largest vocabulary, <pad> and <unk> included.
    #[arg(long, default_value_t = 20_000, help_heading = "Text corpus (--data)")]
    max_vocab: usize,
}

/// The flags that `--quick` changes, resolved.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    seq_len: usize,
    batch_size: usize,
    train_size: usize,
    test_size: usize,
    epochs: usize,
}

impl Args {
    fn sizes(&self) -> Sizes {
        let (seq_len, batch_size, train_size, test_size) = if self.quick {
            (256, 16, 64, 32)
        } else {
            (256, 16, 384, 256)
        };
        Sizes {
            seq_len: self.seq_len.unwrap_or(seq_len),
            batch_size: self.batch_size.unwrap_or(batch_size),
            train_size: self.train_size.unwrap_or(train_size),
            test_size: self.test_size.unwrap_or(test_size),
            epochs: self.epochs.unwrap_or(1),
        }
    }

    fn check(&self, s: &Sizes) -> Result<()> {
        ensure!(self.layers >= 1, "--layers must be at least 1");
        ensure!(
            self.segments != SegmentsArg::Count(0),
            "--segments must be at least 1 (1 checkpoints nothing), or auto"
        );
        ensure!(
            self.heads >= 1 && self.d_model >= 1 && self.d_model % self.heads == 0,
            "--d-model {} must be a positive multiple of --heads {}",
            self.d_model,
            self.heads
        );
        ensure!(self.ff >= 1, "--ff must be at least 1");
        ensure!(
            (0.0..1.0).contains(&self.dropout),
            "--dropout must be in [0, 1)"
        );
        ensure!(s.seq_len >= 2, "--seq-len must be at least 2");
        ensure!(s.batch_size >= 1, "--batch-size must be at least 1");
        ensure!(
            s.train_size >= s.batch_size,
            "--train-size {} must be at least --batch-size {} (one step)",
            s.train_size,
            s.batch_size
        );
        ensure!(s.test_size >= 1, "--test-size must be at least 1");
        ensure!(s.epochs >= 1, "--epochs must be at least 1");
        if let Some(n) = self.threads {
            ensure!(n >= 1, "--threads must be at least 1");
        }
        Ok(())
    }
}

/// Joins the process group of a data-parallel run (the launcher's variables) and picks
/// the rank's device: CPU ranks reduce with Gloo; CUDA ranks (`--device cuda`, or `auto`
/// where NCCL can run) with NCCL, rank `LOCAL_RANK` on `cuda:LOCAL_RANK`, which needs
/// ckpt's `nccl` feature.
fn join_group(arg: DeviceArg) -> Result<(ckpt::dist::ProcessGroup, Device)> {
    use ckpt::dist::Backend;
    let mut opts = ckpt::dist::InitOptions::from_env()?;
    let cuda = match arg {
        DeviceArg::Cpu => false,
        DeviceArg::Auto => Backend::Nccl.is_available(),
        DeviceArg::Cuda(_) => true,
    };
    if cuda {
        opts.backend = Backend::Nccl;
    }
    let pg = ckpt::dist::f_init(&opts).context(if cuda {
        "joining the process group (NCCL: data-parallel runs on CUDA need ckpt's `nccl` \
         feature, `--features nccl`; --device cpu trains with Gloo)"
    } else {
        "joining the process group"
    })?;
    let device = if cuda {
        Device::Cuda(opts.local_rank)
    } else {
        Device::Cpu
    };
    Ok((pg, device))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let sizes = args.sizes();
    args.check(&sizes)?;
    ensure!(args.nproc >= 1, "--nproc must be at least 1");
    ensure!(
        sizes.batch_size.is_multiple_of(args.nproc),
        "--batch-size {} (the global batch) is not a multiple of --nproc {}",
        sizes.batch_size,
        args.nproc
    );
    if let Some(result) = ckpt::dist::relaunch_self_from_args(args.nproc)? {
        ensure!(
            result.success(),
            "a worker failed (exit status by rank: {:?})",
            result.status
        );
        return Ok(());
    }
    // A rank of a data-parallel run when a launcher (ours or torchrun) set RANK.
    let (pg, ddp_device) = match std::env::var_os("RANK") {
        Some(_) => {
            let (pg, device) = join_group(args.device)?;
            (Some(pg), Some(device))
        }
        None => (None, None),
    };
    let (rank, world) = pg.as_ref().map_or((0, 1), |p| (p.rank(), p.world_size()));
    let lead = rank == 0;
    if pg.is_some() {
        ensure!(
            !args.sweep,
            "--sweep runs in one process (no --nproc, no torchrun)"
        );
        ensure!(
            sizes.batch_size.is_multiple_of(world),
            "--batch-size {} (the global batch) is not a multiple of the {world} ranks",
            sizes.batch_size
        );
    }
    // Count every tensor allocation from here on (parameters and optimizer state too).
    ckpt::memory::enable();
    if let Some(n) = args.threads {
        tch::set_num_threads(n);
    }
    let device = match ddp_device {
        Some(d) => d,
        None => args.device.resolve()?,
    };

    let task = match &args.data {
        None => {
            let cfg = ListOpsConfig {
                max_depth: args.listops_max_depth,
                max_args: args.listops_max_args,
                min_length: args.listops_min_length.unwrap_or(sizes.seq_len / 4),
                max_length: args.listops_max_length.unwrap_or(sizes.seq_len + 1),
            };
            data::listops_task(
                &cfg,
                sizes.train_size,
                sizes.test_size,
                sizes.seq_len,
                args.seed,
            )?
        }
        Some(dir) => data::text_task(
            dir,
            &VocabConfig {
                min_freq: args.min_freq,
                max_size: args.max_vocab,
            },
            sizes.train_size,
            sizes.test_size,
            sizes.seq_len,
            args.seed,
        )?,
    };
    ensure!(
        task.train.len() >= sizes.batch_size,
        "{} training examples, fewer than --batch-size {}",
        task.train.len(),
        sizes.batch_size
    );

    let model_cfg = ModelConfig {
        vocab_size: task.vocab_size as i64,
        n_classes: task.classes.len() as i64,
        seq_len: sizes.seq_len as i64,
        layers: args.layers,
        heads: args.heads,
        d_model: args.d_model,
        ff: args.ff,
        dropout: args.dropout,
    };
    let steps = task.train.len() / sizes.batch_size * sizes.epochs;
    let train_cfg = TrainConfig {
        epochs: sizes.epochs,
        batch_size: sizes.batch_size,
        lr: args.lr,
        warmup: args.warmup_steps.unwrap_or(steps.div_ceil(8)),
        weight_decay: args.weight_decay,
        seed: args.seed,
        device,
    };

    if lead {
        println!("task:   {}", task.description);
        println!(
            "data:   {} train / {} test examples, {} classes, seq {} ({:.0}% real tokens), batch {}, \
             {} epoch(s) = {steps} steps a run",
            task.train.len(),
            task.test.len(),
            task.classes.len(),
            sizes.seq_len,
            task.train.fill() * 100.0,
            sizes.batch_size,
            sizes.epochs,
        );
        println!(
            "model:  {} layers, {} heads, d_model {}, ff {}, dropout {}, pre-LN, learned positions, \
             mean pooling; AdamW lr {} wd {}, {} warm-up steps",
            args.layers,
            args.heads,
            args.d_model,
            args.ff,
            args.dropout,
            args.lr,
            args.weight_decay,
            train_cfg.warmup
        );
        println!(
            "device: {} ({} threads), seed {}",
            device_name(device),
            tch::get_num_threads(),
            args.seed
        );
        if world > 1 {
            println!(
                "data-parallel: {world} processes (Gloo), {} rows a rank a step",
                sizes.batch_size / world
            );
        }
    }

    let policies: Vec<ckpt::Policy> = args.policy.iter().map(|p| p.policy()).collect();
    if args.explain && lead {
        explain_auto(&task.train, &model_cfg, &train_cfg, &policies)?;
    }
    ensure!(
        !args.sweep || policies.len() == 1,
        "--sweep takes one --policy"
    );
    let plan: Vec<RunSpec> = if args.sweep {
        (1..=args.layers)
            .map(|k| {
                (
                    format!("segments={k}"),
                    Strategy::Checkpointed(k),
                    policies[0],
                )
            })
            .collect()
    } else {
        let plain = (
            "plain".to_owned(),
            Strategy::Plain,
            ckpt::Policy::RECOMPUTE_ALL,
        );
        let (name, strategy) = match args.segments {
            // More segments than blocks means one block a segment (as
            // `ckpt::sequential_segments` clamps); the table shows the count used.
            SegmentsArg::Count(n) => (
                "checkpointed".to_owned(),
                Strategy::Checkpointed(n.min(args.layers)),
            ),
            // The planner's cuts (the table's segments column shows `-`).
            SegmentsArg::Auto => ("auto".to_owned(), Strategy::Auto),
        };
        let ckpt = policies.iter().map(|&p| (name.clone(), strategy, p));
        match args.mode {
            Mode::Both => std::iter::once(plain).chain(ckpt).collect(),
            Mode::Plain => vec![plain],
            Mode::Checkpointed => ckpt.collect(),
        }
    };

    let schedule = if args.sequential {
        Schedule::Sequential
    } else {
        Schedule::Interleaved
    };
    let bars = if lead {
        MultiProgress::new()
    } else {
        MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
    };
    let sharding = pg.as_ref().map_or(Sharding::Single, Sharding::Ddp);
    let mut runs = train::train(
        &plan, &task, &model_cfg, &train_cfg, schedule, &bars, sharding,
    )?;
    if !lead {
        return Ok(());
    }
    if pg.is_some() && !args.skip_reference {
        // The reference: one process on the same global batches, the same masks.
        let reference = train::train(
            &plan,
            &task,
            &model_cfg,
            &train_cfg,
            schedule,
            &bars,
            Sharding::Reference(world),
        )
        .context("the single-process reference")?;
        for (run, single) in runs.iter_mut().zip(&reference) {
            run.ddp_max_param_diff = Some(train::max_abs_diff(
                &run.final_params,
                &single.final_params,
            )?);
        }
    }

    println!();
    println!(
        "peak MiB: highest tensor memory of a training step (forward, backward, AdamW) above \
         the bytes live before it, from ckpt::memory (exact); step s: median wall time"
    );
    print!("{}", report::table(&runs));
    let ddp_diff = runs
        .iter()
        .filter_map(|r| r.ddp_max_param_diff)
        .reduce(f64::max);
    if pg.is_some() {
        println!();
        println!(
            "data-parallel, {world} ranks: peak MiB, step s and samples/s of each rank; \
             max param diff: largest |parameter difference| after training against one \
             process trained on the same global batches"
        );
        print!("{}", report::rank_table(&runs));
        if let Some(d) = ddp_diff {
            println!("largest |parameter difference| against one process: {d:e}");
        }
    }

    let (mut grad_diff, mut loss_diff) = (None, None);
    if runs.len() > 1 {
        let mut g = 0.0f64;
        let mut l = 0.0f64;
        for r in &runs[1..] {
            g = g.max(train::grad_max_abs_diff(&runs[0], r)?);
            l = l.max(train::loss_max_abs_diff(&runs[0], r));
        }
        let verdict = |x: f64| if x == 0.0 { " (bit-identical)" } else { "" };
        println!(
            "largest |gradient difference| after step 1, all parameters: {g:e}{}",
            verdict(g)
        );
        println!(
            "largest |loss difference| over {steps} steps: {l:e}{}",
            verdict(l)
        );
        grad_diff = Some(g);
        loss_diff = Some(l);
    }

    if args.sweep {
        std::fs::create_dir_all(&args.out_dir)
            .with_context(|| format!("{}: cannot create", args.out_dir.display()))?;
        let csv = args.out_dir.join("sweep.csv");
        let png = args.out_dir.join("sweep.png");
        report::write_csv(&csv, &runs)?;
        let title = format!(
            "checkpoint_sequential over {} blocks: seq {}, batch {}, {}",
            args.layers,
            sizes.seq_len,
            sizes.batch_size,
            device_name(device)
        );
        report::write_plot(&png, &runs, &title)?;
        println!("sweep: {} and {}", csv.display(), png.display());
    }

    if let Some(path) = &args.json {
        let reference = &runs[0];
        let doc = Report {
            task: task.name.to_owned(),
            device: device_name(device),
            config: ConfigJson {
                layers: args.layers,
                heads: args.heads,
                d_model: args.d_model,
                seq_len: sizes.seq_len,
                batch_size: sizes.batch_size,
                steps,
                ff: args.ff,
                dropout: args.dropout,
                epochs: sizes.epochs,
                train_size: task.train.len(),
                test_size: task.test.len(),
                vocab_size: task.vocab_size,
                classes: task.classes.len(),
                lr: args.lr,
                weight_decay: args.weight_decay,
                warmup_steps: train_cfg.warmup,
                seed: args.seed,
            },
            runs: runs.iter().map(|r| RunJson::new(r, reference)).collect(),
            grad_max_abs_diff: grad_diff,
            loss_max_abs_diff: loss_diff,
            threads: tch::get_num_threads(),
            reference_run: reference.name.clone(),
            schedule: match schedule {
                Schedule::Interleaved => "interleaved",
                Schedule::Sequential => "sequential",
            }
            .to_owned(),
            world_size: world,
            ddp_max_param_diff: ddp_diff,
        };
        report::write_json(path, &doc)?;
        println!("json:  {}", path.display());
    }
    Ok(())
}

/// `--explain`: the plans of `segments = auto` for the first training batch, the
/// planner choosing the policies, then with each of `policies` fixed (one profile, the
/// model's cache keeps it across `set_policy`).
fn explain_auto(
    data: &data::Dataset,
    model_cfg: &ModelConfig,
    cfg: &TrainConfig,
    policies: &[ckpt::Policy],
) -> Result<()> {
    tch::manual_seed(cfg.seed as i64);
    let vs = tch::nn::VarStore::new(cfg.device);
    let mut model = model::Classifier::new(vs.root(), model_cfg);
    Strategy::Auto.apply(&mut model, model_cfg.layers)?;
    let steps = train::epoch_steps(data, cfg, Sharding::Single, 0)?;
    let (_, rows) = steps
        .first()
        .and_then(|s| s.first())
        .context("no training batch")?;
    let (xs, _) = data.batch(rows, cfg.device);
    let plan = model.plan_for(&xs, true)?;
    println!(
        "\nsegments = auto, policies chosen by the planner:\n{}",
        plan.explain()
    );
    for &policy in policies {
        model.set_policy(policy);
        let plan = model.plan_for(&xs, true)?;
        println!(
            "\nsegments = auto, policy {} in every checkpointed segment:\n{}",
            ckpt::plan::policy_name(policy),
            plan.explain()
        );
    }
    println!();
    Ok(())
}
