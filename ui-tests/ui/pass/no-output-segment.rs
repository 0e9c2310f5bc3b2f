//! A checkpointed segment that defines nothing later code uses (a logging statement):
//! the expansion must not leave a `()` that clippy's `unused_unit` would flag (the crate
//! denies it below, and the harness runs rustc's lints; clippy is checked by `./x.sh
//! test` over tests/checkpointed.rs, which has the same shape).
#![deny(unused)]
use ckpt::checkpointed;
use tch::{Device, Kind, Tensor};

#[checkpointed(segments = 3)]
fn f(xs: &Tensor) -> Tensor {
    #[ckpt::allow(io)]
    if !ckpt::is_recomputing() {
        println!("forward of {:?}", xs.size());
    }
    let ys = xs.tanh();
    let zs = ys.sigmoid();
    zs.sum(Kind::Float)
}

fn main() {
    let xs = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    f(&xs).backward();
}
