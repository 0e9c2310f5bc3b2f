//! Stages are shallow-cloned (one clone of the model per checkpointed call); a layer that
//! cannot be goes in `ckpt::Shared`.
use tch::nn::{self, RNN};

ckpt::model! {
    struct Net(p) {
        lstm: nn::LSTM = nn::lstm(p, 4, 4, Default::default()) => |l, xs| l.seq(xs).0,
    }
}

fn main() {}
