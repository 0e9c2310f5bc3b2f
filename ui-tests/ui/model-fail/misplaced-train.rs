//! Closures say by their parameters whether they take the train flag; built-ins know.
use tch::nn;

ckpt::model! {
    struct Mlp(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[train] |xs| xs.relu(),
        #[train] relu,
        #[train] dropout(0.1),
        #[train] #[field] k: f64 = 1.0,
    }
}

fn main() {}
