//! `ckpt`: activation checkpointing (gradient checkpointing) for tch / libtorch.
#![doc = include_str!("../README.md")]

pub use ckpt_runtime::*;

#[doc(hidden)]
pub mod __private {
    pub use ckpt_runtime::__private::*;
    pub use tch;
}
