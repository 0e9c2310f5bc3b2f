//! `Module::forward` and `ModuleT::forward_t` in trait impls.
use ckpt::{checkpointed, ShallowClone};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

#[derive(Debug, ShallowClone)]
struct Block {
    lin: nn::Linear,
}

impl Module for Block {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let h = self.lin.forward(xs).relu();
        h + xs
    }
}

#[derive(Debug, ShallowClone)]
struct Net {
    a: Block,
    b: Block,
}

impl ModuleT for Net {
    #[checkpointed(segments = 2, preserve_rng_state = true, determinism_check = true)]
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let h = self.a.forward(xs).dropout(0.5, train);
        self.b.forward(&h)
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let lin = |name: &str| nn::linear(vs.root() / name, 4, 4, Default::default());
    let net = Net { a: Block { lin: lin("a") }, b: Block { lin: lin("b") } };
    let xs = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
    net.forward_t(&xs, true).sum(Kind::Float).backward();
    assert!(net.a.lin.ws.grad().defined());
}
