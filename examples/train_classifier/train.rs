//! Training and measuring runs: AdamW, cross-entropy, per-step peak tensor memory from
//! `ckpt::memory`, step and epoch wall times, test accuracy.
//!
//! What a step's memory figure means: before the step the gradients are freed
//! (`zero_grad`, which sets them to none in libtorch 2.x), so the baseline is the
//! parameters, AdamW's state and the batch (of every run alive: interleaved runs train
//! side by side); [`ckpt::memory::f_measure`] then reports the highest tensor bytes
//! above that baseline during forward, backward and the optimizer step. Bytes are exact
//! and deterministic. The first step also allocates AdamW's state (two tensors per
//! parameter), so it is reported on its own and the run's `peak_bytes` is the largest
//! figure of the later steps (all equal: the shapes do not change).
//!
//! Same numbers in every run: the weights come from `tch::manual_seed(seed)`, the batch
//! order from the seed, and the global generator is reseeded before each step from the
//! seed and the step number, so every run draws the same dropout masks at the same step
//! whether the runs are interleaved or not. Within a step, a checkpointed segment's
//! recompute replays its forward's masks through `preserve_rng_state`.
//!
//! Data-parallel runs ([`Sharding::Ddp`](crate::shard::Sharding::Ddp)): each rank trains on its
//! `ckpt::dist::DistributedSampler` share of every global batch (`batch_size / world_size`
//! rows) under `ckpt::dist::DistributedDataParallel`, which averages the gradients over
//! the ranks during backward. A rank's dropout seed also depends on its rank, so the
//! reference ([`Sharding::Reference`](crate::shard::Sharding::Reference)), one process that trains on the shares of every
//! rank in turn and accumulates `loss / world_size`, draws the very same masks: it
//! computes the same global-batch gradient as the ranks together, up to the order of
//! float32 sums.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use ckpt::dist::{DdpOptions, DistributedDataParallel, ProcessGroup, ReduceOp};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tch::nn::{self, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};

use ckpt_models::classifier::{Classifier, ModelConfig, Strategy};
use ckpt_models::data::Task;

use crate::shard::{Sharding, dropout_seed, epoch_steps};

/// Optimisation settings, the same for every run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    /// Passes over the training split.
    pub epochs: usize,
    /// Examples a step.
    pub batch_size: usize,
    /// AdamW learning rate (after warm-up).
    pub lr: f64,
    /// Steps of linear learning-rate warm-up (from `lr / warmup` up to `lr`).
    pub warmup: usize,
    /// AdamW weight decay (decoupled).
    pub weight_decay: f64,
    /// Seed of the weights (`tch::manual_seed`), dropout and the batch order.
    pub seed: u64,
    /// Where the model runs.
    pub device: Device,
    /// Every run but plain steps inside [`ckpt::compact_dropout`] (dropout masks held as
    /// bits; `--compact-dropout`).
    pub compact_dropout: bool,
}

