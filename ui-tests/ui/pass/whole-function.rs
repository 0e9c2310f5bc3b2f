//! `#[checkpointed]` without arguments: the whole function is one checkpointed segment,
//! wherever it is called from (here a loop over blocks); `return` and `?` leave it as they
//! leave the function.
use ckpt::checkpointed;
use tch::nn::{self, Module};
use tch::{Device, Kind, TchError, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Block {
    l1: nn::Linear,
    l2: nn::Linear,
}

impl Block {
    #[checkpointed]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let h = self.l1.forward(xs).gelu("none");
        if h.numel() == 0 {
            return h;
        }
        xs + self.l2.forward(&h)
    }

    fn plain(&self, xs: &Tensor) -> Tensor {
        let h = self.l1.forward(xs).gelu("none");
        xs + self.l2.forward(&h)
    }

    #[checkpointed(preserve_rng_state = false)]
    fn fallible(&self, xs: &Tensor) -> Result<Tensor, TchError> {
        let h = self.l1.forward(xs).f_relu()?;
        Ok(self.l2.forward(&h))
    }
}

#[checkpointed]
fn free(xs: Tensor, scale: f64) -> Tensor {
    (xs * scale).tanh()
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks: Vec<Block> = (0..4)
        .map(|i| Block {
            l1: nn::linear(vs.root() / i / "l1", 8, 16, Default::default()),
            l2: nn::linear(vs.root() / i / "l2", 16, 8, Default::default()),
        })
        .collect();
    let xs = Tensor::randn([3, 8], (Kind::Float, Device::Cpu));
    let run = |ckpt: bool| {
        for v in vs.trainable_variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let mut x = xs.shallow_clone();
        for b in &blocks {
            x = if ckpt { b.forward(&x) } else { b.plain(&x) };
        }
        let y = free(x, 0.5);
        y.sum(Kind::Float).backward();
        let mut grads: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .map(|(n, v)| (n, v.grad().copy()))
            .collect();
        grads.sort_by(|a, b| a.0.cmp(&b.0));
        (y.detach(), grads)
    };
    let (y_ckpt, g_ckpt) = run(true);
    let (y_plain, g_plain) = run(false);
    assert!(y_ckpt.equal(&y_plain));
    for ((n, a), (_, b)) in g_ckpt.iter().zip(&g_plain) {
        assert!(a.equal(b), "{n}");
    }
    let out = blocks[0].fallible(&xs).unwrap();
    out.sum(Kind::Float).backward();
    drop(out); // the last handle on that segment's graph
    assert_eq!(ckpt::live_segments(), 0);
}
