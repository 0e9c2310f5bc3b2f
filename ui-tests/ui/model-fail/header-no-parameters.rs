//! The constructor's parameters follow the struct's name, the `nn::Path` first.

ckpt::model! {
    struct Mlp {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
