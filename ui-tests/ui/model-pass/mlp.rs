//! A plain model: doc comments, visibility, `pub` fields, `Module` (no stage takes the
//! train flag), `ShallowClone`, `Debug`; variables named after the fields.
use ckpt::ShallowClone;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

pub struct MlpConfig {
    pub d_in: i64,
    pub hidden: i64,
    pub classes: i64,
}

mod models {
    use super::MlpConfig;
    use tch::nn;

    ckpt::model! {
        /// A perceptron.
        #[allow(missing_docs)]
        pub struct Mlp(p, cfg: &MlpConfig) {
            /// The hidden layer.
            pub fc1: nn::Linear = nn::linear(p, cfg.d_in, cfg.hidden, Default::default()),
            relu,
            pub(crate) fc2: nn::Linear = nn::linear(p, cfg.hidden, cfg.classes, Default::default()),
        }
    }
}

fn is_module<M: Module + ShallowClone + std::fmt::Debug>(_: &M) {}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = MlpConfig {
        d_in: 3,
        hidden: 8,
        classes: 2,
    };
    let mlp = models::Mlp::new(vs.root(), &cfg);
    is_module(&mlp);
    let x = Tensor::randn([5, 3], (Kind::Float, Device::Cpu));
    let expected = x.apply(&mlp.fc1).relu().apply(&mlp.fc2);
    assert!(mlp.forward(&x).equal(&expected));
    assert!(mlp.shallow_clone().forward(&x).equal(&expected));
    let mut names: Vec<String> = vs.variables().into_keys().collect();
    names.sort();
    assert_eq!(names, ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]);
    assert!(format!("{mlp:?}").starts_with("Mlp { fc1: Linear"));
}
