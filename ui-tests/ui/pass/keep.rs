//! `#[ckpt::keep]` on top-level `let`s: with cut markers, with `segments = N` on a method
//! chain (every link of the chain is kept), next to a `?`, and a `mut` binding.
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

#[ckpt::checkpointed]
fn markers(xs: &Tensor) -> Tensor {
    let a = xs.tanh();
    #[ckpt::keep]
    let b = a.sigmoid();
    let c = (&a + &b).relu();
    ckpt::cut!();
    (c * b).sum(Kind::Float)
}

fn markers_plain(xs: &Tensor) -> Tensor {
    let a = xs.tanh();
    let b = a.sigmoid();
    let c = (&a + &b).relu();
    (c * b).sum(Kind::Float)
}

#[ckpt::checkpointed(segments = 2)]
fn chain(l1: &nn::Linear, l2: &nn::Linear, xs: &Tensor) -> Tensor {
    let x0 = xs.relu();
    #[ckpt::keep]
    let h = x0.apply(l1).relu().apply(l2);
    let mut y = &h * 2.0;
    y += 1.0;
    y.sum(Kind::Float)
}

#[ckpt::checkpointed(segments = 2)]
fn fallible(xs: &Tensor) -> Result<Tensor, tch::TchError> {
    let a = xs.f_tanh()?;
    #[ckpt::keep]
    let b = a.f_sigmoid()?;
    Ok((a * b).sum(Kind::Float))
}

fn main() {
    let xs = Tensor::randn([5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    markers(&xs).backward();
    let g = xs.grad().copy();
    let _ = xs.grad().zero_();
    markers_plain(&xs).backward();
    assert!(g.equal(&xs.grad()));

    let vs = nn::VarStore::new(Device::Cpu);
    let l1 = nn::linear(vs.root() / "l1", 5, 8, Default::default());
    let l2 = nn::linear(vs.root() / "l2", 8, 3, Default::default());
    let x = Tensor::randn([2, 5], (Kind::Float, Device::Cpu));
    chain(&l1, &l2, &x).backward();
    let _ = l1.forward(&x);
    fallible(&xs).unwrap().backward();
}