/// One run to make: its name, how the blocks are cut, and what the checkpointed
/// segments keep from their forward (`None`: the planner chooses per segment).
pub type RunSpec = (String, Strategy, Option<ckpt::Policy>);

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// `plain`, `checkpointed`, or `segments=N` in a sweep.
    pub name: String,
    /// Segments of `checkpoint_sequential_t`; 0 for plain.
    pub segments: usize,
    /// `full`, `selective`, `masks` or `narrowing` for checkpointed runs, `auto` when the planner
    /// chose per segment, `none` for plain.
    pub policy: &'static str,
    /// The run stepped inside [`ckpt::compact_dropout`] (`--compact-dropout`; never plain).
    pub compact_dropout: bool,
    /// Peak tensor bytes above the step's baseline, largest over the steps after the
    /// first (the first when there is only one).
    pub peak_bytes: i64,
    /// The same for the first step (includes AdamW's state allocation).
    pub first_step_peak_bytes: i64,
    /// Tensor bytes live before a steady step (parameters, AdamW state and batch, of
    /// every run alive).
    pub baseline_bytes: i64,
    /// Wall time of each step, seconds.
    pub step_seconds: Vec<f64>,
    /// Median of `step_seconds`.
    pub step_seconds_median: f64,
    /// Mean wall time of a training epoch (steps and batching, no evaluation), seconds.
    pub epoch_seconds: f64,
    /// Test accuracy after training, 0..1.
    pub test_accuracy: f64,
    /// Training loss of each step.
    pub losses: Vec<f64>,
    /// Gradients after the first backward, by variable name (copied to host memory,
    /// outside the tensor count).
    pub first_grads: Vec<(String, Vec<f32>)>,
    /// Rows a step of this process (the rank's share under DDP).
    pub rows_per_step: usize,
    /// Figures of every rank, by rank (one entry for a single process).
    pub ranks: Vec<RankFigures>,
    /// The parameters after training, by variable name, for a data-parallel run and its
    /// reference (empty otherwise).
    pub final_params: Vec<(String, Vec<f32>)>,
    /// Largest absolute difference between this data-parallel run's parameters after
    /// training and its single-process reference's (`None` unless computed).
    pub ddp_max_param_diff: Option<f64>,
    /// The planner's plan this run trained with, for its first batch's shape (`None`
    /// unless the planner cut it: `--segments auto` or `--budget`). The planner weighs
    /// measured times, so two runs, or `--explain`'s plans, may differ.
    pub plan: Option<ckpt::plan::Plan>,
}

/// What one rank measured in a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankFigures {
    /// Peak tensor bytes above the step's baseline (as [`RunResult::peak_bytes`]).
    pub peak_bytes: i64,
    /// Median step wall time, seconds.
    pub step_seconds_median: f64,
    /// The rank's rows a step over its median step time.
    pub samples_per_second: f64,
}

impl RunResult {
    /// Loss of the last step.
    pub fn final_loss(&self) -> f64 {
        self.losses.last().copied().unwrap_or(f64::NAN)
    }
}

/// The median of `xs` ([`ckpt_models::stats::median`]); NaN when `xs` is empty.
pub fn median(xs: &[f64]) -> f64 {
    ckpt_models::stats::median(xs).unwrap_or(f64::NAN)
}

