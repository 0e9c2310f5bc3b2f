//! A closure-built module (`nn::FuncT`) is not `ShallowClone`: the derive's error names the
//! field and says to wrap it in `ckpt::Shared`.
use tch::nn;

#[derive(ckpt::ShallowClone)]
struct Model {
    lin: nn::Linear,
    block: nn::FuncT<'static>,
}

fn main() {}
