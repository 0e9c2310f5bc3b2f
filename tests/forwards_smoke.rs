//! Smoke tests of the forward shapes of issue 15 (temporary, replaced by tests/forwards.rs).

use ckpt::{ShallowClone, checkpointed};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

mod common;

#[derive(Debug, ShallowClone)]
struct Stack {
    blocks: Vec<nn::Linear>,
    head: nn::Linear,
}

impl Stack {
    fn new(p: &nn::Path, d: i64, n: usize) -> Self {
        Stack {
            blocks: (0..n)
                .map(|i| nn::linear(p / "b" / i, d, d, Default::default()))
                .collect(),
            head: nn::linear(p / "head", d, d, Default::default()),
        }
    }

    fn plain(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for b in self.blocks.iter() {
            x = &x + b.forward(&x).tanh();
        }
        self.head.forward(&x)
    }

    #[checkpointed(segments = 3)]
    fn looped(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for b in self.blocks.iter() {
            x = &x + b.forward(&x).tanh();
        }
        self.head.forward(&x)
    }

    #[checkpointed(segments = 3)]
    fn folded(&self, xs: &Tensor) -> Tensor {
        let x = xs.relu();
        let x = self.blocks.iter().fold(x, |x, b| &x + b.forward(&x).tanh());
        self.head.forward(&x)
    }

    #[checkpointed(segments = 2)]
    fn enumerated(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for (i, b) in self.blocks.iter().enumerate() {
            x = &x + b.forward(&x).tanh() * (i as f64 + 1.0);
        }
        self.head.forward(&x)
    }

    fn enumerated_plain(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for (i, b) in self.blocks.iter().enumerate() {
            x = &x + b.forward(&x).tanh() * (i as f64 + 1.0);
        }
        self.head.forward(&x)
    }

    #[checkpointed(segments = auto)]
    fn auto(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for b in &self.blocks {
            x = &x + b.forward(&x).tanh();
        }
        self.head.forward(&x)
    }
}

#[derive(Debug, ShallowClone)]
struct Block {
    l1: nn::Linear,
    l2: nn::Linear,
}

impl Block {
    #[checkpointed]
    fn whole(&self, xs: &Tensor) -> Tensor {
        let residual = xs;
        let h = self.l1.forward(xs).gelu("none");
        let h = self.l2.forward(&h);
        h + residual
    }

    fn plain(&self, xs: &Tensor) -> Tensor {
        let residual = xs;
        let h = self.l1.forward(xs).gelu("none");
        let h = self.l2.forward(&h);
        h + residual
    }

    #[checkpointed(segments = 3)]
    fn clip(&self, xs: &Tensor) -> Tensor {
        let residual = xs;
        let xs = self.l1.forward(xs);
        let xs = xs.gelu("none");
        let xs = xs + residual;
        let residual = &xs;
        let xs = self.l2.forward(&xs);
        xs + residual
    }

    fn clip_plain(&self, xs: &Tensor) -> Tensor {
        let residual = xs;
        let xs = self.l1.forward(xs);
        let xs = xs.gelu("none");
        let xs = xs + residual;
        let residual = &xs;
        let xs = self.l2.forward(&xs);
        xs + residual
    }

    #[checkpointed(segments = 2)]
    fn chain(&self, xs: &Tensor) -> Tensor {
        xs.apply(&self.l1).relu().apply(&self.l2).tanh()
    }

    fn chain_plain(&self, xs: &Tensor) -> Tensor {
        xs.apply(&self.l1).relu().apply(&self.l2).tanh()
    }
}

fn check(vs: &nn::VarStore, a: &dyn Fn(&Tensor) -> Tensor, b: &dyn Fn(&Tensor) -> Tensor) {
    let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
    let ga = common::grads_and_output(vs, &x, a);
    let gb = common::grads_and_output(vs, &x, b);
    common::assert_all_equal("grads", &ga, &gb);
}

#[test]
fn loops_folds_and_whole_blocks() {
    let vs = nn::VarStore::new(Device::Cpu);
    let s = Stack::new(&vs.root(), 8, 6);
    check(&vs, &|x| s.plain(x), &|x| s.looped(x));
    check(&vs, &|x| s.plain(x), &|x| s.folded(x));
    check(&vs, &|x| s.plain(x), &|x| s.auto(x));
    check(&vs, &|x| s.enumerated_plain(x), &|x| s.enumerated(x));
    let b = Block {
        l1: nn::linear(vs.root() / "l1", 8, 8, Default::default()),
        l2: nn::linear(vs.root() / "l2", 8, 8, Default::default()),
    };
    check(&vs, &|x| b.plain(x), &|x| b.whole(x));
    check(&vs, &|x| b.clip_plain(x), &|x| b.clip(x));
    check(&vs, &|x| b.chain_plain(x), &|x| b.chain(x));
    assert_eq!(ckpt::live_segments(), 0);
}
