use ckpt::checkpointed;
use tch::nn::{Linear, Module};
use tch::Tensor;

struct M {
    blocks: Vec<Linear>,
}

impl M {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        #[ckpt::keep]
        let mut h = xs.relu();
        for b in self.blocks.iter() {
            h = b.forward(&h);
        }
        h
    }
}

fn main() {}
