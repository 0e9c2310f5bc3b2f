use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f(xs: &Tensor) -> Tensor {
    let n = unsafe { std::ptr::read(&xs.numel()) };
    let zs = xs.sigmoid() * n as f64;
    zs.tanh()
}

fn main() {}