fn synchronize(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// `what` of every variable (its gradient, or itself) in host memory, by name; an
/// undefined tensor is empty.
fn host_copy(
    vs: &nn::VarStore,
    what: impl Fn(&Tensor) -> Tensor,
) -> Result<Vec<(String, Vec<f32>)>> {
    let mut vars: Vec<(String, tch::Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.into_iter()
        .map(|(name, v)| {
            let t = what(&v);
            let values = if t.defined() {
                Vec::<f32>::try_from(t.flatten(0, -1)).with_context(|| format!("reading {name}"))?
            } else {
                Vec::new()
            };
            Ok((name, values))
        })
        .collect()
}

/// How the runs of a comparison share the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Step 1 of every run, then step 2 of every run, ...: a burst of load from other
    /// processes slows all runs alike, so the time comparison stays fair on a shared
    /// machine.
    Interleaved,
    /// All steps of the first run, then all steps of the next.
    Sequential,
}

/// One training run in progress: its own model, optimizer and measurements.
struct Run {
    vs: nn::VarStore,
    model: Classifier,
    opt: nn::Optimizer,
    /// Under [`Sharding::Ddp`]: the model's gradient reducer.
    ddp: Option<DistributedDataParallel>,
    bar: ProgressBar,
    result: RunResult,
    epoch_seconds: Vec<f64>,
    /// The planner cuts the model ([`Strategy::Auto`]).
    planned: bool,
}

impl Run {
    /// A fresh model whose weights come from `cfg.seed` (the same for every run, and
    /// broadcast from rank 0 under DDP).
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: &str,
        model_cfg: &ModelConfig,
        cfg: &TrainConfig,
        (strategy, policy): (Strategy, Option<ckpt::Policy>),
        sharding: Sharding,
        steps: usize,
        bars: &MultiProgress,
    ) -> Result<Self> {
        tch::manual_seed(cfg.seed as i64);
        let vs = nn::VarStore::new(cfg.device);
        let mut model = Classifier::new(vs.root(), model_cfg);
        strategy.apply(&mut model, model_cfg.layers)?;
        if let Some(policy) = policy {
            model.set_policy(policy);
        }
        let ddp = match sharding {
            Sharding::Ddp(pg) => Some(DistributedDataParallel::f_new(
                pg,
                &vs,
                DdpOptions::default(),
            )?),
            _ => None,
        };
        let opt = nn::AdamW {
            wd: cfg.weight_decay,
            ..Default::default()
        }
        .build(&vs, cfg.lr)?;
        let bar = bars.add(ProgressBar::new(steps as u64));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>14} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} steps, {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(name.to_owned());
        Ok(Run {
            vs,
            model,
            opt,
            ddp,
            bar,
            result: RunResult {
                name: name.to_owned(),
                segments: strategy.segments(),
                policy: match strategy {
                    Strategy::Plain => "none",
                    _ => policy.map_or("auto", ckpt::plan::policy_name),
                },
                compact_dropout: cfg.compact_dropout && strategy != Strategy::Plain,
                peak_bytes: 0,
                first_step_peak_bytes: 0,
                baseline_bytes: 0,
                step_seconds: Vec::new(),
                step_seconds_median: 0.0,
                epoch_seconds: 0.0,
                test_accuracy: 0.0,
                losses: Vec::new(),
                first_grads: Vec::new(),
                rows_per_step: cfg.batch_size / sharding.world_size() * sharding.ranks().len(),
                ranks: Vec::new(),
                final_params: Vec::new(),
                ddp_max_param_diff: None,
                plan: None,
            },
            epoch_seconds: Vec::new(),
            planned: matches!(strategy, Strategy::Auto(_)),
        })
    }

    /// One training step on `shares`, `(rank, inputs, labels)` each: the mean loss of
    /// each share, divided by the number of shares when there are several, backward
    /// (under DDP, through its reducer), and an AdamW step. `step` (from 0) and the
    /// share's rank seed the dropout masks.
    fn step(
        &mut self,
        shares: &[(usize, Tensor, Tensor)],
        step: usize,
        cfg: &TrainConfig,
        sharding: Sharding,
    ) -> Result<()> {
        let first = self.result.losses.is_empty();
        self.opt
            .set_lr(cfg.lr * ((step + 1) as f64 / cfg.warmup.max(1) as f64).min(1.0));
        self.opt.zero_grad();
        // Forward and backward (a recompute's too) on this thread, so inside the scope.
        let _compact = self
            .result
            .compact_dropout
            .then(ckpt::compact_dropout_guard);
        synchronize(cfg.device);
        let start = Instant::now();
        let n = shares.len();
        let (out, report) = ckpt::memory::f_measure(cfg.device, || -> Result<_> {
            let mut total = 0.0;
            for (rank, xs, ys) in shares {
                // Every run draws the same dropout masks for the same share, whatever
                // ran before.
                tch::manual_seed(dropout_seed(cfg.seed, step, *rank));
                let forward = || self.model.forward_t(xs, true);
                let logits = match &self.ddp {
                    Some(ddp) => ddp.f_forward(forward)?,
                    None => forward(),
                };
                let loss = logits.cross_entropy_for_logits(ys);
                let loss = if n > 1 { loss / n as f64 } else { loss };
                loss.f_backward()?;
                total += f64::try_from(&loss)?;
            }
            let grads = if first {
                host_copy(&self.vs, Tensor::grad)?
            } else {
                Vec::new()
            };
            self.opt.step();
            Ok((total, grads))
        })?;
        let (mut loss, grads) = out?;
        synchronize(cfg.device);
        let seconds = start.elapsed().as_secs_f64();
        // Free the gradients now, so that the other runs' steps start from the same
        // kind of baseline (parameters, optimizer state, batch).
        self.opt.zero_grad();
        if let Sharding::Ddp(pg) = sharding {
            // The loss of the global batch: the mean of the ranks' (untimed).
            let t = Tensor::from_slice(&[loss]).to_device(cfg.device);
            pg.f_all_reduce(&t, ReduceOp::Avg)?;
            loss = t.double_value(&[0]);
        }

        if first
            && self.planned
            && let Some((_, xs, _)) = shares.first()
        {
            // The plan the first step made and ran (cached for this input shape).
            self.result.plan = Some(self.model.plan_for(xs, true)?);
        }
        let r = &mut self.result;
        r.step_seconds.push(seconds);
        if first {
            r.first_grads = grads;
            r.first_step_peak_bytes = report.peak_above_baseline_bytes;
        } else {
            r.peak_bytes = r.peak_bytes.max(report.peak_above_baseline_bytes);
            r.baseline_bytes = report.baseline_bytes;
        }
        r.losses.push(loss);
        if let Some(epoch) = self.epoch_seconds.last_mut() {
            *epoch += seconds;
        }
        self.bar.set_message(format!(
            "loss {loss:.4}, peak {:.0} MiB",
            report.peak_above_baseline_bytes as f64 / MIB
        ));
        self.bar.inc(1);
        Ok(())
    }

    fn finish(mut self, task: &Task, cfg: &TrainConfig, sharding: Sharding) -> Result<RunResult> {
        let r = &mut self.result;
        if r.losses.len() == 1 {
            r.peak_bytes = r.first_step_peak_bytes;
        }
        r.step_seconds_median = median(&r.step_seconds);
        r.epoch_seconds =
            self.epoch_seconds.iter().sum::<f64>() / self.epoch_seconds.len().max(1) as f64;
        let mine = RankFigures {
            peak_bytes: r.peak_bytes,
            step_seconds_median: r.step_seconds_median,
            samples_per_second: r.rows_per_step as f64 / r.step_seconds_median,
        };
        r.ranks = match sharding {
            Sharding::Ddp(pg) => gather_figures(pg, mine, cfg.device)?,
            _ => vec![mine],
        };
        if !matches!(sharding, Sharding::Single) {
            r.final_params = host_copy(&self.vs, Tensor::shallow_clone)?;
        }
        r.test_accuracy = evaluate(&self.model, task, cfg);
        self.bar.finish_with_message(format!(
            "loss {:.4}, test accuracy {:.3}",
            r.final_loss(),
            r.test_accuracy
        ));
        Ok(self.result)
    }
}

