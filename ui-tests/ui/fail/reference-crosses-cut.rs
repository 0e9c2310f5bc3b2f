use ckpt::checkpointed;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Model {
    lin: nn::Linear,
}

impl Model {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let lin = &self.lin;
        let ys = xs.relu();
        lin.forward(&ys)
    }
}

fn main() {}
