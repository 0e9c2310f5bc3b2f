use tch::nn;
use tch::Tensor;

ckpt::model! {
    #[checkpointed(segments = 2)]
    struct Mlp(p) {
        #[keep] let mask: Tensor = xs.ne(0),
        #[keep] #[field] scale: f64 = 0.5,
        #[keep] #[keep] fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        #[keep(all)] relu,
        #[ckpt::keep] gelu,
        #[ckpt::train] fc2: nn::Linear = nn::linear(p, 4, 4, Default::default()),
    }
}

fn main() {}
