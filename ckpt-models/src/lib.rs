//! Models and data shared by `ckpt`'s tests, benchmarks and examples, so that each is
//! written once: examples are programs, and nothing includes their files (`#[path]`) to
//! reuse a model. Not published; depend on it as a dev-dependency.
//!
//! - [`classifier`], [`data`], [`listops`], [`text`]: the main program's
//!   (`examples/train_classifier`) transformer encoder classifier, its data sets and its
//!   two tasks;
//! - [`encoder`]: the encoder of `examples/encoder.rs` and the planner's tests, declared
//!   with `model!` and as a hand-written loop;
//! - [`mlp`]: the Linear+GELU chain of the memory tests and the runtime benchmark;
//! - [`resnet`]: a ResNet with batch norm for the correctness tests;
//! - [`stats`]: the median of repeated measurements.

pub mod classifier;
pub mod data;
pub mod encoder;
pub mod listops;
pub mod mlp;
pub mod resnet;
pub mod stats;
pub mod text;
