use ckpt::checkpointed;
use tch::nn::{self, Module};
use tch::Tensor;

// A kept statement of a run-time chain runs once, but still as a stage closure: a `&mut`
// parameter cannot enter it.
#[checkpointed(segments = auto)]
fn ref_mut(xs: &Tensor, log: &mut Vec<i64>) -> Tensor {
    #[ckpt::keep]
    let ys = {
        log.push(1);
        xs.relu()
    };
    let zs = ys.tanh();
    zs.sigmoid()
}

// `segments = N` over a layer loop chooses its cuts at run time too: `?` cannot leave a
// kept statement there.
#[checkpointed(segments = 2)]
fn layer_loop(xs: &Tensor, layers: &[nn::Linear]) -> Result<Tensor, tch::TchError> {
    #[ckpt::keep]
    let mut h = xs.f_relu()?;
    for l in layers.iter() {
        h = l.forward(&h);
    }
    Ok(h)
}

fn main() {}
