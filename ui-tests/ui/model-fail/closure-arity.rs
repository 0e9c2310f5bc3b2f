//! Closures take `|xs|` or `|xs, train|`; apply closures `|layer, xs|` or
//! `|layer, xs, train|`; a repeated layer's builder `|i|`.
use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()) => |xs| xs.relu(),
        || 1,
        |a, b, c| a,
        blocks: [nn::Linear; 2] = |i, j| nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
