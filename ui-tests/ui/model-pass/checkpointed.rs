//! A checkpointed `ModuleT` model with per-call values, a `#[field]`, repeated blocks
//! applied by a closure, and `#[train]` layers; backward through the segments.
use ckpt::ShallowClone;
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

#[derive(Debug, ShallowClone)]
struct Gated {
    lin: nn::Linear,
}

impl Gated {
    fn forward(&self, xs: &Tensor, gate: &Tensor, train: bool) -> Tensor {
        (xs.apply(&self.lin) * gate.sigmoid()).dropout(0.1, train) + xs
    }
}

#[derive(Debug, ShallowClone)]
struct Noise;

impl ModuleT for Noise {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        if train {
            xs + xs.randn_like() * 0.01
        } else {
            xs.shallow_clone()
        }
    }
}

ckpt::model! {
    #[checkpointed(segments = 3, preserve_rng_state = true, determinism_check = false)]
    struct Net(p, d: i64, layers: usize) {
        let gate: Tensor = xs.mean_dim(-1, true, Kind::Float),
        #[field] d: i64 = d,
        inp: nn::Linear = nn::linear(p, d, d, Default::default()),
        #[train] noise: Noise = Noise,
        blocks: [Gated; layers] = Gated { lin: nn::linear(p, d, d, Default::default()) }
            => |b, xs, train| b.forward(xs, &gate, train),
        dropout(0.2),
        |xs| xs.sum_dim_intlist(-1, false, Kind::Float),
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs.root(), 6, 4);
    assert_eq!(net.d, 6);
    let x = Tensor::randn([3, 6], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let before = ckpt::live_segments();
    let y = net.forward_t(&x, true);
    assert_eq!(ckpt::live_segments() - before, 2);
    assert_eq!(y.size(), [3]);
    y.sum(Kind::Float).backward();
    assert!(x.grad().defined());
    for (name, v) in vs.variables() {
        assert!(v.grad().defined(), "{name}");
    }
}
