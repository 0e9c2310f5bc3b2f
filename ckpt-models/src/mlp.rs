//! The MLP chain of `tests/memory.rs` (what checkpointing saves, in exact bytes) and of
//! `bench/benches/runtime.rs` (what a training step costs): layers of Linear then GELU,
//! as in transformer feed-forward blocks.

use ckpt::ShallowClone;
use tch::nn::{self, Module};
use tch::{Device, Tensor};

/// One layer, `gelu(linear(x))`, `[batch, width] → [batch, width]`: it keeps its input
/// (for the weight gradient) and its pre-activation (for GELU's derivative). Its
/// `ShallowClone` keeps the default `visit_tensors` (the weights stay unlisted), as the
/// figures of `tests/memory.rs` were measured.
#[derive(Debug)]
pub struct GeluLayer(pub nn::Linear);

impl ShallowClone for GeluLayer {
    fn shallow_clone(&self) -> Self {
        GeluLayer(self.0.shallow_clone())
    }
}

impl Module for GeluLayer {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.0.forward(xs).gelu("none")
    }
}

/// `layers` layers of `width` features in a fresh CPU `VarStore` (layer `i` under the
/// path `i`), tch's default initialisation.
pub fn gelu_chain(layers: usize, width: i64) -> (nn::VarStore, Vec<GeluLayer>) {
    let vs = nn::VarStore::new(Device::Cpu);
    let chain = (0..layers)
        .map(|i| GeluLayer(nn::linear(vs.root() / i, width, width, Default::default())))
        .collect();
    (vs, chain)
}
