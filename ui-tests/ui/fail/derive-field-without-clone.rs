use tch::nn;

struct Opaque;

#[derive(ckpt::ShallowClone)]
struct Model {
    lin: nn::Linear,
    extra: Opaque,
}

fn main() {}
