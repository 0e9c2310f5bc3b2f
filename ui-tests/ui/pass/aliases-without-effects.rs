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

/// Changes to the local, not to what it aliased: a handle rebound by assignment, two
/// handles swapped, an `Option<&Tensor>` taken, and tch's out-of-place `take(&index)`
/// and `set()` and `str::replace(from, to)`, which share names with mutating methods.
#[checkpointed]
fn locals_change(
    xs: &Tensor,
    q: &Tensor,
    bias: &Option<Tensor>,
    idx: &Tensor,
    label: &str,
    flip: bool,
) -> Tensor {
    let h = {
        let mut h = xs.shallow_clone();
        for _ in 0..2 {
            h = h.tanh() * 2.0;
        }
        let _ = h.relu_();
        h
    };
    let (mut a, mut b) = (xs.shallow_clone(), q.shallow_clone());
    if flip {
        std::mem::swap(&mut a, &mut b);
    }
    let mut bias = bias.as_ref();
    if flip {
        bias.take();
    }
    let g = xs.flatten(0, -1).take(idx) + xs.detach().set().sum(Kind::Float);
    let n = label.replace("a", "bb").len() as f64;
    let shift = bias.map_or(0.0, |b| b.sum(Kind::Float).double_value(&[]));
    let y = &h + &a * &b + g.sum(Kind::Float) * n + shift;
    ckpt::cut!();
    y.sum(Kind::Float)
}

fn main() {
    let xs = Tensor::randn([2, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let q = Tensor::randn([2, 3], (Kind::Float, Device::Cpu));
    let idx = Tensor::from_slice(&[0i64, 4]);
    let bias = Tensor::ones([3], (Kind::Float, Device::Cpu));
    locals_change(&xs, &q, &Some(bias), &idx, "abc", true).backward();
    assert!(xs.grad().defined());
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
