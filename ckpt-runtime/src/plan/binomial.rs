//! Binomial checkpointing (Griewank and Walther, "Algorithm 799: revolve", ACM TOMS
//! 26(1), 2000): nested segments that bring the stash of a chain of `L` stages down to
//! `s` inputs, at the price of recomputing each stage up to `r` times, where `r` is the
//! least number with `C(s + r, s) >= L`.

use std::ops::Range;
use std::panic::Location;

use tch::Tensor;
use tch::nn::{Module, ModuleT};

use crate::checkpoint::{self, CheckpointOptions};
use crate::contract::module_segment_name;
use crate::sequential::chain;
use crate::{CkptError, ShallowClone};

/// `β(s, r) = C(s + r, s)`: the longest chain that `s` stashes and `r` recomputes of
/// each stage can reverse (saturating at `usize::MAX`).
pub fn binomial_capacity(snapshots: usize, repetitions: usize) -> usize {
    // C(s + r, s) = C(s + r, k) with k = min(s, r) = prod_{i=1..k} (s + r - k + i) / i,
    // exact at every step; at most min(s, r) iterations, whatever the other argument.
    let k = snapshots.min(repetitions) as u128;
    let base = (snapshots.max(repetitions)) as u128;
    let mut c: u128 = 1;
    for i in 1..=k {
        c = c * (base + i) / i;
        if c >= usize::MAX as u128 {
            return usize::MAX;
        }
    }
    c as usize
}

/// The least number of recomputes `r` of a stage with which `snapshots` stashes reverse a
/// chain of `len` stages: the least `r` with `C(snapshots + r, snapshots) >= len`.
/// `None` when `snapshots` is 0 and `len > 1` (nothing can be stashed; the chain runs
/// plainly).
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// use ckpt::plan::binomial_repetitions;
/// assert_eq!(binomial_repetitions(64, 3), Some(6)); // C(9, 3) = 84 >= 64 > C(8, 3) = 56
/// assert_eq!(binomial_repetitions(64, 63), Some(1));
/// assert_eq!(binomial_repetitions(1, 0), Some(0));
/// ```
pub fn binomial_repetitions(len: usize, snapshots: usize) -> Option<usize> {
    if len <= 1 {
        return Some(0);
    }
    if snapshots == 0 {
        return None;
    }
    (1..).find(|&r| binomial_capacity(snapshots, r) >= len)
}

/// Runs `input` through `modules` with binomial checkpointing: a chain of `L` stages with
/// at most `snapshots` stashed segment inputs alive at any time besides the chain's input,
/// each stage recomputed at most [`binomial_repetitions`]`(L, snapshots)` times in
/// backward. On top of the stashes: about one stage's activations, the RNG state copies
/// of the live segments, and the output gradient that each enclosing segment holds while
/// its replay runs (one activation per nesting level). On the 64-block residual chain of
/// `tests/plan.rs` 3 stashes (6 recomputes) peak at 11.3 activations against 18.3 for the
/// best one-level plan. Selected explicitly for very deep chains, where one level of
/// checkpoints ([`checkpoint_sequential_plan`](crate::checkpoint_sequential_plan), at
/// least about `2·sqrt(L)` activations) is not enough. Gradients equal those of running
/// the modules one after the other.
///
/// The schedule, recursively on a range of `n` stages whose input is already held (the
/// chain's input by the caller, a segment's input by its stash) with `s` more stashes
/// allowed: with `r` the least number with `C(s + r, s) >= n`, the first
/// `m = max(1, n − C(s − 1 + r, s − 1))` stages form a checkpointed segment (its stash is
/// the range's input: no new memory), and the other `n − m` stages are scheduled with
/// `s − 1` stashes (their input is the one new stash); in backward, that segment's replay
/// schedules its `m` stages again with `s` stashes (the later stages' memory is free by
/// then) and `r − 1` recomputes left. A range of one stage runs plainly. By Pascal's rule
/// `C(s + r, s) = C(s + r − 1, s) + C(s − 1 + r, s − 1)` both parts fit, which is
/// Griewank and Walther's binomial bound `β(s, r)`, reached here with nested checkpoints
/// (each replay of a segment checkpoints its sub-segments again) instead of revolve's
/// explicit sequence of actions. It is the recursive checkpointing of Chen et al.
/// (arXiv:1604.06174, section 4.2) with the optimal split.
///
/// # Panics
///
/// When [`f_checkpoint_sequential_binomial`] returns an error.
#[track_caller]
pub fn checkpoint_sequential_binomial<M>(modules: &[M], snapshots: usize, input: &Tensor) -> Tensor
where
    M: Module + ShallowClone + 'static,
{
    f_checkpoint_sequential_binomial(modules, snapshots, input).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`checkpoint_sequential_binomial`].
///
/// # Errors
///
/// [`CkptError::InvalidArgument`] for `snapshots = 0` with more than one module; as
/// [`crate::f_checkpoint`] for a failing module.
#[track_caller]
pub fn f_checkpoint_sequential_binomial<M>(
    modules: &[M],
    snapshots: usize,
    input: &Tensor,
) -> Result<Tensor, CkptError>
where
    M: Module + ShallowClone + 'static,
{
    check(modules.len(), snapshots)?;
    run(
        modules,
        snapshots.min(modules.len()),
        0,
        input.shallow_clone(),
        |m: &M, xs: &Tensor| m.forward(xs),
        Location::caller(),
    )
}

