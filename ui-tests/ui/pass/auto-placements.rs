//! `segments = auto` and `budget` wherever `segments = N` goes: inherent and trait
//! methods, free and generic functions, `Result` (with `?` in the last statement), `&mut`
//! parameters used by the last statement, and every statement-boundary value kind.
use ckpt::{checkpointed, ShallowClone};
use tch::nn::{self, Module};
use tch::{Device, Kind, TchError, Tensor};

#[derive(Debug, ShallowClone)]
struct Mlp {
    l1: nn::Linear,
    l2: nn::Linear,
}

impl Mlp {
    #[checkpointed(segments = auto)]
    fn inherent(&self, xs: &Tensor, scale: f64) -> Tensor {
        let h = self.l1.forward(xs).relu();
        let h = self.l2.forward(&h) * scale;
        h.tanh()
    }
}

impl Module for Mlp {
    #[checkpointed(budget = "100%")]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let h = self.l1.forward(xs).relu();
        let g = self.l2.forward(&h);
        (g + h).tanh()
    }
}

#[checkpointed(segments = auto, determinism_check = false)]
fn free(xs: &Tensor, names: &[&'static str], label: &str, sizes: Vec<i64>) -> (Tensor, usize) {
    let n = names.len() + label.len();
    let ys = xs.sigmoid().reshape(sizes.clone());
    let zs = ys.flatten(0, -1) * (n as f64);
    (zs, sizes.len())
}

#[checkpointed(segments = auto)]
fn generic<T: ckpt::Stash + Clone>(xs: &Tensor, tag: T) -> (Tensor, T) {
    let ys = xs.exp();
    let tag2 = tag.clone();
    (ys.log(), tag2)
}

#[checkpointed(budget = "100%")]
fn fallible(xs: &Tensor, log: &mut Vec<String>) -> Result<Tensor, TchError> {
    let ys = xs.relu();
    let zs = ys.tanh();
    {
        log.push("done".into());
        zs.f_sigmoid()
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let mlp = Mlp {
        l1: nn::linear(vs.root() / "l1", 4, 4, Default::default()),
        l2: nn::linear(vs.root() / "l2", 4, 4, Default::default()),
    };
    let x = Tensor::randn([8, 4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    for _ in 0..2 {
        mlp.inherent(&x, 0.5).sum(Kind::Float).backward();
        mlp.forward(&x).sum(Kind::Float).backward();
        let (f, n) = free(&x, &["a"], "bc", vec![2, 16]);
        assert_eq!(n, 2);
        f.sum(Kind::Float).backward();
        let (g, tag) = generic(&x, 7u8);
        assert_eq!(tag, 7);
        g.sum(Kind::Float).backward();
        let mut log = Vec::new();
        fallible(&x, &mut log).unwrap().sum(Kind::Float).backward();
        assert_eq!(log, ["done"]);
    }
    for p in ckpt::plan::function_plans() {
        println!("{}: {}", p.function, p.plan.cuts().len());
    }
}
