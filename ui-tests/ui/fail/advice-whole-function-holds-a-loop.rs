//! Checkpointing a whole model forward holds its layer loop in one segment: the
//! recompute rebuilds every block's activations at once. The advice is a warning
//! (`deprecated`, the only warning a macro can give on stable Rust), an error here.
#![deny(deprecated)]
use ckpt::checkpointed;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
}

impl Stack {
    #[checkpointed]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for b in self.blocks.iter() {
            x = b.forward(&x);
        }
        x
    }
}

fn main() {}
