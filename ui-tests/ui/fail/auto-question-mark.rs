use ckpt::checkpointed;
use tch::{TchError, Tensor};

#[checkpointed(segments = auto)]
fn f(xs: &Tensor) -> Result<Tensor, TchError> {
    let ys = xs.f_relu()?;
    let zs = ys.tanh();
    // `?` in the last statement runs inline: fine.
    zs.f_sigmoid()
}

fn main() {}
