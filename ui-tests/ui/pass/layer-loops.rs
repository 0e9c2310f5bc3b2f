//! Every supported form of a layer loop and of a method chain, each checked against the
//! same body without the attribute (outputs and gradients bit for bit).
use ckpt::checkpointed;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

#[derive(Debug, ckpt::ShallowClone)]
struct Net {
    blocks: Vec<nn::Linear>,
    norms: Vec<nn::LayerNorm>,
    head: nn::Linear,
}

/// `fn $ckpt` under `#[checkpointed(args)]` and `fn $plain` without it, one body.
macro_rules! twins {
    ($(#[$a:meta])* [$($args:tt)*] $ckpt:ident $plain:ident $($rest:tt)*) => {
        #[checkpointed($($args)*)]
        fn $ckpt $($rest)*
        fn $plain $($rest)*
    };
}

impl Net {
    twins!([segments = 3] iter iter_plain(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for b in self.blocks.iter() {
            x = &x + b.forward(&x).tanh();
        }
        self.head.forward(&x)
    });

    twins!([segments = 4] by_ref by_ref_plain(&self, xs: &Tensor, mask: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for b in &self.blocks {
            x = &x + b.forward(&x).tanh() * mask;
        }
        self.head.forward(&x)
    });

    twins!([segments = 2] enumerate enumerate_plain(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for (i, b) in self.blocks.iter().enumerate() {
            x = &x + b.forward(&x).tanh() * (i as f64 + 1.0);
        }
        self.head.forward(&x)
    });

    twins!([segments = 3] zip zip_plain(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for (b, n) in self.blocks.iter().zip(self.norms.iter()) {
            x = n.forward(&(&x + b.forward(&x)));
        }
        self.head.forward(&x)
    });

    twins!([segments = 3] indexed indexed_plain(&self, xs: &Tensor, n: usize) -> Tensor {
        let mut x = xs.relu();
        let mut sum = xs.zeros_like();
        for i in 0..n {
            x = self.blocks[i].forward(&x).tanh();
            sum = sum + &x;
        }
        self.head.forward(&(x + sum))
    });

    twins!([segments = 3] fold fold_plain(&self, xs: &Tensor) -> Tensor {
        let x = xs.relu();
        let x = self.blocks.iter().fold(x, |x, b| &x + b.forward(&x).tanh());
        self.head.forward(&x)
    });

    twins!([segments = 3] tail_fold tail_fold_plain(&self, xs: &Tensor) -> Tensor {
        let x = self.head.forward(xs).relu();
        self.blocks.iter().fold(x, |x, b| &x + b.forward(&x).tanh())
    });

    twins!([segments = 4] skips skips_plain(&self, xs: &Tensor) -> Tensor {
        let mut skips = Vec::new();
        let mut x = xs.relu();
        for b in self.blocks.iter() {
            skips.push(x.shallow_clone());
            x = b.forward(&x).tanh();
        }
        for n in self.norms.iter() {
            let skip = skips.pop().unwrap();
            x = n.forward(&(x + skip));
        }
        self.head.forward(&x)
    });

    twins!([segments = 3] chain chain_plain(&self, xs: &Tensor) -> Tensor {
        xs.apply(&self.blocks[0]).relu().apply(&self.blocks[1]).tanh().apply(&self.blocks[2]).relu().apply(&self.head)
    });

    twins!([budget = "60%"] budget budget_plain(&self, xs: &Tensor) -> Tensor {
        let mut x = xs.relu();
        for b in self.blocks.iter() {
            x = &x + b.forward(&x).tanh();
        }
        self.head.forward(&x)
    });
}

fn grads(vs: &nn::VarStore, f: &dyn Fn() -> Tensor) -> Vec<Tensor> {
    for v in vs.trainable_variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let y = f();
    (&y * &y).sum(Kind::Float).backward();
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<Tensor> = named
        .into_iter()
        .map(|(_, v)| {
            let g = v.grad();
            if g.defined() { g.copy() } else { v.zeros_like() }
        })
        .collect();
    out.push(y.detach());
    out
}

fn same(vs: &nn::VarStore, what: &str, a: &dyn Fn() -> Tensor, b: &dyn Fn() -> Tensor) {
    let (x, y) = (grads(vs, a), grads(vs, b));
    for (i, (p, q)) in x.iter().zip(&y).enumerate() {
        assert!(p.equal(q), "{what}: tensor {i} differs");
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    let net = Net {
        blocks: (0..6)
            .map(|i| nn::linear(&p / "b" / i, 8, 8, Default::default()))
            .collect(),
        norms: (0..6)
            .map(|i| nn::layer_norm(&p / "n" / i, vec![8], Default::default()))
            .collect(),
        head: nn::linear(&p / "head", 8, 8, Default::default()),
    };
    let xs = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
    let mask = Tensor::rand([4, 8], (Kind::Float, Device::Cpu));
    same(&vs, "iter", &|| net.iter(&xs), &|| net.iter_plain(&xs));
    same(&vs, "by_ref", &|| net.by_ref(&xs, &mask), &|| net.by_ref_plain(&xs, &mask));
    same(&vs, "enumerate", &|| net.enumerate(&xs), &|| net.enumerate_plain(&xs));
    same(&vs, "zip", &|| net.zip(&xs), &|| net.zip_plain(&xs));
    same(&vs, "indexed", &|| net.indexed(&xs, 5), &|| net.indexed_plain(&xs, 5));
    same(&vs, "fold", &|| net.fold(&xs), &|| net.fold_plain(&xs));
    same(&vs, "tail_fold", &|| net.tail_fold(&xs), &|| net.tail_fold_plain(&xs));
    same(&vs, "skips", &|| net.skips(&xs), &|| net.skips_plain(&xs));
    same(&vs, "chain", &|| net.chain(&xs), &|| net.chain_plain(&xs));
    // Large enough for checkpointing to pay for its bookkeeping.
    let big = Tensor::randn([2048, 8], (Kind::Float, Device::Cpu));
    same(&vs, "budget", &|| net.budget(&big), &|| net.budget_plain(&big));
    let plans = ckpt::plan::function_plans();
    assert_eq!(plans.len(), 1);
    assert!(plans[0].plan.segments() > 1, "{}", plans[0].plan);
    assert_eq!(ckpt::live_segments(), 0);
}
