use ckpt::checkpointed;
use tch::Tensor;

trait Forward {
    #[checkpointed(segments = 2)]
    fn forward(&self, xs: &Tensor) -> Tensor;
}

fn main() {}
