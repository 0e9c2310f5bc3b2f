use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed]
fn f(xs: &Tensor) -> Tensor {
    let mut count = 0;
    let mut scales = (1.0, 2.0);
    let mut total = xs.zeros_like();
    ckpt::cut!();
    count += 1;
    scales.0 = 3.0;
    let mut fresh = xs.relu();
    fresh = fresh * 2.0;
    total = total + &fresh;
    ckpt::cut!();
    total * count as f64 * scales.0
}

fn main() {}
