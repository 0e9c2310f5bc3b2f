use ckpt::checkpointed;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Model {
    lin: nn::Linear,
    scale: Tensor,
}

impl Model {
    #[checkpointed]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let ys = self.lin.forward(xs) * self.scale.shallow_clone().f_mul_scalar_(2.0).unwrap();
        let ok = ys.shallow_clone().relu_();
        let _ = Tensor::zero_(&mut self.scale.shallow_clone());
        ckpt::cut!();
        ys.tanh() + ok
    }
}

fn main() {}
