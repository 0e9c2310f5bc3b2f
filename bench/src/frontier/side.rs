//! One side's process of a round: every point of one configuration trained side by side,
//! the points taking turns step by step, so that load from other processes falls on all
//! of them alike. The ckpt side runs here; `bench/frontier_torch.py` is PyTorch's.

use std::time::Instant;

use anyhow::Result;
use ckpt::Policy;
use ckpt::plan::{Budget, Objective, Schedule};
use ckpt_bench::measure::{median, minor_faults};
use ckpt_bench::models::classifier::{Classifier, ModelConfig, Strategy};
use serde::{Deserialize, Serialize};
use tch::nn::{self, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// One way of running the encoder's six blocks (a point of the frontier).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Point {
    /// Nothing checkpointed.
    Plain,
    /// `checkpoint_sequential(blocks, segments)`: the last segment plain, every other one
    /// recomputed in full.
    Full { segments: usize },
    /// The same cuts, each checkpointed segment keeping its Linear outputs (PyTorch:
    /// `create_selective_checkpoint_contexts` with `MUST_SAVE` for `aten.addmm`).
    Selective { segments: usize },
    /// The same cuts, each checkpointed segment keeping its dropout masks (ckpt only).
    Masks { segments: usize },
    /// Dropout masks and narrowing Linears' outputs kept (`Policy::narrowing()`: the
    /// feed-forward down-projection's; ckpt only).
    Narrowing { segments: usize },
    /// Linear outputs and dropout masks kept (`Policy::selective()`; ckpt only).
    SelectiveMasks { segments: usize },
    /// `segments = auto` within this fraction of the plain run's predicted peak (ckpt
    /// only: PyTorch's eager API has no budget solver).
    Budget { fraction: f64 },
    /// Nothing checkpointed, the step run in `ckpt::compact_dropout` (dropout masks held
    /// for backward as bits; ckpt only).
    Compact,
    /// `segments = auto` within this fraction of the predicted peak of a plain run, the
    /// step (profile, planned run, backward) in `ckpt::compact_dropout`: the profile
    /// measures compact stages, so the fraction is of a compact plain run (ckpt only).
    CompactBudget { fraction: f64 },
}

impl Point {
    /// The name in tables, JSON and the plot.
    pub fn name(&self) -> String {
        match *self {
            Point::Plain => "plain".into(),
            Point::Full { segments } => format!("full/{segments}"),
            Point::Selective { segments } => format!("selective/{segments}"),
            Point::Masks { segments } => format!("masks/{segments}"),
            Point::Narrowing { segments } => format!("narrowing/{segments}"),
            Point::SelectiveMasks { segments } => format!("selective+masks/{segments}"),
            Point::Budget { fraction } => format!("budget {:.0}%", fraction * 100.0),
            Point::Compact => "compact".into(),
            Point::CompactBudget { fraction } => {
                format!("compact budget {:.0}%", fraction * 100.0)
            }
        }
    }

    /// Whether the step runs in `ckpt::compact_dropout`.
    pub fn compact(&self) -> bool {
        matches!(self, Point::Compact | Point::CompactBudget { .. })
    }

    /// Whether PyTorch has the same point (the same cuts and the same policy).
    pub fn on_both_sides(&self) -> bool {
        matches!(
            self,
            Point::Plain | Point::Full { .. } | Point::Selective { .. }
        )
    }

    /// Whether the user picks this point by hand (not the planner).
    pub fn hand_chosen(&self) -> bool {
        !matches!(self, Point::Budget { .. } | Point::CompactBudget { .. })
    }

    fn configure(&self, model: &mut Classifier, layers: usize) -> Result<()> {
        let (strategy, policy) = match *self {
            Point::Plain | Point::Compact => (Strategy::Plain, Policy::RECOMPUTE_ALL),
            Point::Full { segments } => (Strategy::Checkpointed(segments), Policy::RECOMPUTE_ALL),
            Point::Selective { segments } => (
                Strategy::Checkpointed(segments),
                Policy::selective().save_dropout_masks(false),
            ),
            Point::Masks { segments } => (
                Strategy::Checkpointed(segments),
                Policy::RECOMPUTE_ALL.save_dropout_masks(true),
            ),
            Point::Narrowing { segments } => {
                (Strategy::Checkpointed(segments), Policy::narrowing())
            }
            Point::SelectiveMasks { segments } => {
                (Strategy::Checkpointed(segments), Policy::selective())
            }
            Point::Budget { fraction } | Point::CompactBudget { fraction } => {
                model.set_schedule(Schedule::Auto(Objective::Budget(Budget::FractionOfPlain(
                    fraction,
                ))))?;
                return Ok(());
            }
        };
        strategy.apply(model, layers)?;
        model.set_policy(policy);
        Ok(())
    }
}

/// The shape of one configuration (the rest is the seed transformer: 6 pre-LN blocks,
/// 4 heads, d_model 256, feed-forward 1024, dropout 0.1).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shape {
    pub seq: i64,
    pub batch: i64,
    pub warmup: usize,
    pub steps: usize,
}

/// What one point measured in one process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PointResult {
    pub name: String,
    /// Median wall seconds of the measured steps.
    pub step_seconds_median: f64,
    pub step_seconds: Vec<f64>,
    /// Peak tensor bytes of a step above the bytes live before it (the largest over the
    /// measured steps).
    pub peak_bytes: i64,
    /// For a budget point: the plan the planner chose (`Plan::explain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// For a budget point: its predicted peak bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_peak_bytes: Option<u64>,
    /// Unmeasured steps the process ran before the measured ones (the same for every
    /// point of a process; 0 in raw results from before it was recorded).
    #[serde(default)]
    pub warmup_steps: usize,
    /// Minor page faults of the whole process during each measured step
    /// ([`ckpt_bench::measure::minor_faults`]; empty in older raw results).
    #[serde(default)]
    pub step_faults: Vec<u64>,
}

