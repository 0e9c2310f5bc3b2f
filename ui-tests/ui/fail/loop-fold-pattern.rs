//! A `fold` over layers is cut between its iterations when it is bound to one name.
use ckpt::checkpointed;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
}

impl Stack {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let x = xs.relu();
        let (x, n) = self.blocks.iter().fold((x, 0), |(x, n), b| (b.forward(&x), n + 1));
        x.tanh() * n as f64
    }
}

fn main() {}
