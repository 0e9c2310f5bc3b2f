use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed]
fn f(xs: &Tensor, deep: bool) -> Tensor {
    let ys = xs.relu();
    let zs = if deep {
        ckpt::cut!();
        ys.sigmoid()
    } else {
        ys
    };
    ckpt::cut!();
    zs.tanh()
}

fn main() {}
