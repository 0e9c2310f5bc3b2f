//! Which rows each process trains on at each step: whole batches, a rank's
//! `DistributedSampler` share of each global batch, or every rank's share in turn (the
//! single-process reference of a data-parallel run); and each share's dropout seed.

use anyhow::{Result, ensure};
use ckpt::dist::{DistributedSampler, ProcessGroup};
use ckpt_models::data::Dataset;

use crate::train::TrainConfig;

/// How a run's global batches (`batch_size` rows a step) are split between processes.
#[derive(Debug, Clone, Copy)]
pub enum Sharding<'a> {
    /// This process trains on whole batches (`Dataset::shuffled_batches`).
    Single,
    /// This process is one rank of a data-parallel run: its `DistributedSampler` share
    /// of each global batch, gradients averaged over the group by DDP.
    Ddp(&'a ProcessGroup),
    /// One process trains on the shares of all `world_size` ranks of a data-parallel run
    /// in turn, accumulating the gradients of `loss / world_size`: the same global batches
    /// and dropout masks as the ranks together, without DDP (their reference).
    Reference(usize),
}

impl Sharding<'_> {
    pub fn world_size(self) -> usize {
        match self {
            Sharding::Single => 1,
            Sharding::Ddp(pg) => pg.world_size(),
            Sharding::Reference(world) => world,
        }
    }

    /// The ranks whose shares this process trains on.
    pub fn ranks(self) -> Vec<usize> {
        match self {
            Sharding::Single => vec![0],
            Sharding::Ddp(pg) => vec![pg.rank()],
            Sharding::Reference(world) => (0..world).collect(),
        }
    }
}

/// One step's shares of the global batch that this process trains on: `(rank, row
/// indices)` each.
pub type StepShares = Vec<(usize, Vec<usize>)>;

/// The steps of `epoch`: for each, `(rank, row indices)` of the shares this process
/// trains on. Data-parallel shares come from a `DistributedSampler` per rank (seeded by
/// `cfg.seed`, reshuffled by the epoch, tail padded), cut into `batch_size / world_size`
/// rows a step; the last incomplete step is dropped, as `shuffled_batches` does.
///
/// # Errors
///
/// When `batch_size` is not a multiple of the world size.
pub fn epoch_steps(
    data: &Dataset,
    cfg: &TrainConfig,
    sharding: Sharding,
    epoch: usize,
) -> Result<Vec<StepShares>> {
    if let Sharding::Single = sharding {
        let order = cfg.seed.wrapping_mul(1_000_003).wrapping_add(epoch as u64);
        return Ok(data
            .shuffled_batches(cfg.batch_size, order)
            .into_iter()
            .map(|b| vec![(0, b)])
            .collect());
    }
    let world = sharding.world_size();
    ensure!(
        cfg.batch_size.is_multiple_of(world),
        "--batch-size {} (the global batch) is not a multiple of the {world} ranks",
        cfg.batch_size
    );
    let per_rank = cfg.batch_size / world;
    let shares: Vec<(usize, Vec<usize>)> = sharding
        .ranks()
        .into_iter()
        .map(|rank| {
            let mut sampler = DistributedSampler::f_new(data.len(), world, rank)?.seed(cfg.seed);
            sampler.set_epoch(epoch as u64);
            Ok((rank, sampler.indices()))
        })
        .collect::<Result<_>>()?;
    let steps = shares[0].1.len() / per_rank;
    Ok((0..steps)
        .map(|s| {
            shares
                .iter()
                .map(|(rank, idx)| (*rank, idx[s * per_rank..(s + 1) * per_rank].to_vec()))
                .collect()
        })
        .collect())
}

/// The dropout seed of `rank`'s share at `step` (from 0): every run, and the reference
/// of a data-parallel run, draws the same masks for the same share.
pub fn dropout_seed(seed: u64, step: usize, rank: usize) -> i64 {
    (seed as i64).wrapping_mul(1_000_003) ^ (step as i64 + 1) ^ ((rank as i64) << 40)
}
