//! Layer loops with the arguments tch code has: a slice of layers, an optional mask, a
//! `fold` over no layers; and a block that loops over its experts, checkpointed whole
//! with no warning (it is a block, called from the model's loop).
#![deny(deprecated)]
use ckpt::checkpointed;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

macro_rules! twins {
    ([$($args:tt)*] $ckpt:ident $plain:ident $($rest:tt)*) => {
        #[checkpointed($($args)*)]
        fn $ckpt $($rest)*
        fn $plain $($rest)*
    };
}

twins!([segments = 3] sliced sliced_plain(blocks: &[nn::Linear], xs: &Tensor, mask: Option<&Tensor>) -> Tensor {
    let mut x = xs.relu();
    for b in blocks {
        x = b.forward(&x).tanh();
        if let Some(m) = mask {
            x = x * m;
        }
    }
    x.sum(Kind::Float)
});

twins!([segments = auto] auto_masked auto_masked_plain(blocks: &[nn::Linear], xs: &Tensor, mask: Option<&Tensor>) -> Tensor {
    let mut x = xs.relu();
    for b in blocks.iter() {
        x = b.forward(&x).tanh();
        if let Some(m) = mask {
            x = x * m;
        }
    }
    x.sum(Kind::Float)
});

twins!([segments = 2] folded folded_plain(blocks: &[nn::Linear], xs: &Tensor) -> Tensor {
    let x = xs.relu();
    blocks.iter().fold(x, |x, b| b.forward(&x))
});

#[derive(Debug, ckpt::ShallowClone)]
struct Moe {
    gate: nn::Linear,
    experts: Vec<nn::Linear>,
}

impl Moe {
    #[checkpointed]
    fn forward(&self, x: &Tensor) -> Tensor {
        let g = self.gate.forward(x).softmax(-1, Kind::Float);
        let mut out = x.zeros_like();
        for (i, e) in self.experts.iter().enumerate() {
            out = out + e.forward(x) * g.narrow(1, i as i64, 1);
        }
        out
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks: Vec<nn::Linear> = (0..4)
        .map(|i| nn::linear(vs.root() / i, 8, 8, Default::default()))
        .collect();
    let xs = Tensor::randn([3, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let mask = Tensor::rand([3, 8], (Kind::Float, Device::Cpu));
    for m in [Some(&mask), None] {
        assert!(sliced(&blocks, &xs, m).equal(&sliced_plain(&blocks, &xs, m)));
        let y = auto_masked(&blocks, &xs, m);
        assert!(y.equal(&auto_masked_plain(&blocks, &xs, m)));
        y.backward();
    }
    let none: [nn::Linear; 0] = [];
    assert!(folded(&none, &xs).equal(&folded_plain(&none, &xs)));
    assert!(folded(&blocks, &xs).equal(&folded_plain(&blocks, &xs)));
    tch::no_grad(|| assert!(folded(&none, &xs).equal(&xs.relu())));
    let moe = Moe {
        gate: nn::linear(vs.root() / "gate", 8, 4, Default::default()),
        experts: (0..4)
            .map(|i| nn::linear(vs.root() / "e" / i, 8, 8, Default::default()))
            .collect(),
    };
    moe.forward(&xs).sum(Kind::Float).backward();
    assert_eq!(ckpt::live_segments(), 0);
}
