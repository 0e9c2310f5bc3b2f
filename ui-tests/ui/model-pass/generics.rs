//! Type parameters, const generics, lifetimes of user parameters, `where` clauses, a typed
//! path parameter.
use ckpt::ShallowClone;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

#[derive(Debug, ShallowClone)]
struct Scale(f64);

impl Module for Scale {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs * self.0
    }
}

ckpt::model! {
    /// `N` copies of a module made by `make`, then `tail`.
    #[checkpointed(segments = 2)]
    pub struct Tower<M, T, const N: usize>(p: &nn::Path, make: &dyn Fn(nn::Path) -> M, tail: T)
    where
        M: Module,
        T: Module + Clone,
    {
        layers: [M; N] = make(p),
        tail: T = tail.clone(),
        tanh,
    }
}

ckpt::model! {
    struct Plain<M: Module>(vs, inner: M) {
        inner: M = inner,
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let tower: Tower<nn::Linear, Scale2, 3> = Tower::new(
        &vs.root(),
        &|p: nn::Path| nn::linear(p, 2, 2, Default::default()),
        Scale2,
    );
    let x = Tensor::ones([1, 2], (Kind::Float, Device::Cpu));
    assert_eq!(tower.forward(&x).size(), [1, 2]);
    let plain = Plain::new(vs.root(), Scale(3.0));
    assert!(plain.forward(&x).equal(&(&x * 3.0)));
}

#[derive(Debug, Clone, ShallowClone)]
struct Scale2;

impl Module for Scale2 {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs * 2.0
    }
}
