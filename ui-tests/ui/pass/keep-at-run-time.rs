//! `#[ckpt::keep]` in functions whose cuts are chosen at run time: with `segments = auto`,
//! on a kept `fold` (every iteration kept), and with `segments = N` over a layer loop,
//! where a kept statement may print (it runs once a step, and nothing profiles it, so
//! the side-effect rules do not apply to it). Each gives the plain function's gradients.
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

#[ckpt::checkpointed(segments = auto)]
fn auto(xs: &Tensor) -> Tensor {
    let a = xs.tanh();
    #[ckpt::keep]
    let b = a.sigmoid();
    let c = (&a + &b).relu();
    (c * b).sum(Kind::Float)
}

fn auto_plain(xs: &Tensor) -> Tensor {
    let a = xs.tanh();
    let b = a.sigmoid();
    let c = (&a + &b).relu();
    (c * b).sum(Kind::Float)
}

#[derive(ckpt::ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
}

impl Stack {
    #[ckpt::checkpointed(segments = auto)]
    fn kept_fold(&self, xs: &Tensor) -> Tensor {
        let h = xs.relu();
        #[ckpt::keep]
        let h = self.blocks.iter().fold(h, |h, b| b.forward(&h).tanh());
        h.sum(Kind::Float)
    }

    #[ckpt::checkpointed(segments = 2)]
    fn kept_before_loop(&self, xs: &Tensor) -> Tensor {
        #[ckpt::keep]
        let mut h = {
            println!("runs once a step");
            xs.relu()
        };
        for b in self.blocks.iter() {
            h = b.forward(&h).tanh();
        }
        h.sum(Kind::Float)
    }

    fn plain(&self, xs: &Tensor) -> Tensor {
        let mut h = xs.relu();
        for b in self.blocks.iter() {
            h = b.forward(&h).tanh();
        }
        h.sum(Kind::Float)
    }
}

/// The gradient of `xs` after `f(xs).backward()`.
fn grad(f: impl Fn(&Tensor) -> Tensor, xs: &Tensor) -> Tensor {
    let xs = xs.copy().set_requires_grad(true);
    f(&xs).backward();
    xs.grad().copy()
}

fn main() {
    let xs = Tensor::randn([4, 6], (Kind::Float, Device::Cpu));
    for _ in 0..2 {
        assert!(grad(auto, &xs).equal(&grad(auto_plain, &xs)));
    }
    let vs = nn::VarStore::new(Device::Cpu);
    let stack = Stack {
        blocks: (0..4)
            .map(|i| nn::linear(vs.root() / i, 6, 6, Default::default()))
            .collect(),
    };
    let want = grad(|x| stack.plain(x), &xs);
    for _ in 0..2 {
        assert!(grad(|x| stack.kept_fold(x), &xs).equal(&want));
        assert!(grad(|x| stack.kept_before_loop(x), &xs).equal(&want));
    }
}
