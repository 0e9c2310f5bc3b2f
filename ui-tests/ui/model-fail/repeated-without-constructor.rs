//! Repeated layers need the expression that builds one of them.
use tch::nn;

ckpt::model! {
    struct Stack(p, layers: usize) {
        blocks: [nn::Linear; layers],
    }
}

fn main() {}