/// Every rank's figures, by rank: an `all_gather` of three float64 values, on `device`
/// (NCCL groups take CUDA tensors only).
fn gather_figures(
    pg: &ProcessGroup,
    mine: RankFigures,
    device: Device,
) -> Result<Vec<RankFigures>> {
    let t = Tensor::from_slice(&[
        mine.peak_bytes as f64,
        mine.step_seconds_median,
        mine.samples_per_second,
    ])
    .to_device(device);
    pg.f_all_gather(&t)?
        .iter()
        .map(|t| {
            let v = Vec::<f64>::try_from(t.to_device(Device::Cpu))?;
            Ok(RankFigures {
                peak_bytes: v[0] as i64,
                step_seconds_median: v[1],
                samples_per_second: v[2],
            })
        })
        .collect()
}

/// Trains a fresh model for each `(name, strategy)` of `plan`, all from the same seed
/// (same weights, same batches, same dropout masks), and measures them; `sharding` says
/// which share of each global batch this process trains on.
///
/// A step's time is its wall time; an epoch's is the sum of its steps' times (batching
/// and evaluation excluded), so both mean the same in either [`Schedule`].
///
/// # Errors
///
/// When libtorch fails (out of memory, a failing recompute), the memory statistics
/// of the device are unavailable, or a collective fails (a rank died: the others
/// fail within the process group's timeout).
pub fn train(
    plan: &[RunSpec],
    task: &Task,
    model_cfg: &ModelConfig,
    cfg: &TrainConfig,
    schedule: Schedule,
    bars: &MultiProgress,
    sharding: Sharding,
) -> Result<Vec<RunResult>> {
    let steps_per_epoch = epoch_steps(&task.train, cfg, sharding, 0)?.len();
    ensure!(
        steps_per_epoch > 0,
        "--train-size {} is smaller than --batch-size {}",
        task.train.len(),
        cfg.batch_size
    );
    let steps = steps_per_epoch * cfg.epochs;
    let new_run = |(name, strategy, policy): &RunSpec| {
        Run::new(
            name,
            model_cfg,
            cfg,
            (*strategy, *policy),
            sharding,
            steps,
            bars,
        )
        .with_context(|| format!("run `{name}`"))
    };
    // Runs that train together; one group of all runs, or one group a run.
    let groups: Vec<Vec<&RunSpec>> = match schedule {
        Schedule::Interleaved => vec![plan.iter().collect()],
        Schedule::Sequential => plan.iter().map(|p| vec![p]).collect(),
    };
    let mut results = Vec::new();
    for group in groups {
        let mut runs = group.into_iter().map(new_run).collect::<Result<Vec<_>>>()?;
        let mut step = 0;
        for epoch in 0..cfg.epochs {
            runs.iter_mut().for_each(|r| r.epoch_seconds.push(0.0));
            for shares in epoch_steps(&task.train, cfg, sharding, epoch)? {
                let shares: Vec<(usize, Tensor, Tensor)> = shares
                    .iter()
                    .map(|(rank, index)| {
                        let (xs, ys) = task.train.batch(index, cfg.device);
                        (*rank, xs, ys)
                    })
                    .collect();
                for run in &mut runs {
                    run.step(&shares, step, cfg, sharding)
                        .with_context(|| format!("run `{}`, step {}", run.result.name, step + 1))?;
                }
                step += 1;
            }
        }
        for run in runs {
            results.push(run.finish(task, cfg, sharding)?);
        }
    }
    Ok(results)
}

