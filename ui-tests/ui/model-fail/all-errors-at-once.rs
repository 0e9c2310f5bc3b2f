//! Every error of a declaration is reported in one compile, and the code using the model
//! reports no follow-on errors (the struct and its impls are still emitted).
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

pub struct Config {
    d: i64,
}

ckpt::model! {
    #[checkpointed(segments = 0, preserve_rng_state = maybe)]
    pub struct Net(p, cfg: &Config) {
        fc: nn::Linear = nn::linear(p, cfg.d, cfg.d, Default::default()),
        fc: nn::Linear = nn::linear(p, cfg.d, cfg.d, Default::default()),
        head: nn::Linear,
        xs.relu(),
        dropout,
        |a, b, c| a,
        let late: Tensor = xs.ones_like(),
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(vs.root(), &Config { d: 4 });
    let _ = net.forward_t(&Tensor::zeros([1, 4], (Kind::Float, Device::Cpu)), true);
    let _ = &net.fc;
    let _ = &net.head;
}
