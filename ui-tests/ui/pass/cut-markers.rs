//! Explicit cuts with `ckpt::cut!()`, and `::ckpt::cut!()`.
use tch::{Device, Kind, Tensor};

#[ckpt::checkpointed]
fn forward(xs: &Tensor) -> Tensor {
    let a = xs.tanh();
    let b = a.sigmoid();
    ckpt::cut!();
    let c = (&a + &b).relu();
    ::ckpt::cut!();
    (c * b).sum(Kind::Float)
}

fn main() {
    let xs = Tensor::randn([5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    forward(&xs).backward();
    assert!(xs.grad().defined());
    ckpt::cut!(); // outside #[checkpointed] it expands to nothing
}
