//! [`checkpoint_sequential`]: checkpoint a chain of modules in segments.

use std::ops::Range;
use std::panic::Location;

use tch::Tensor;
use tch::nn::{Module, ModuleT};

use crate::checkpoint::{self, CheckpointOptions, Policy};
use crate::contract::module_segment_name;
use crate::plan::SegmentMode;
use crate::{CkptError, ShallowClone};

/// How [`checkpoint_sequential`] cuts `len` modules into `segments` groups, as PyTorch's
/// `torch.utils.checkpoint.checkpoint_sequential` does: every group but the last has
/// `len / segments` modules; the last group takes the rest, and it is **not**
/// checkpointed (its activations are needed at once by backward).
///
/// `segments` larger than `len` is clamped to `len` (PyTorch raises an error there);
/// `segments = 1` means one plain group, nothing checkpointed. `len = 0` gives one empty
/// group.
///
/// # Errors
///
/// [`CkptError::InvalidArgument`] when `segments` is 0.
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// # use ckpt::sequential_segments;
/// assert_eq!(sequential_segments(6, 3).unwrap(), vec![0..2, 2..4, 4..6]);
/// assert_eq!(sequential_segments(7, 3).unwrap(), vec![0..2, 2..4, 4..7]);
/// assert_eq!(sequential_segments(2, 5).unwrap(), vec![0..1, 1..2]);
/// ```
pub fn sequential_segments(len: usize, segments: usize) -> Result<Vec<Range<usize>>, CkptError> {
    if segments == 0 {
        return Err(CkptError::InvalidArgument(
            "segments = 0: there must be at least one segment (segments = 1 checkpoints nothing)"
                .into(),
        ));
    }
    Ok(ckpt_budget::sequential_ranges(len, segments))
}

/// Runs `input` through `modules` in order, checkpointing all but the last of `segments`
/// groups (see [`sequential_segments`] for the grouping). Gradients equal those of
/// running the modules one after the other.
///
/// Each checkpointed group stashes its input tensor (`[batch, ..]` as the modules
/// expect) and a [`ShallowClone`] of its modules (which shares their parameters, so
/// gradients land in the `VarStore`). Peak memory of a chain of `L` equal layers falls
/// from about `L` activations to `L / segments` plus `segments` stashed inputs.
///
/// **Choosing the cuts.** Equal groups are rarely the best cuts. To cut where a memory
/// budget is met with the least recompute, or for the least peak, use
/// [`checkpoint_sequential_plan`](crate::checkpoint_sequential_plan) with a
/// [`Plan`](crate::plan::Plan) from the planner
/// ([`profile_sequential`](crate::plan::profile_sequential) then
/// [`ChainCost::plan`](crate::plan::ChainCost::plan)), or
/// [`SequentialPlanner`](crate::plan::SequentialPlanner), which profiles once per input
/// shape and caches the plan.
///
/// # Panics
///
/// When [`f_checkpoint_sequential`] returns an error.
#[track_caller]
pub fn checkpoint_sequential<M>(modules: &[M], segments: usize, input: &Tensor) -> Tensor
where
    M: Module + ShallowClone + 'static,
{
    f_checkpoint_sequential(modules, segments, input).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`checkpoint_sequential`].
///
/// # Errors
///
/// [`CkptError::InvalidArgument`] for `segments = 0`; as [`crate::f_checkpoint`] for a
/// failing module ([`CkptError::ClosurePanicked`] when a module panics, in a
/// checkpointed group or in the last, plain one, with or without grad).
#[track_caller]
pub fn f_checkpoint_sequential<M>(
    modules: &[M],
    segments: usize,
    input: &Tensor,
) -> Result<Tensor, CkptError>
where
    M: Module + ShallowClone + 'static,
{
    let ranges = sequential_segments(modules.len(), segments)?;
    run_chain(modules, &ranges, &[], input, |m: &M, xs: &Tensor| {
        m.forward(xs)
    })
}

/// [`checkpoint_sequential`] for [`ModuleT`] modules, which take the train flag
/// (dropout, batch norm).
///
/// # Panics
///
/// When [`f_checkpoint_sequential_t`] returns an error.
#[track_caller]
pub fn checkpoint_sequential_t<M>(
    modules: &[M],
    segments: usize,
    input: &Tensor,
    train: bool,
) -> Tensor
where
    M: ModuleT + ShallowClone + 'static,
{
    f_checkpoint_sequential_t(modules, segments, input, train).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`checkpoint_sequential_t`].
///
/// # Errors
///
/// As [`f_checkpoint_sequential`].
#[track_caller]
pub fn f_checkpoint_sequential_t<M>(
    modules: &[M],
    segments: usize,
    input: &Tensor,
    train: bool,
) -> Result<Tensor, CkptError>
where
    M: ModuleT + ShallowClone + 'static,
{
    let ranges = sequential_segments(modules.len(), segments)?;
    run_chain(modules, &ranges, &[], input, move |m: &M, xs: &Tensor| {
        m.forward_t(xs, train)
    })
}

/// Runs `input` through `modules` grouped by `ranges` (contiguous, in order, covering
/// `0..modules.len()`, at least one): every range but the last is a segment that is
/// checkpointed or kept, the last runs plainly. [`sequential_segments`] and the planner
/// (`crate::plan`) make the ranges; segment `k` runs as `modes[k]` says: checkpointed
/// with its policy, or kept (inline, with grad); full recompute where `modes` has no
/// entry. Segments are named by
/// `module_segment_name`, at the caller's location.
#[track_caller]
pub(crate) fn run_chain<M, G>(
    modules: &[M],
    ranges: &[Range<usize>],
    modes: &[SegmentMode],
    input: &Tensor,
    step: G,
) -> Result<Tensor, CkptError>
where
    M: ShallowClone + Send + 'static,
    G: Fn(&M, &Tensor) -> Tensor + Copy + Send + 'static,
{
    let at = Location::caller();
    let name = |k: usize, range: &Range<usize>| {
        module_segment_name("checkpoint_sequential", k, ranges.len(), range, at)
    };
    let (last, checkpointed) = ranges.split_last().expect("at least one group");
    let mut xs = input.shallow_clone();
    for (k, range) in checkpointed.iter().enumerate() {
        let group: Vec<M> = modules[range.clone()]
            .iter()
            .map(ShallowClone::shallow_clone)
            .collect();
        // The group's tensors are inputs of its node (`CheckpointOptions::parameters_of`).
        let policy = match modes.get(k) {
            Some(SegmentMode::Kept) => {
                // A kept segment runs once, inline, with grad (the planner's choice).
                xs = checkpoint::run_plain(|| name(k, range), || chain(&group, xs, step))?;
                continue;
            }
            Some(m) => m.policy(),
            None => Policy::RECOMPUTE_ALL,
        };
        let options = CheckpointOptions::new()
            .parameters_of(&group)
            .policy(policy);
        let segment = name(k, range);
        xs = checkpoint::run(
            &options,
            segment,
            move |x: Tensor| chain(&group, x, step),
            xs,
        )?;
    }
    checkpoint::run_plain(
        || name(checkpointed.len(), last),
        || chain(&modules[last.clone()], xs, step),
    )
}

/// Runs `xs` through `modules` one after the other.
pub(crate) fn chain<M, G: Fn(&M, &Tensor) -> Tensor>(modules: &[M], xs: Tensor, step: G) -> Tensor {
    modules.iter().fold(xs, |xs, m| step(m, &xs))
}
