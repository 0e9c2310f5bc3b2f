//! The command line: the flags ([`Args`]), their value types, and the checks that turn
//! bad flags into errors before anything runs.

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{Result, ensure};
use clap::{Parser, ValueEnum};
use tch::Device;

/// Which runs to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// Plain, then checkpointed, from the same seed, and compare.
    Both,
    /// Only the plain run.
    Plain,
    /// Only the checkpointed run.
    Checkpointed,
}

/// `--policy`: what the checkpointed runs keep from each segment's forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PolicyArg {
    /// Keep only each segment's input; recompute everything (PyTorch's `checkpoint`).
    Full,
    /// Also keep every Linear output and dropout mask; recompute the attention core,
    /// norms and activations (`ckpt::Policy::selective`).
    Selective,
    /// Keep the dropout masks (1 bit an element) instead of drawing them again;
    /// recompute the rest (`ckpt::Policy::masks`).
    Masks,
    /// Keep the dropout masks and the outputs of narrowing Linears (fewer outputs than
    /// inputs: the feed-forward down-projection); recompute the rest
    /// (`ckpt::Policy::narrowing`).
    Narrowing,
    /// The planner chooses each checkpointed segment's policy among the four (with
    /// `--segments auto` or `--budget` only).
    Auto,
}

impl PolicyArg {
    /// The policy the model is set to; `None` for `auto` (the planner chooses).
    pub(crate) fn policy(self) -> Option<ckpt::Policy> {
        match self {
            PolicyArg::Full => Some(ckpt::Policy::RECOMPUTE_ALL),
            PolicyArg::Selective => Some(ckpt::Policy::selective()),
            PolicyArg::Masks => Some(ckpt::Policy::masks()),
            PolicyArg::Narrowing => Some(ckpt::Policy::narrowing()),
            PolicyArg::Auto => None,
        }
    }
}

/// How the checkpointed runs are cut ([`Args::cuts`], from `--segments` and `--budget`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cuts {
    /// `--segments N`.
    Count(usize),
    /// The planner's cuts for this objective.
    Planner(ckpt::plan::Objective),
}

