//! With a layer loop, `segments = N` cuts at run time: `?` belongs in the last statement.
use ckpt::checkpointed;
use tch::{nn, nn::Module, TchError, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
}

impl Stack {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Result<Tensor, TchError> {
        let mut x = xs.f_relu()?;
        for b in self.blocks.iter() {
            x = b.forward(&x);
        }
        x.f_tanh()
    }
}

fn main() {}