/// [`checkpoint_sequential_binomial`] for [`ModuleT`] modules, with the train flag.
///
/// # Panics
///
/// When [`f_checkpoint_sequential_binomial_t`] returns an error.
#[track_caller]
pub fn checkpoint_sequential_binomial_t<M>(
    modules: &[M],
    snapshots: usize,
    input: &Tensor,
    train: bool,
) -> Tensor
where
    M: ModuleT + ShallowClone + 'static,
{
    f_checkpoint_sequential_binomial_t(modules, snapshots, input, train)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`checkpoint_sequential_binomial_t`].
///
/// # Errors
///
/// As [`f_checkpoint_sequential_binomial`].
#[track_caller]
pub fn f_checkpoint_sequential_binomial_t<M>(
    modules: &[M],
    snapshots: usize,
    input: &Tensor,
    train: bool,
) -> Result<Tensor, CkptError>
where
    M: ModuleT + ShallowClone + 'static,
{
    check(modules.len(), snapshots)?;
    run(
        modules,
        snapshots.min(modules.len()),
        0,
        input.shallow_clone(),
        move |m: &M, xs: &Tensor| m.forward_t(xs, train),
        Location::caller(),
    )
}

fn check(len: usize, snapshots: usize) -> Result<(), CkptError> {
    if binomial_repetitions(len, snapshots).is_none() {
        return Err(CkptError::InvalidArgument(format!(
            "snapshots = 0 for a chain of {len} stages: binomial checkpointing needs at least one stash (checkpoint_sequential with segments = 1 runs the chain plainly)"
        )));
    }
    Ok(())
}

/// The segments of one level of the schedule of the function docs on `n` stages with
/// `snapshots` stashes: each checkpointed segment takes the first `m` stages of what is
/// left and one stash fewer for the rest; the last range runs plainly.
fn level_ranges(n: usize, snapshots: usize) -> Vec<Range<usize>> {
    let (mut ranges, mut start, mut s) = (Vec::new(), 0, snapshots);
    while let Some(r) = binomial_repetitions(n - start, s).filter(|&r| r > 0) {
        let m = (n - start)
            .saturating_sub(binomial_capacity(s - 1, r))
            .max(1);
        ranges.push(start..start + m);
        start += m;
        s -= 1;
    }
    ranges.push(start..n);
    ranges
}

/// Runs the schedule of the function docs on `modules` (stage indices offset by
/// `offset`, for segment names at `at`): each checkpointed segment of
/// [`level_ranges`] replays its stages with the same schedule, one level down.
fn run<M, G>(
    modules: &[M],
    snapshots: usize,
    offset: usize,
    xs: Tensor,
    step: G,
    at: &'static Location<'static>,
) -> Result<Tensor, CkptError>
where
    M: ShallowClone + Send + 'static,
    G: Fn(&M, &Tensor) -> Tensor + Copy + Send + 'static,
{
    let ranges = level_ranges(modules.len(), snapshots);
    let name = |k: usize, range: &Range<usize>| {
        let stages = range.start + offset..range.end + offset;
        module_segment_name(FUNCTION, k, ranges.len(), &stages, at)
    };
    let (last, checkpointed) = ranges.split_last().expect("at least one range");
    let mut xs = xs;
    for (k, range) in checkpointed.iter().enumerate() {
        let group: Vec<M> = modules[range.clone()]
            .iter()
            .map(ShallowClone::shallow_clone)
            .collect();
        let (s, start) = (snapshots - k, offset + range.start);
        xs = checkpoint::run(
            &CheckpointOptions::new(),
            name(k, range),
            move |x: Tensor| run(&group, s, start, x, step, at).unwrap_or_else(|e| panic!("{e}")),
            xs,
        )?;
    }
    checkpoint::run_plain(
        || name(checkpointed.len(), last),
        || chain(&modules[last.clone()], xs, step),
    )
}

const FUNCTION: &str = "checkpoint_sequential_binomial";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_are_binomial_coefficients() {
        assert_eq!(binomial_capacity(3, 6), 84);
        assert_eq!(binomial_capacity(6, 3), 84);
        // Huge arguments cost min(s, r) steps: no hang.
        assert_eq!(binomial_capacity(usize::MAX, 1), usize::MAX);
        assert_eq!(binomial_capacity(1_000_000_000, 2), 500_000_001_500_000_001);
        assert_eq!(binomial_repetitions(4, usize::MAX), Some(1));
        assert_eq!(binomial_capacity(3, 5), 56);
        assert_eq!(binomial_capacity(0, 9), 1);
        assert_eq!(binomial_capacity(5, 0), 1);
        assert_eq!(binomial_capacity(200, 200), usize::MAX);
        for s in 1..6 {
            for r in 1..6 {
                assert_eq!(
                    binomial_capacity(s, r),
                    binomial_capacity(s - 1, r) + binomial_capacity(s, r - 1),
                    "Pascal's rule at ({s}, {r})"
                );
            }
        }
        assert_eq!(binomial_repetitions(2, 0), None);
        assert_eq!(binomial_repetitions(1000, 4), Some(10)); // C(14, 4) = 1001
    }
}