/// `--device`: `cpu`, `cuda`, `cuda:N` or `auto` (CUDA device 0 when available).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceArg {
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
pub(crate) enum SegmentsArg {
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
    pub(crate) fn resolve(self) -> Result<Device> {
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

pub(crate) fn device_name(device: Device) -> String {
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
pub(crate) struct Args {
    /// Which runs to make.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    pub(crate) mode: Mode,
    /// Segments over the blocks, as checkpoint_sequential cuts them; the last one is not
    /// checkpointed, so 3 segments over 6 blocks checkpoint blocks 0-1 and 2-3. `auto`:
    /// the cuts ckpt's planner chooses for the least peak memory (from a profile of the
    /// model's stages on the first batch).
    #[arg(long, default_value = "3")]
    pub(crate) segments: SegmentsArg,
    /// The planner's cuts for the least recompute time within this memory budget,
    /// instead of --segments: a fraction of the plain run's predicted peak (`40%`,
    /// `0.4`) or bytes with a unit (`300 MiB`); the predicted peak covers forward and
    /// backward, not the optimizer step.
    #[arg(long, value_name = "BUDGET", conflicts_with = "segments")]
    pub(crate) budget: Option<ckpt::plan::Budget>,
    /// What each checkpointed segment keeps from its forward: `full` keeps only its
    /// input; `selective` also keeps Linear outputs and dropout masks, `masks` only the
    /// dropout masks (more memory, less recompute; gradients unchanged), `narrowing` the
    /// masks and the narrowing Linears' outputs (the feed-forward down-projection); `auto` lets the
    /// planner choose per segment (with --segments auto or --budget). Repeat it
    /// (`--policy full --policy selective`) to train one checkpointed run per policy,
    /// all taking turns with the plain run.
    #[arg(long, value_enum, default_values_t = [PolicyArg::Full])]
    pub(crate) policy: Vec<PolicyArg>,
    /// Every run but plain holds dropout's mask for backward as bits, 1 bit an element,
    /// instead of libtorch's noise tensor (4 bytes an element for float32), in kept and
    /// last segments and in recomputes (`ckpt::compact_dropout`; the same draw, results
    /// bit-identical). CPU only: libtorch's CUDA dropout keeps a byte mask already, so on
    /// CUDA this changes nothing. A `--budget` fraction stays a fraction of the plain
    /// run's predicted peak (libtorch's dropout).
    #[arg(long)]
    pub(crate) compact_dropout: bool,
    /// Print the plan `--segments auto` (or `--budget`) makes for the first training
    /// batch, before training: first with each checkpointed segment's policy chosen by the planner,
    /// then for each --policy (a fixed policy, as the auto run uses it); per segment
    /// the policy, what each policy would keep and save and (planner's choice) why the
    /// others lost, per stage what is kept and recomputed, bytes and seconds
    /// (`ckpt::plan::Plan::explain`).
    #[arg(long)]
    pub(crate) explain: bool,
    /// Train the runs one after the other instead of taking turns step by step
    /// (interleaving keeps the time comparison fair when other processes load the
    /// machine; the numbers are the same either way).
    #[arg(long)]
    pub(crate) sequential: bool,
    /// Run segments = 1 (plain) ..= layers and write sweep.png and sweep.csv into
    /// --out-dir (memory against time); combine with --quick for a fast curve.
    #[arg(long, conflicts_with_all = ["mode", "segments", "budget"])]
    pub(crate) sweep: bool,
    /// Folder for the sweep's PNG and CSV.
    #[arg(long, value_name = "DIR", default_value = "target/train_classifier")]
    pub(crate) out_dir: PathBuf,
    /// Short preset that finishes in under 90 s on a 2-core CPU: the default shapes
    /// (so the same peak memory), 64 training examples (4 steps) and 32 test examples;
    /// explicit flags still win.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Folder-per-class text corpus in the aclImdb layout (DIR/train/<class>/*.txt,
    /// DIR/test/<class>/*.txt) instead of ListOps.
    #[arg(long, value_name = "DIR")]
    pub(crate) data: Option<PathBuf>,
    /// cpu, cuda, cuda:N or auto (CUDA when available).
    #[arg(long, default_value = "auto")]
    pub(crate) device: DeviceArg,
    /// libtorch intra-op threads (default: libtorch's choice, one per core).
    #[arg(long)]
    pub(crate) threads: Option<i32>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Train data-parallel on N processes of this machine (127.0.0.1; Gloo on CPU, NCCL
    /// on CUDA with the `nccl` feature, rank i on cuda:i), each on its share of every
    /// global batch of --batch-size rows; rank 0 also trains one process on the same
    /// global batches and reports the largest parameter difference. Under torchrun
    /// (`RANK` set) every process is a rank whatever N.
    #[arg(long, default_value_t = 1)]
    pub(crate) nproc: usize,
    /// Data-parallel runs: skip rank 0's single-process reference (no parameter
    /// difference then), for timing only.
    #[arg(long)]
    pub(crate) skip_reference: bool,

    /// Encoder blocks.
    #[arg(long, default_value_t = 6, help_heading = "Model")]
    pub(crate) layers: usize,
    /// Attention heads (d_model must be a multiple).
    #[arg(long, default_value_t = 4, help_heading = "Model")]
    pub(crate) heads: i64,
    /// Width of the residual stream.
    #[arg(long, default_value_t = 256, help_heading = "Model")]
    pub(crate) d_model: i64,
    /// Width of the feed-forward layer.
    #[arg(long, default_value_t = 1024, help_heading = "Model")]
    pub(crate) ff: i64,
    /// Dropout probability.
    #[arg(long, default_value_t = 0.1, help_heading = "Model")]
    pub(crate) dropout: f64,

    /// Tokens a row, padded or truncated [default: 256].
    #[arg(long, help_heading = "Training")]
    pub(crate) seq_len: Option<usize>,
    /// Rows a step [default: 16].
    #[arg(long, help_heading = "Training")]
    pub(crate) batch_size: Option<usize>,
    /// Training examples (steps an epoch = train-size / batch-size, the last partial
    /// batch dropped) [default: 384; --quick: 64].
    #[arg(long, help_heading = "Training")]
    pub(crate) train_size: Option<usize>,
    /// Test examples [default: 256; --quick: 32].
    #[arg(long, help_heading = "Training")]
    pub(crate) test_size: Option<usize>,
    /// Passes over the training examples [default: 1].
    #[arg(long, help_heading = "Training")]
    pub(crate) epochs: Option<usize>,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 3e-4, help_heading = "Training")]
    pub(crate) lr: f64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.01, help_heading = "Training")]
    pub(crate) weight_decay: f64,
    /// Steps of linear learning-rate warm-up [default: an eighth of the steps].
    #[arg(long, help_heading = "Training")]
    pub(crate) warmup_steps: Option<usize>,
    /// Seed of the weights, dropout, batch order and ListOps data.
    #[arg(long, default_value_t = 0, help_heading = "Training")]
    pub(crate) seed: u64,

