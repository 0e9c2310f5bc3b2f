use ckpt::checkpointed;

#[checkpointed]
fn nothing() {}

fn main() {}
