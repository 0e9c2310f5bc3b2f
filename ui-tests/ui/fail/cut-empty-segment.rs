use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed]
fn f(xs: &Tensor) -> Tensor {
    ckpt::cut!();
    let ys = xs.relu();
    ckpt::cut!();
    ckpt::cut!();
    let zs = ys.sigmoid();
    zs.tanh()
}

fn main() {}
