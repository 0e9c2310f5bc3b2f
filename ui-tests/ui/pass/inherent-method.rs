//! A `&self` method of an inherent impl, `self` used in several segments.
use ckpt::{checkpointed, ShallowClone};
use tch::{nn, nn::Module, Device, Kind, Tensor};

#[derive(Debug, ShallowClone)]
struct Mlp {
    l1: nn::Linear,
    l2: nn::Linear,
}

impl Mlp {
    #[checkpointed(segments = 2)]
    pub fn forward(&self, xs: &Tensor) -> Tensor {
        let h = self.l1.forward(xs).relu();
        self.l2.forward(&h)
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let mlp = Mlp {
        l1: nn::linear(vs.root() / "l1", 4, 8, Default::default()),
        l2: nn::linear(vs.root() / "l2", 8, 2, Default::default()),
    };
    let xs = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
    mlp.forward(&xs).sum(Kind::Float).backward();
    assert!(mlp.l1.ws.grad().defined());
}
