use ckpt::checkpointed;
use std::sync::Mutex;
use tch::{nn, nn::Module, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Model {
    lin: nn::Linear,
}

impl Model {
    #[checkpointed(segments = 3)]
    fn forward(&self, mut xs: Tensor, seen: &Mutex<Vec<i64>>) -> Tensor {
        println!("start");
        let _ = xs.relu_();
        let ys = self.lin.forward(&xs);
        seen.lock().unwrap().push(1);
        let zs = ys.sigmoid();
        zs.tanh()
    }
}

fn main() {}
