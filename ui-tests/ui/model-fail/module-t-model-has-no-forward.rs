//! A model with a stage that takes the train flag implements `ModuleT`, not `Module`
//! (tch implements `ModuleT` for every `Module`, so never both): call `forward_t`.
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

ckpt::model! {
    struct Net(p) {
        fc: nn::Linear = nn::linear(p, 4, 4, Default::default()),
        dropout(0.1),
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(vs.root());
    let _ = net.forward(&Tensor::zeros([1, 4], (Kind::Float, Device::Cpu)));
}
