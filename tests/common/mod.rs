//! Helpers shared by the integration tests: plain-vs-checkpointed gradient comparison,
//! and the residual chain of the kept-segment tests (`residual`).

#![allow(dead_code)]

pub mod residual;

use tch::{Device, Kind, Tensor, nn};

/// Gradients of `loss` with respect to `params` (in order), leaving them zeroed after.
pub fn grads_of(loss: &Tensor, params: &[Tensor]) -> Vec<Tensor> {
    for p in params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    loss.backward();
    let out = params
        .iter()
        .map(|p| {
            let g = p.grad();
            if g.defined() { g.copy() } else { Tensor::new() }
        })
        .collect();
    for p in params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    out
}

/// Asserts that two lists of tensors are equal element for element, bit for bit
/// (`Tensor::equal`: same shape, dtype and values).
pub fn assert_all_equal(what: &str, a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len(), "{what}: different counts");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.defined(), y.defined(), "{what}[{i}]: one is undefined");
        if x.defined() {
            assert!(
                x.equal(y),
                "{what}[{i}] differs: max abs diff {}",
                max_abs_diff(x, y)
            );
        }
    }
}

/// Largest absolute element difference (as f64).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// The variables of `vs` in name order.
pub fn params(vs: &nn::VarStore) -> Vec<Tensor> {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named.into_iter().map(|(_, t)| t).collect()
}

/// A float CPU tensor of shape `dims` from the global generator, requiring grad.
pub fn input(dims: &[i64]) -> Tensor {
    Tensor::randn(dims, (Kind::Float, Device::Cpu)).set_requires_grad(true)
}

/// What a plain-vs-checkpointed comparison compares: the gradients of
/// `sum(f(x) * f(x))` with respect to the variables of `vs` (in name order) and to `x`,
/// then the output `f(x)`. `x` is detached first, so it may be reused.
pub fn grads_and_output(
    vs: &nn::VarStore,
    x: &Tensor,
    f: &dyn Fn(&Tensor) -> Tensor,
) -> Vec<Tensor> {
    let x = x.detach().set_requires_grad(true);
    let y = f(&x);
    let mut wrt = params(vs);
    wrt.push(x);
    let mut out = grads_of(&(&y * &y).sum(Kind::Float), &wrt);
    out.push(y.detach().copy());
    out
}

/// Tensor bytes alive after `f` ran forward on `x` (its output and what its graph keeps),
/// on the CPU counter. `x` is detached first and requires grad.
pub fn kept_by(x: &Tensor, f: impl FnOnce(&Tensor) -> Tensor) -> i64 {
    let x = x.detach().set_requires_grad(true);
    let before = ckpt::memory::current_bytes(Device::Cpu);
    let y = f(&x);
    let after = ckpt::memory::current_bytes(Device::Cpu);
    drop(y);
    after - before
}
