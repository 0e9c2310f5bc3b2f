//! The iterable of a layer loop cut at run time is evaluated again in backward: it may
//! use only `self` and the parameters.
use ckpt::checkpointed;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
}

impl Stack {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let blocks = &self.blocks;
        let mut x = xs.relu();
        for b in blocks.iter() {
            x = b.forward(&x);
        }
        x.tanh()
    }
}

fn main() {}
