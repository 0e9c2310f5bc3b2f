//! Models shared by `ckpt`'s tests, benchmarks and examples, so that each is written
//! once: examples are programs, and nothing includes their files (`#[path]`) to reuse
//! a model. Not published; depend on it as a dev-dependency.

pub mod resnet;
