//! A free function, with `&Tensor`, owned and `bool` parameters.
use ckpt::checkpointed;
use tch::{Device, Kind, Tensor};

#[checkpointed(segments = 3)]
fn forward(xs: &Tensor, bias: Tensor, train: bool) -> Tensor {
    let h = xs.tanh() + &bias;
    let h = h.dropout(0.1, train);
    let h = h.sigmoid() * bias;
    h.sum(Kind::Float)
}

fn main() {
    let xs = Tensor::randn([3, 4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let bias = Tensor::ones([4], (Kind::Float, Device::Cpu));
    forward(&xs, bias, true).backward();
    assert!(xs.grad().defined());
}
