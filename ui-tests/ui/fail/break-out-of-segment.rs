use ckpt::checkpointed;
use tch::Tensor;

#[checkpointed(segments = 2)]
fn f(xs: &Tensor) -> Tensor {
    let ys = 'outer: loop {
        for i in 0..3 {
            if i == 2 {
                break 'outer xs.relu();
            }
            continue;
        }
    };
    let zs = if ys.numel() > 0 { ys.sigmoid() } else { break };
    let ws = zs.exp();
    ws.tanh()
}

fn main() {}
