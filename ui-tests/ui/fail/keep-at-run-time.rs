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

// The planner's profile runs a kept statement again on the first call for an input: the
// side-effect rules apply to it under `segments = auto` and `budget`.
#[checkpointed(budget = "50%")]
fn side_effects(xs: &Tensor, ys: &Tensor) -> Tensor {
    #[ckpt::keep]
    let zs = {
        println!("profiled too");
        let mut h = ys.shallow_clone();
        let _ = h.relu_();
        xs * h
    };
    let zs = zs.tanh();
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
