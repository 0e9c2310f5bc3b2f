//! A user trait: an annotated default method and an annotated impl method.
use ckpt::{checkpointed, ShallowClone};
use tch::{nn, nn::Module, Device, Kind, Tensor};

trait Encoder {
    fn layer(&self) -> &nn::Linear;

    #[checkpointed(segments = 2)]
    fn encode(&self, xs: &Tensor) -> Tensor
    where
        Self: ShallowClone + Send + Sized + 'static,
    {
        let h = self.layer().forward(xs).tanh();
        self.layer().forward(&h)
    }

    fn decode(&self, xs: &Tensor) -> Tensor;
}

#[derive(Debug, ShallowClone)]
struct Tiny {
    lin: nn::Linear,
}

impl Encoder for Tiny {
    fn layer(&self) -> &nn::Linear {
        &self.lin
    }

    #[checkpointed(segments = 2)]
    fn decode(&self, xs: &Tensor) -> Tensor {
        let h = self.lin.forward(xs).sigmoid();
        h * 2.0
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let t = Tiny { lin: nn::linear(vs.root(), 3, 3, Default::default()) };
    let xs = Tensor::randn([2, 3], (Kind::Float, Device::Cpu));
    (t.encode(&xs) + t.decode(&xs)).sum(Kind::Float).backward();
    assert!(t.lin.ws.grad().defined());
}
