//! Stages are shallow-cloned (one clone of the model per checkpointed call); a layer that
//! cannot be (`nn::Sequential` keeps its layers as closures) goes in `ckpt::Shared`.
use tch::nn::{self, Module};

ckpt::model! {
    struct Net(p) {
        seq: nn::Sequential = nn::seq().add(nn::linear(p, 4, 4, Default::default())) => |l, xs| l.forward(xs),
    }
}

fn main() {}