/// One mebibyte, for printing.
pub const MIB: f64 = 1024.0 * 1024.0;

/// Accuracy on the test split (eval mode, no grad, plain forward).
fn evaluate(model: &Classifier, task: &Task, cfg: &TrainConfig) -> f64 {
    let n = task.test.len();
    if n == 0 {
        return f64::NAN;
    }
    let index: Vec<usize> = (0..n).collect();
    let correct: i64 = tch::no_grad(|| {
        index
            .chunks(cfg.batch_size)
            .map(|chunk| {
                let (xs, ys) = task.test.batch(chunk, cfg.device);
                let pred = model.forward_t(&xs, false).argmax(-1, false);
                pred.eq_tensor(&ys).sum(Kind::Int64).int64_value(&[])
            })
            .sum()
    });
    correct as f64 / n as f64
}

/// Largest absolute difference between two runs' first-step gradients (variable by
/// variable, element by element).
///
/// # Errors
///
/// When the runs' variables differ (names or sizes).
pub fn grad_max_abs_diff(a: &RunResult, b: &RunResult) -> Result<f64> {
    max_abs_diff(&a.first_grads, &b.first_grads)
}

/// Largest absolute difference between two sets of named values (host copies of
/// variables or gradients, sorted by name), element by element.
///
/// # Errors
///
/// When the names or sizes differ.
pub fn max_abs_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> Result<f64> {
    ensure!(a.len() == b.len(), "the runs have different variables");
    let mut worst = 0.0f64;
    for ((na, ga), (nb, gb)) in a.iter().zip(b) {
        ensure!(
            na == nb && ga.len() == gb.len(),
            "variable {na} differs from {nb}"
        );
        for (x, y) in ga.iter().zip(gb) {
            worst = worst.max(f64::from((x - y).abs()));
        }
    }
    Ok(worst)
}

/// Largest absolute difference between two runs' losses, step by step.
pub fn loss_max_abs_diff(a: &RunResult, b: &RunResult) -> f64 {
    a.losses
        .iter()
        .zip(&b.losses)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}
