//! `DistributedSampler`: each rank's share of a dataset's indices.

use crate::CkptError;

/// PyTorch's `torch.utils.data.DistributedSampler`: each rank gets a disjoint, strided
/// share (`indices[rank..total; world_size]`) of a permutation of `0..len` that every rank
/// computes alike from `seed + epoch`, so that an epoch covers the dataset once.
///
/// - `drop_last = false` (PyTorch's default): the permutation is padded with its own
///   first indices up to a multiple of `world_size`, so each rank gets
///   `ceil(len / world_size)` indices and a few samples are seen twice.
/// - `drop_last = true`: the tail is dropped, each rank gets `floor(len / world_size)`.
///
/// The permutation is a Fisher–Yates shuffle driven by SplitMix64 (seeded by `seed +
/// epoch`), the same on every rank and every platform; it is not `torch.randperm`'s.
/// Call [`DistributedSampler::set_epoch`] at each epoch for a new order.
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// use ckpt::dist::DistributedSampler;
/// // 10 samples over 3 ranks: 4 each, 2 samples seen twice in the epoch.
/// let mut shares: Vec<usize> = (0..3)
///     .flat_map(|rank| DistributedSampler::new(10, 3, rank).seed(7).indices())
///     .collect();
/// assert_eq!(shares.len(), 12);
/// shares.sort();
/// shares.dedup();
/// assert_eq!(shares, (0..10).collect::<Vec<_>>());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    world_size: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
}

impl DistributedSampler {
    /// A sampler over `len` samples for `rank` of `world_size`; shuffled, seed 0, tail
    /// padded (PyTorch's defaults).
    ///
    /// # Panics
    ///
    /// On the errors of [`DistributedSampler::f_new`].
    pub fn new(len: usize, world_size: usize, rank: usize) -> Self {
        Self::f_new(len, world_size, rank).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`DistributedSampler::new`]; `Err(InvalidArgument)` when `world_size` is 0 or
    /// `rank >= world_size` (PyTorch's `ValueError`).
    pub fn f_new(len: usize, world_size: usize, rank: usize) -> Result<Self, CkptError> {
        if world_size == 0 || rank >= world_size {
            return Err(CkptError::InvalidArgument(format!(
                "invalid rank {rank} for a world of {world_size}: ranks are 0..{world_size}"
            )));
        }
        Ok(DistributedSampler {
            len,
            world_size,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: 0,
        })
    }

    /// Shuffle (default) or keep `0..len` in order.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The seed every rank shares (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail instead of padding (default `false`).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Sets the epoch, which reseeds the permutation (`seed + epoch`).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Number of indices each rank gets.
    pub fn num_samples(&self) -> usize {
        if self.drop_last && !self.len.is_multiple_of(self.world_size) {
            // PyTorch: ceil((len - world) / world), i.e. floor(len / world).
            self.len / self.world_size
        } else {
            self.len.div_ceil(self.world_size)
        }
    }

    /// Total indices over all ranks (`num_samples * world_size`).
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.world_size
    }

    /// This rank's indices for the current epoch, `num_samples()` of them.
    pub fn indices(&self) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut state = self.seed.wrapping_add(self.epoch);
            for i in (1..all.len()).rev() {
                let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
                all.swap(i, j);
            }
        }
        let total = self.total_size();
        if self.drop_last {
            all.truncate(total);
        } else if self.len > 0 {
            let mut k = 0;
            while all.len() < total {
                all.push(all[k % self.len]);
                k += 1;
            }
        }
        all.into_iter()
            .skip(self.rank)
            .step_by(self.world_size)
            .take(self.num_samples())
            .collect()
    }
}

/// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
/// OOPSLA 2014).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_partition_a_padded_permutation() {
        for (len, world) in [(10, 3), (9, 3), (1, 4), (7, 2), (0, 2)] {
            let shares: Vec<Vec<usize>> = (0..world)
                .map(|r| DistributedSampler::new(len, world, r).seed(5).indices())
                .collect();
            let n = len.div_ceil(world);
            assert!(shares.iter().all(|s| s.len() == n), "{len} {world}");
            let mut seen: Vec<usize> = shares.concat();
            seen.sort();
            let mut distinct = seen.clone();
            distinct.dedup();
            assert_eq!(distinct, (0..len).collect::<Vec<_>>(), "{len} {world}");
            assert_eq!(seen.len() - distinct.len(), n * world - len);
        }
    }

    #[test]
    fn drop_last_gives_disjoint_floor_shares() {
        let shares: Vec<Vec<usize>> = (0..3)
            .map(|r| DistributedSampler::new(10, 3, r).drop_last(true).indices())
            .collect();
        assert!(shares.iter().all(|s| s.len() == 3));
        let mut all = shares.concat();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 9);
    }

    #[test]
    fn unshuffled_is_strided_range_and_epoch_reseeds() {
        let s = DistributedSampler::new(7, 2, 1).shuffle(false);
        assert_eq!(s.indices(), vec![1, 3, 5, 0]);
        let mut a = DistributedSampler::new(100, 2, 0);
        let e0 = a.indices();
        assert_eq!(e0, DistributedSampler::new(100, 2, 0).indices());
        a.set_epoch(1);
        assert_ne!(a.indices(), e0);
    }

    #[test]
    fn bad_rank_is_an_error() {
        assert!(matches!(
            DistributedSampler::f_new(10, 2, 2),
            Err(CkptError::InvalidArgument(_))
        ));
        assert!(DistributedSampler::f_new(10, 0, 0).is_err());
    }
}
