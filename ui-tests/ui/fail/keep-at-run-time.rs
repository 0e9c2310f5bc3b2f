use ckpt::checkpointed;
use tch::Tensor;

// A kept statement of a run-time chain is never recomputed but still runs as a stage
// closure: `?` and `return` cannot leave it.
#[checkpointed(segments = auto)]
fn question_mark(xs: &Tensor) -> Result<Tensor, tch::TchError> {
    #[ckpt::keep]
    let ys = xs.f_relu()?;
    let zs = ys.tanh();
    Ok(zs.sigmoid())
}

#[checkpointed(budget = "50%")]
fn early_return(xs: &Tensor) -> Tensor {
    #[ckpt::keep]
    let ys = if xs.numel() == 0 { return xs.shallow_clone() } else { xs.relu() };
    let zs = ys.tanh();
    zs.sigmoid()
}

// Nothing left to checkpoint: every statement but the last is kept.
#[checkpointed(segments = auto)]
fn everything(xs: &Tensor) -> Tensor {
    #[ckpt::keep]
    let ys = xs.relu();
    #[ckpt::keep]
    let zs = ys.tanh();
    zs.sigmoid()
}

fn main() {}
