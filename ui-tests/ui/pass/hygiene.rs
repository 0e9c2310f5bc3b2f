//! Generated names cannot clash with the user's: bindings named like the macro's
//! locals, a local `ckpt` module, `self` inside macro invocations, raw identifiers.
use tch::{nn, nn::Module, Device, Kind, Tensor};

#[allow(dead_code)]
mod ckpt_user {
    pub fn segment() -> i64 {
        0
    }
}

macro_rules! twice {
    ($e:expr) => {
        $e * 2.0
    };
}

#[derive(Debug, ckpt::ShallowClone)]
struct Model {
    lin: nn::Linear,
}

impl Model {
    #[ckpt::checkpointed(segments = 4)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let __ckpt_input = self.lin.forward(xs);
        let __ckpt_self = 2.0;
        let __ckpt_options = twice!(self.lin.forward(&__ckpt_input)) * __ckpt_self;
        let r#type = format!("{}", ckpt_user::segment());
        let __ckpt_shared_self = __ckpt_options.relu();
        let __ckpt_capture_self = self.lin.forward(&__ckpt_shared_self);
        __ckpt_capture_self + r#type.len() as f64
    }
}

/// `segments = auto` keeps a plan cache in a static; it does not collide with locals.
#[ckpt::checkpointed(segments = auto)]
#[allow(non_snake_case)]
fn auto(xs: &Tensor) -> Tensor {
    let __CKPT_CHAIN = xs.relu();
    let CHAIN = __CKPT_CHAIN.sigmoid();
    let __ckpt_chain = CHAIN.tanh();
    __ckpt_chain.sum(Kind::Float)
}

fn main() {
    let ys = Tensor::randn([2, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    auto(&ys).backward();
    assert!(ys.grad().defined());
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Model { lin: nn::linear(vs.root(), 3, 3, Default::default()) };
    let xs = Tensor::randn([2, 3], (Kind::Float, Device::Cpu));
    m.forward(&xs).sum(Kind::Float).backward();
    assert!(m.lin.ws.grad().defined());
}