/// A warm-up cycle (one step of every point) in which no step faulted this many pages
/// (4 MiB of 4-KiB pages) ends the warm-up: the heap has stopped growing.
pub const HEAP_STEADY_FAULTS: u64 = 1024;

/// The most warm-up steps past `Shape::warmup` that wait for the heap to stop growing.
pub const MAX_EXTRA_WARMUP: usize = 4;

/// Bytes allocated, written and freed once after `Shape::warmup` steps, on top of the
/// grown heap: with glibc's heap fixed (bench/frontier.sh: nothing trimmed) they stay
/// as touched free space at its top. Ten models in one arena fragment it, so the
/// largest point, plain, still grew the heap now and then after eight warm-up steps (a
/// rule tried before this one), by 8-128 MiB, and its first touch of those pages cost
/// such a step up to 0.2 s at seq 256 (1.23 s against 1.00 s); growth into the reserve
/// touches nothing new. With glibc's defaults the block is mapped and unmapped, which
/// changes nothing.
pub const HEAP_RESERVE_BYTES: usize = 1 << 30;

/// Allocates [`HEAP_RESERVE_BYTES`], writes a byte in every page and frees it.
fn reserve_heap() {
    let mut block = vec![0u8; HEAP_RESERVE_BYTES];
    for page in block.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&block);
}

struct Run {
    point: Point,
    _vs: nn::VarStore,
    model: Classifier,
    opt: nn::Optimizer,
    seconds: Vec<f64>,
    faults: Vec<u64>,
    peak: i64,
}

/// Trains every point on the same batch, in turns step by step: `warmup` unmeasured
/// steps (optimizer state, `.grad`, the planner's profile), a heap reserve
/// ([`HEAP_RESERVE_BYTES`]), more warm-up steps until a cycle (one step of every point)
/// grows it no more (see [`HEAP_STEADY_FAULTS`]; at least one), then `steps` measured
/// ones. A step is
/// forward, gradients zeroed in place, backward, AdamW step (as `torch_side.py`).
///
/// # Errors
///
/// A point cannot be configured or a step fails.
pub fn run(shape: &Shape, points: &[Point]) -> Result<Vec<PointResult>> {
    let cfg = ModelConfig {
        vocab_size: 20,
        n_classes: 10,
        seq_len: shape.seq,
        layers: 6,
        heads: 4,
        d_model: 256,
        ff: 1024,
        dropout: 0.1,
    };
    tch::manual_seed(1);
    let ids = Tensor::randint_low(
        1,
        cfg.vocab_size,
        [shape.batch, shape.seq],
        (Kind::Int64, Device::Cpu),
    );
    let labels = Tensor::randint(cfg.n_classes, [shape.batch], (Kind::Int64, Device::Cpu));
    let mut runs = Vec::new();
    for &point in points {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut model = Classifier::new(vs.root(), &cfg);
        point.configure(&mut model, cfg.layers)?;
        let opt = nn::AdamW::default().build(&vs, 1e-4)?;
        runs.push(Run {
            point,
            _vs: vs,
            model,
            opt,
            seconds: Vec::new(),
            faults: Vec::new(),
            peak: 0,
        });
    }
    let mut warmup = 0;
    let mut steady = false;
    while runs.first().is_some_and(|r| r.seconds.len() < shape.steps) {
        let warming =
            warmup < shape.warmup || (!steady && warmup < shape.warmup + MAX_EXTRA_WARMUP);
        let mut most_faults = 0;
        for r in &mut runs {
            ckpt::memory::reset_peak(Device::Cpu);
            let base = ckpt::memory::current_bytes(Device::Cpu);
            let faults = minor_faults();
            let start = Instant::now();
            let mut step = || {
                let loss = r
                    .model
                    .forward_t(&ids, true)
                    .cross_entropy_for_logits(&labels);
                r.opt.backward_step(&loss);
            };
            if r.point.compact() {
                ckpt::compact_dropout(step);
            } else {
                step();
            }
            let seconds = start.elapsed().as_secs_f64();
            // Saturating: `minor_faults` reads 0 if `getrusage` ever fails.
            let faults = minor_faults().saturating_sub(faults);
            most_faults = most_faults.max(faults);
            if !warming {
                r.seconds.push(seconds);
                r.faults.push(faults);
                r.peak = r.peak.max(ckpt::memory::peak_bytes(Device::Cpu) - base);
            }
        }
        if warming {
            warmup += 1;
            steady = warmup > shape.warmup && most_faults < HEAP_STEADY_FAULTS;
            if warmup == shape.warmup {
                reserve_heap();
            }
        }
    }
    runs.into_iter()
        .map(|r| {
            let plan = match r.point {
                Point::Budget { .. } => Some(r.model.plan_for(&ids, true)?),
                Point::CompactBudget { .. } => {
                    Some(ckpt::compact_dropout(|| r.model.plan_for(&ids, true))?)
                }
                _ => None,
            };
            Ok(PointResult {
                name: r.point.name(),
                step_seconds_median: median(&r.seconds),
                step_seconds: r.seconds,
                peak_bytes: r.peak,
                predicted_peak_bytes: plan.as_ref().map(|p| p.predicted_peak_bytes()),
                plan: plan.map(|p| p.explain()),
                warmup_steps: warmup,
                step_faults: r.faults,
            })
        })
        .collect()
}
