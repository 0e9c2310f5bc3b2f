//! A layer that takes the train flag (`ModuleT` only) needs `#[train]`; the error says so
//! at the layer's type.
use tch::nn;

ckpt::model! {
    struct Net(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        bn: nn::BatchNorm = nn::batch_norm1d(p, 4, Default::default()),
    }
}

fn main() {}
