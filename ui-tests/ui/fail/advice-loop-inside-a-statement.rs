//! A loop inside a `let` block is one statement: a checkpointed segment holds it whole.
#![deny(deprecated)]
use ckpt::checkpointed;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
}

impl Stack {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let x = {
            let mut x = xs.relu();
            for b in &self.blocks {
                x = b.forward(&x);
            }
            x
        };
        x.tanh()
    }
}

fn main() {}
