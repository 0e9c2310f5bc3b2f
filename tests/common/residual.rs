//! The chain of `tests/plan_keep.rs` (a `model!`) and `tests/fn_keep.rs` (functions):
//! residual blocks after a stage that is dear to recompute and cheap to keep.

use std::time::Duration;

use ckpt::ShallowClone;
use ckpt::plan::{Plan, SegmentMode};
use tch::Tensor;
use tch::nn::{self, Module};

/// The blocks' width.
pub const D: i64 = 64;

/// `x + relu(linear(x))`, the block of `tests/plan.rs` (the cost model's figures for it
/// are within a few percent of the measured ones).
#[derive(Debug, ShallowClone)]
pub struct Block {
    lin: nn::Linear,
}

impl Block {
    pub fn new(p: nn::Path) -> Self {
        Block {
            lin: nn::linear(p, D, D, Default::default()),
        }
    }
}

impl Module for Block {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + xs.apply(&self.lin).relu()
    }
}

/// Dear to recompute, cheap to keep: `tanh` (which keeps its output, one activation)
/// that takes 150 ms, far above the blocks' times and their noise.
pub fn slow(xs: &Tensor) -> Tensor {
    std::thread::sleep(Duration::from_millis(150));
    xs.tanh()
}

/// Whether the plan keeps any segment.
pub fn keeps(plan: &Plan) -> bool {
    (0..plan.segments()).any(|j| plan.mode(j) == SegmentMode::Kept)
}
