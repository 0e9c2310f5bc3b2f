//! `Result`-returning functions: `?` inside checkpointed segments, non-`Clone` errors.
use ckpt::checkpointed;
use tch::{Device, Kind, TchError, Tensor};

#[derive(Debug)]
enum ModelError {
    Torch(TchError),
    Empty,
}

impl From<TchError> for ModelError {
    fn from(e: TchError) -> Self {
        ModelError::Torch(e)
    }
}

#[checkpointed]
fn forward(xs: &Tensor, cols: i64) -> Result<Tensor, ModelError> {
    let h = xs.f_reshape([-1, cols])?;
    ckpt::cut!();
    let h = h.f_tanh()?;
    ckpt::cut!();
    // The last segment runs inline: an early `return` is fine here.
    if h.numel() == 0 {
        return Err(ModelError::Empty);
    }
    Ok(h.sum(Kind::Float))
}

#[checkpointed(segments = 2)]
fn boxed(xs: &Tensor) -> Result<Tensor, Box<dyn std::error::Error + Send + Sync>> {
    let n: i64 = "4".parse()?;
    let h = xs.f_reshape([-1, n])?;
    Ok(h.relu())
}

fn main() {
    let xs = Tensor::randn([4, 6], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    forward(&xs, 3).unwrap().backward();
    assert!(xs.grad().defined());
    assert!(matches!(forward(&xs, 5), Err(ModelError::Torch(_))));
    assert!(boxed(&xs).is_ok());
}
