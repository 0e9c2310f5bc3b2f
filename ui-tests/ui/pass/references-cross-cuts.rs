//! A `let` that refers to a parameter taken by reference (`let residual = xs;`) or to a
//! value of the function (`let residual = &xs;`) crosses a cut as what it refers to: a
//! shallow clone goes through the stash and is rebound as a reference on the other side
//! (CLIP's encoder layer writes its skip connections so).
use ckpt::checkpointed;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Layer {
    l1: nn::Linear,
    l2: nn::Linear,
}

macro_rules! twins {
    ([$($args:tt)*] $ckpt:ident $plain:ident $($rest:tt)*) => {
        #[checkpointed($($args)*)]
        fn $ckpt $($rest)*
        fn $plain $($rest)*
    };
}

impl Layer {
    twins!([segments = 4] fixed fixed_plain(&self, xs: &Tensor, names: &[Tensor], tag: &str) -> Tensor {
        let residual = xs;
        let all = names;
        let label = tag;
        let xs = self.l1.forward(xs);
        let xs = xs.gelu("none") + &all[0];
        let xs = xs + residual;
        let residual = &xs;
        let xs = self.l2.forward(&xs);
        let again = residual;
        (xs + again) * (label.len() as f64)
    });

    twins!([segments = auto] auto auto_plain(&self, xs: &Tensor) -> Tensor {
        let ys = xs.relu();
        let first = &ys;
        let zs = self.l1.forward(first).tanh();
        zs + first
    });
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let layer = Layer {
        l1: nn::linear(vs.root() / "l1", 8, 8, Default::default()),
        l2: nn::linear(vs.root() / "l2", 8, 8, Default::default()),
    };
    let xs = Tensor::randn([3, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let names = vec![Tensor::randn([3, 8], (Kind::Float, Device::Cpu))];
    let a = layer.fixed(&xs, &names, "ab");
    let b = layer.fixed_plain(&xs, &names, "ab");
    assert!(a.equal(&b));
    let ga = Tensor::run_backward(&[a.sum(Kind::Float)], &[&xs], false, false);
    let gb = Tensor::run_backward(&[b.sum(Kind::Float)], &[&xs], false, false);
    assert!(ga[0].equal(&gb[0]));
    let c = layer.auto(&xs);
    assert!(c.equal(&layer.auto_plain(&xs)));
    c.sum(Kind::Float).backward();
}
