//! Runtime of [`ckpt`](https://docs.rs/ckpt): activation checkpointing for tch.
//!
//! Use it through the `ckpt` facade crate, which re-exports everything here along with
//! the `#[checkpointed]` and `model!` macros. The pieces:
//!
//! - [`checkpoint`] / [`f_checkpoint`] / [`checkpoint_with`]: run a closure as a
//!   checkpointed segment through a libtorch autograd node (`csrc/ckpt.cpp`).
//! - [`checkpoint_sequential`]: PyTorch's `checkpoint_sequential` over a slice of modules.
//! - [`Stash`]: what may enter and leave a segment; [`ShallowClone`]: how module state
//!   enters it; [`Shared`] for modules that cannot be shallow-cloned.
//! - [`memory`]: exact current and peak tensor bytes on CPU and CUDA.
//! - [`amp`]: `torch.autocast` for CPU and CUDA (recomputes replay it).
//! - [`compact_dropout`]: CPU dropout that keeps its mask for backward as bits (1 bit an
//!   element instead of a noise tensor of the input's type), bit-equal results.
//! - [`plan`]: choose the cuts of a chain for a memory budget (profile, dynamic program,
//!   [`checkpoint_sequential_plan`]).
//! - [`dist`]: data-parallel training on PyTorch's c10d (process groups, collectives,
//!   [`dist::DistributedDataParallel`], [`dist::DistributedSampler`]).
//! - [`CkptError`]: the error of every `f_` function.

pub mod amp;
mod checkpoint;
mod contract;
pub mod dist;
mod dropout;
mod error;
mod ffi;
pub mod memory;
pub mod plan;
mod sequential;
mod shallow;
mod stash;

pub use checkpoint::{
    CheckpointOptions, Policy, checkpoint, checkpoint_with, f_checkpoint, f_checkpoint_with,
    is_recomputing, live_segments,
};
pub use dropout::{CompactDropoutGuard, compact_dropout, compact_dropout_guard};
#[doc(hidden)]
pub use dropout::{force_portable_draw, mask_draw_kernel};
pub use error::CkptError;
pub use plan::{
    checkpoint_sequential_plan, checkpoint_sequential_plan_t, f_checkpoint_sequential_plan,
    f_checkpoint_sequential_plan_t,
};
pub use sequential::{
    checkpoint_sequential, checkpoint_sequential_t, f_checkpoint_sequential,
    f_checkpoint_sequential_t, sequential_segments,
};
pub use shallow::{ShallowClone, Shared};
pub use stash::{Carry, Stash};

/// Locks `m`, recovering the data from a poisoned lock: a panic in a segment is reported
/// as an error (`CkptError::ClosurePanicked`), and the caches behind these locks stay
/// consistent across one (each update is one insertion or one clear).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What generated code calls (the `contract` module between the macros and the runtime),
/// re-exported by `ckpt::__private`; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::contract::*;
    pub use crate::{CheckpointOptions, ShallowClone, Shared, Stash};
}
