use ckpt::checkpointed;
use tch::Tensor;

mod rand {
    pub struct Rng;
    impl Rng {
        pub fn gen_range(&mut self, r: std::ops::Range<f64>) -> f64 {
            r.start
        }
    }
    pub fn thread_rng() -> Rng {
        Rng
    }
}

use rand::thread_rng;

// `thread_rng` imported by `use` is randomness under its bare name too.
#[checkpointed]
fn f(xs: &Tensor) -> Tensor {
    let noise = thread_rng().gen_range(0.0..1.0);
    let ys = xs * noise;
    ckpt::cut!();
    ys.tanh()
}

fn main() {}
