use ckpt::checkpointed;

#[checkpointed(segments = 2)]
struct Model;

fn main() {}
