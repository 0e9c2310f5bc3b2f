//! With `segments = auto` any statement but the last may be checkpointed: the
//! side-effect rules apply to all of them.
use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = auto)]
fn f(xs: &Tensor, out: &mut Vec<Tensor>) -> Tensor {
    println!("forward");
    let mut ys = xs.relu();
    let _ = ys.relu_();
    out.push(ys.shallow_clone());
    ys.tanh()
}

fn main() {}
