//! Data-parallel training of a checkpointed residual MLP with `ckpt::dist`: samples per
//! second and peak tensor bytes per rank, and (with `--check`) the largest parameter
//! difference against one process trained on the same global batches.
//!
//! ```sh
//! cargo run --release --example dist_train -- --nproc 2 --threads 1
//! cargo run --release --example dist_train -- --nproc 1 --threads 2   # one process, no DDP
//! ```
//!
//! The global batch is the same whatever `--nproc`: each rank trains on its
//! `global_batch / nproc` rows (a `DistributedSampler` share of a fixed pool of samples).
//! Runs under `torchrun --no-python --nproc-per-node N` as well.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use ckpt::ShallowClone;
use ckpt::dist::{DdpOptions, DistributedDataParallel, DistributedSampler, ProcessGroup};
use clap::Parser;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

#[derive(Parser, Debug)]
struct Args {
    /// Start this many workers on this machine (1: a single process without DDP; 0: run
    /// as a worker of an outer launcher such as torchrun).
    #[arg(long, default_value_t = 0)]
    nproc: usize,
    /// Intra-op threads of each process.
    #[arg(long, default_value_t = 1)]
    threads: i32,
    /// Rows per step over all ranks.
    #[arg(long, default_value_t = 64)]
    global_batch: i64,
    /// Timed steps (after 2 untimed ones).
    #[arg(long, default_value_t = 20)]
    steps: i64,
    /// Width of the residual blocks.
    #[arg(long, default_value_t = 512)]
    width: i64,
    /// Residual blocks, each checkpointed.
    #[arg(long, default_value_t = 8)]
    blocks: i64,
    /// Rank 0 also trains one process on the same global batches and reports the
    /// largest parameter difference.
    #[arg(long)]
    check: bool,
}

#[derive(Debug, ShallowClone)]
struct Block {
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Block {
    #[ckpt::checkpointed]
    fn forward(&self, x: &Tensor) -> Tensor {
        self.fc2
            .forward(&self.fc1.forward(x).gelu("none").dropout(0.1, true))
            + x
    }
}

struct Net {
    blocks: Vec<Block>,
    head: nn::Linear,
}

impl Net {
    fn new(vs: &nn::VarStore, a: &Args) -> Net {
        let w = a.width;
        let blocks = (0..a.blocks)
            .map(|i| Block {
                fc1: nn::linear(vs.root() / i / "fc1", w, 2 * w, Default::default()),
                fc2: nn::linear(vs.root() / i / "fc2", 2 * w, w, Default::default()),
            })
            .collect();
        Net {
            blocks,
            head: nn::linear(vs.root() / "head", w, 10, Default::default()),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let mut h = x.shallow_clone();
        for b in &self.blocks {
            h = b.forward(&h);
        }
        self.head.forward(&h)
    }
}

/// A fixed pool of 4096 samples: inputs `[4096, width]`, labels `[4096]` in `0..10`.
fn pool(width: i64) -> (Tensor, Tensor) {
    tch::manual_seed(12);
    let x = Tensor::randn([4096, width], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(10, [4096], (Kind::Int64, Device::Cpu));
    (x, y)
}

/// Rows of `step` for `rank` of `world`: the sampler's share, in steps of `global / world`.
fn rows(sampler: &DistributedSampler, step: i64, per_rank: i64) -> Tensor {
    let idx = sampler.indices();
    let start = (step * per_rank) as usize % (idx.len() - per_rank as usize);
    let take: Vec<i64> = idx[start..start + per_rank as usize]
        .iter()
        .map(|&i| i as i64)
        .collect();
    Tensor::from_slice(&take)
}

/// Trains `a.steps + 2` steps. With a process group each rank trains on its share under
/// DDP; without one, the process trains on the shares of `shards` ranks in turn,
/// accumulating `loss / shards` (one process on the same global batches, with the same
/// dropout masks: each share's forward is seeded by step and rank alike).
fn train(a: &Args, pg: Option<&ProcessGroup>, shards: usize) -> Result<(f64, i64, nn::VarStore)> {
    let (rank, world) = pg.map_or((0, shards), |p| (p.rank(), p.world_size()));
    if a.global_batch % world as i64 != 0 {
        bail!(
            "--global-batch {} is not a multiple of {world} ranks",
            a.global_batch
        );
    }
    let per_rank = a.global_batch / world as i64;
    let (x, y) = pool(a.width);
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs, a);
    let ddp = pg.map(|p| DistributedDataParallel::new(p, &vs, DdpOptions::default()));
    let mut opt = nn::AdamW::default().build(&vs, 1e-3)?;
    let mine: Vec<usize> = if pg.is_some() {
        vec![rank]
    } else {
        (0..shards).collect()
    };
    let samplers: Vec<DistributedSampler> = mine
        .iter()
        .map(|&r| DistributedSampler::new(4096, world, r).seed(3))
        .collect();
    let mut start = Instant::now();
    ckpt::memory::reset_peak(Device::Cpu);
    let base = ckpt::memory::current_bytes(Device::Cpu);
    for step in 0..a.steps + 2 {
        if step == 2 {
            start = Instant::now();
        }
        opt.zero_grad();
        for (&r, sampler) in mine.iter().zip(&samplers) {
            let idx = rows(sampler, step, per_rank);
            let (xb, yb) = (x.index_select(0, &idx), y.index_select(0, &idx));
            tch::manual_seed(1000 * step + r as i64);
            let logits = match &ddp {
                Some(d) => d.f_forward(|| net.forward(&xb))?,
                None => net.forward(&xb),
            };
            let loss = logits.cross_entropy_for_logits(&yb) / mine.len() as f64;
            loss.f_backward()?;
        }
        opt.step();
    }
    let secs = start.elapsed().as_secs_f64();
    let peak = ckpt::memory::peak_bytes(Device::Cpu) - base;
    Ok((a.steps as f64 * a.global_batch as f64 / secs, peak, vs))
}

fn main() -> Result<()> {
    let a = Args::parse();
    if let Some(result) = ckpt::dist::relaunch_self_from_args(a.nproc)? {
        if !result.success() {
            bail!("a worker failed: {:?}", result.status);
        }
        return Ok(());
    }
    tch::set_num_threads(a.threads);
    ckpt::memory::enable();
    let pg = if a.nproc == 1 {
        None
    } else {
        Some(ckpt::dist::f_init_from_env().context("join the process group")?)
    };
    let (samples_per_s, peak, vs) = train(&a, pg.as_ref(), 1)?;
    let mut diff = None;
    if a.check && pg.as_ref().is_some_and(|p| p.rank() == 0) {
        let world = pg.as_ref().map_or(1, ProcessGroup::world_size);
        let (_, _, single) = train(&a, None, world)?;
        let mut d: f64 = 0.0;
        let other = single.variables();
        for (k, v) in vs.variables() {
            d = d.max((&v - &other[&k]).abs().max().double_value(&[]));
        }
        diff = Some(d);
    }
    let (rank, world) = pg.as_ref().map_or((0, 1), |p| (p.rank(), p.world_size()));
    if rank == 0 {
        println!(
            "{}",
            serde_json::json!({
                "world_size": world,
                "threads": a.threads,
                "global_batch": a.global_batch,
                "samples_per_second": samples_per_s,
                "rank0_peak_bytes": peak,
                "ddp_max_param_diff": diff,
            })
        );
    }
    Ok(())
}
