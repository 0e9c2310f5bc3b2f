//! `segments = 2` checkpoints the cheap statements and leaves the layer inline (tch's
//! char-rnn forward cut this way saved nothing): the macro says so.
#![deny(deprecated)]
use ckpt::checkpointed;
use tch::{nn, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct CharNet {
    lin: nn::Linear,
}

impl CharNet {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let xs = xs.narrow(1, 0, 8);
        let xs = xs.onehot(16);
        let ys = xs.apply(&self.lin);
        ys.tanh()
    }
}

fn main() {}
