//! Locals that alias outside values are fine as long as nothing is changed through
//! them: reads, out-of-place ops, a copy then changed, a local rebound, a closure over
//! an outside `Option`, and a new collection built inside the segment.
use ckpt::checkpointed;
use tch::{nn, nn::Module, Device, Kind, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Model {
    lin: nn::Linear,
    scale: Tensor,
    bias: Option<Tensor>,
    steps: i64,
}

impl Model {
    #[checkpointed(segments = 3)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let s = self.scale.shallow_clone();
        let lin = &self.lin;
        let mut ys = lin.forward(xs) * &s;
        ys = ys.relu();
        let mut n = self.steps;
        n += 1;
        let ys = match self.bias.as_ref().map(|b| &ys + b) {
            Some(y) => y,
            None => ys,
        };
        let mut parts = Vec::new();
        parts.push(ys.sigmoid());
        let mut t = ys;
        t = t * (n as f64);
        parts.push(t);
        Tensor::cat(&parts, 1).sum(Kind::Float)
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Model {
        lin: nn::linear(vs.root(), 3, 3, Default::default()),
        scale: Tensor::ones([3], (Kind::Float, Device::Cpu)),
        bias: Some(Tensor::zeros([3], (Kind::Float, Device::Cpu))),
        steps: 1,
    };
    let xs = Tensor::randn([2, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    m.forward(&xs).backward();
    assert!(xs.grad().defined());
}
