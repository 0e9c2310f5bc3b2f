//! A layer loop's iterations are counted when the function is called: its iterable may
//! not use a `mut` parameter, which the body could change first.
use ckpt::checkpointed;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
}

impl Stack {
    #[checkpointed(segments = 3)]
    fn first_n(&self, xs: &Tensor, mut n: usize) -> Tensor {
        n = n + 2;
        let mut x = xs.shallow_clone();
        for b in self.blocks.iter().take(n) {
            x = b.forward(&x).tanh();
        }
        x
    }
}

fn main() {}