    /// ListOps: depth at which nodes are always digits (the root is depth 1).
    #[arg(long, default_value_t = 10, help_heading = "ListOps")]
    pub(crate) listops_max_depth: usize,
    /// ListOps: most arguments of an operator.
    #[arg(long, default_value_t = 10, help_heading = "ListOps")]
    pub(crate) listops_max_args: usize,
    /// ListOps: expressions are longer than this, in tokens [default: seq-len / 4].
    #[arg(long, help_heading = "ListOps")]
    pub(crate) listops_min_length: Option<usize>,
    /// ListOps: expressions are shorter than this, in tokens [default: seq-len + 1].
    #[arg(long, help_heading = "ListOps")]
    pub(crate) listops_max_length: Option<usize>,

    /// Text corpus: words seen fewer times in the training split become <unk>.
    #[arg(long, default_value_t = 2, help_heading = "Text corpus (--data)")]
    pub(crate) min_freq: usize,
    /// Text corpus: largest vocabulary, <pad> and <unk> included.
    #[arg(long, default_value_t = 20_000, help_heading = "Text corpus (--data)")]
    pub(crate) max_vocab: usize,
}

/// The flags that `--quick` changes, resolved.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) seq_len: usize,
    pub(crate) batch_size: usize,
    pub(crate) train_size: usize,
    pub(crate) test_size: usize,
    pub(crate) epochs: usize,
}

impl Args {
    pub(crate) fn sizes(&self) -> Sizes {
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

    /// How the checkpointed runs are cut: the planner, for the least recompute time
    /// within `--budget` or the least peak (`--segments auto`), or a count of segments.
    pub(crate) fn cuts(&self) -> Cuts {
        use ckpt::plan::Objective;
        match (self.budget, self.segments) {
            (Some(budget), _) => Cuts::Planner(Objective::Budget(budget)),
            (None, SegmentsArg::Auto) => Cuts::Planner(Objective::MinPeak),
            (None, SegmentsArg::Count(n)) => Cuts::Count(n),
        }
    }

    pub(crate) fn check(&self, s: &Sizes) -> Result<()> {
        ensure!(self.layers >= 1, "--layers must be at least 1");
        ensure!(
            self.segments != SegmentsArg::Count(0),
            "--segments must be at least 1 (1 checkpoints nothing), or auto"
        );
        ensure!(
            !self.policy.contains(&PolicyArg::Auto) || matches!(self.cuts(), Cuts::Planner(_)),
            "--policy auto lets the planner choose, so it needs --segments auto or --budget"
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
