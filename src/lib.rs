//! `ckpt`: activation checkpointing (gradient checkpointing) for tch / libtorch.
#![doc = include_str!("../README.md")]

pub use ckpt_runtime::*;

#[doc = include_str!("../docs/checkpointed.md")]
pub use ckpt_macros::checkpointed;

/// Derives [`ShallowClone`](trait@ShallowClone) for a struct or an enum (generic ones
/// too): each field is copied with `ShallowClone` when its type implements it (tensors,
/// tch layers, other derived modules, numbers, `Vec`/`Option` of those) and with `Clone`
/// otherwise (configuration structs). Type parameters get a `ShallowClone` bound. A field
/// that is neither is a compile error on its type.
///
/// ```
/// use tch::{nn, Tensor};
///
/// #[derive(Clone, Debug)]
/// struct Config { dropout: f64 }
///
/// #[derive(Debug, ckpt::ShallowClone)]
/// struct Block {
///     attn: nn::Linear,
///     norm: nn::LayerNorm,
///     scale: Tensor,
///     config: Config, // by `Clone`
/// }
/// ```
pub use ckpt_macros::ShallowClone;

#[doc = include_str!("../docs/model.md")]
pub use ckpt_macros::model;

/// An explicit cut between two statements of a `#[checkpointed]` function (use it
/// instead of `segments = N`).
///
/// ```
/// # use tch::{Kind, Tensor};
/// #[ckpt::checkpointed]
/// fn f(xs: &Tensor) -> Tensor {
///     let a = xs.tanh();
///     ckpt::cut!();
///     let b = a.sigmoid();
///     ckpt::cut!();
///     b.sum(Kind::Float) // the last segment runs inline
/// }
/// # let _ = f(&Tensor::ones([2], (Kind::Float, tch::Device::Cpu)));
/// ```
///
/// It expands to nothing: outside `#[checkpointed]` (or nested in a block, which the
/// macro rejects) it has no effect.
#[macro_export]
macro_rules! cut {
    () => {};
}

#[doc(hidden)]
pub mod __private {
    pub use ckpt_runtime::__private::*;
    pub use tch;
}
