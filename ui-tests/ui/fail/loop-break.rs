//! A `break` ends a layer loop at a point only the data knows: its iterations cannot be
//! stages cut at run time.
use ckpt::checkpointed;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
}

impl Stack {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        'layers: for b in self.blocks.iter() {
            x = b.forward(&x);
            for _ in 0..2 {
                if x.numel() > 100 {
                    break 'layers;
                }
                break; // leaves the inner loop only: fine
            }
            if x.numel() > 10 {
                break;
            }
        }
        x.tanh()
    }
}

fn main() {}
