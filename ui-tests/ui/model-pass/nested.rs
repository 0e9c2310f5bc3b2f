//! A `model!` model is a module like any other: it can be a stage of another one, and a
//! `ckpt::Shared` module (tch's LSTM) can be a stage too.
use tch::nn::{self, Module, RNN};
use tch::{Device, Kind, Tensor};

ckpt::model! {
    /// A feed-forward branch.
    struct FeedForward(p, d: i64) {
        fc1: nn::Linear = nn::linear(p, d, 4 * d, Default::default()),
        gelu,
        fc2: nn::Linear = nn::linear(p, 4 * d, d, Default::default()),
    }
}

fn last_step(lstm: &ckpt::Shared<nn::LSTM>, xs: &Tensor) -> Tensor {
    let (out, _) = lstm.lock().seq(xs);
    out.select(1, -1)
}

ckpt::model! {
    #[checkpointed(segments = 2)]
    struct Outer(p, d: i64) {
        ff: [FeedForward; 2] = FeedForward::new(p, d),
        |xs| xs.unsqueeze(1),
        lstm: ckpt::Shared<nn::LSTM> = ckpt::Shared::new(nn::lstm(p, d, d, Default::default()))
            => |l, xs| last_step(l, xs),
    }
}

fn main() {
    let vs = nn::VarStore::new(Device::Cpu);
    let outer = Outer::new(vs.root(), 4);
    let x = Tensor::randn([2, 4], (Kind::Float, Device::Cpu));
    outer.forward(&x).sum(Kind::Float).backward();
    let names: Vec<String> = vs.variables().into_keys().collect();
    assert!(names.contains(&"ff.1.fc2.weight".to_owned()), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("lstm.")), "{names:?}");
}
