use tch::nn;

ckpt::model! {
    /// `Debug` and `ShallowClone` are generated: deriving them is an error that says so.
    #[derive(Debug, ckpt::ShallowClone)]
    pub struct Mlp(p, d: i64) {
        fc: nn::Linear = nn::linear(p, d, d, Default::default()),
        relu,
    }
}

fn main() {}
