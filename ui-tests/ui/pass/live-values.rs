//! Live values through patterns, `mut`, slices, strings, `Option`, `Vec`, many values
//! (nested stash tuples) and format captures.
use ckpt::checkpointed;
use tch::{Device, Kind, Tensor};

struct Pair {
    a: Tensor,
    b: Tensor,
}

#[checkpointed(segments = 3)]
fn forward(xs: &Tensor, parts: &[Tensor], label: &str, extra: Option<Tensor>) -> Tensor {
    let Pair { a, b } = Pair { a: xs.tanh(), b: xs.sigmoid() };
    let (c, mut d) = (a.exp(), b.neg());
    let (v0, v1, v2, v3, v4, v5, v6) = (xs * 0.0, xs * 1.0, xs * 2.0, xs * 3.0, xs * 4.0, xs * 5.0, xs * 6.0);
    let (v7, v8, v9, v10, v11, v12) = (xs * 7.0, xs * 8.0, xs * 9.0, xs * 10.0, xs * 11.0, xs * 12.0);
    let text = format!("{label}-{}", parts.len());
    let d = d + 1.0;
    let cat = Tensor::cat(parts, 0).sum(Kind::Float);
    let sum = v0 + v1 + v2 + v3 + v4 + v5 + v6 + v7 + v8 + v9 + v10 + v11 + v12;
    let e = extra.unwrap_or_else(|| xs.zeros_like());
    (a + b + c + d + sum + e).sum(Kind::Float) + cat + text.len() as f64
}

fn main() {
    let xs = Tensor::randn([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let parts = [xs.shallow_clone(), &xs * 2.0];
    forward(&xs, &parts, "x", Some(xs.ones_like())).backward();
    assert!(xs.grad().defined());
}
