//! Collection mutation of a value from outside the function is rejected; a value of the
//! function itself (`mine`, a parameter taken by value) is taken into the segment and
//! given back, so changing it there is not a side effect.
use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f(xs: &Tensor, cache: &mut Vec<Tensor>, mut mine: Vec<Tensor>) -> Tensor {
    let ys = xs.relu();
    cache.push(ys.shallow_clone());
    mine.push(ys.shallow_clone());
    let zs = Tensor::stack(&mine, 0);
    zs.tanh()
}

fn main() {}
