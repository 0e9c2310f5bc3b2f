//! The benchmarked models, as the PyTorch side (`torch_side.py`) builds them too.

use tch::Tensor;
use tch::nn::{self, Module};

pub use ckpt_models::classifier;

/// A residual MLP block: `x + l2(gelu(l1(x)))`, `[batch, d] → [batch, d]`.
#[derive(Debug, ckpt::ShallowClone)]
pub struct ResidualBlock {
    l1: nn::Linear,
    l2: nn::Linear,
}

impl Module for ResidualBlock {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + self.l2.forward(&self.l1.forward(xs).gelu("none"))
    }
}

/// `layers` residual blocks of width `d` and hidden width `hidden`, under `p / i`.
pub fn residual_mlp(p: &nn::Path, layers: usize, d: i64, hidden: i64) -> Vec<ResidualBlock> {
    (0..layers)
        .map(|i| ResidualBlock {
            l1: nn::linear(p / i / "l1", d, hidden, Default::default()),
            l2: nn::linear(p / i / "l2", hidden, d, Default::default()),
        })
        .collect()
}
