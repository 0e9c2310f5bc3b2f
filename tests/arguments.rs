//! The arguments tch forwards really have, under `#[checkpointed]`: an `Option<&Tensor>`
//! attention mask (tch's usual mask argument), an optional module (`Option<&nn::Linear>`),
//! an `impl Borrow<Tensor>` input, and recurrent states (`&nn::GRUState`,
//! `&nn::LSTMState`) that flow from one step of a decoder loop to the next (tch's
//! translation example), which must enter segments as inputs so that gradients flow
//! through them. Each against the same body without the attribute, bit for bit; a
//! `ckpt::Shared` recurrent layer's `lock()` is used inside the segments.

mod common;

use std::borrow::Borrow;
use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::{ShallowClone, Shared, checkpointed};
use tch::nn::{self, GRUState, LSTMState, Module, RNN};
use tch::{Device, Kind, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `fn $ckpt` under `#[checkpointed(args)]` and `fn $plain` without it, from one body.
macro_rules! twins {
    ([$($args:tt)*] $ckpt:ident $plain:ident $($rest:tt)*) => {
        #[checkpointed($($args)*)]
        fn $ckpt $($rest)*
        fn $plain $($rest)*
    };
}

/// Gradients of every variable of `vs` (name order) and the output, after backward of a
/// fixed weighting of `f()` (seeded: dropout draws the same masks).
fn run(vs: &nn::VarStore, f: &dyn Fn() -> Tensor) -> Vec<Tensor> {
    tch::manual_seed(11);
    let y = f();
    let w = (Tensor::arange(y.numel() as i64, (Kind::Float, Device::Cpu)) * 0.7)
        .cos()
        .reshape(y.size());
    let params = common::params(vs);
    let mut out = common::grads_of(&(&y * w).sum(Kind::Float), &params);
    out.push(y.detach().copy());
    out
}

fn same(vs: &nn::VarStore, what: &str, ckpt: &dyn Fn() -> Tensor, plain: &dyn Fn() -> Tensor) {
    let (a, b) = (run(vs, ckpt), run(vs, plain));
    assert!(
        a.iter()
            .any(|g| g.defined() && g.abs().sum(Kind::Float).double_value(&[]) > 0.0),
        "{what}: no gradient"
    );
    common::assert_all_equal(what, &a, &b);
    assert_eq!(ckpt::live_segments(), 0, "{what}: segments leaked");
}

#[derive(Debug, ShallowClone)]
struct Attention {
    qkv: nn::Linear,
    out: nn::Linear,
    heads: i64,
}

impl Attention {
    twins!([segments = 3] masked masked_plain(&self, xs: &Tensor, mask: Option<&Tensor>, head: Option<&nn::Linear>) -> Tensor {
        let (b, t, d) = xs.size3().unwrap();
        let qkv = xs.apply(&self.qkv).chunk(3, -1);
        let [q, k, v] = [0, 1, 2].map(|i| qkv[i].view([b, t, self.heads, d / self.heads]).transpose(1, 2));
        let scores = q.matmul(&k.transpose(-2, -1)) / ((d / self.heads) as f64).sqrt();
        let scores = match mask {
            Some(mask) => scores.masked_fill(mask, f64::NEG_INFINITY),
            None => scores,
        };
        let ys = scores.softmax(-1, Kind::Float).matmul(&v).transpose(1, 2).reshape([b, t, d]);
        let ys = ys.apply(&self.out);
        match head {
            Some(head) => head.forward(&ys),
            None => ys,
        }
    });

    twins!([] whole whole_plain(&self, xs: impl Borrow<Tensor>, mask: Option<&Tensor>) -> Tensor {
        let xs: &Tensor = xs.borrow();
        let ys = self.masked_plain(xs, mask, None);
        ys.dropout(0.2, true)
    });
}

#[test]
fn optional_masks_optional_modules_and_borrowed_inputs() {
    let _serial = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    let attn = Attention {
        qkv: nn::linear(&p / "qkv", 16, 48, Default::default()),
        out: nn::linear(&p / "out", 16, 16, Default::default()),
        heads: 4,
    };
    let head = nn::linear(&p / "head", 16, 16, Default::default());
    let xs = Tensor::randn([2, 6, 16], (Kind::Float, Device::Cpu));
    let causal = Tensor::ones([6, 6], (Kind::Bool, Device::Cpu))
        .triu(1)
        .view([1, 1, 6, 6]);
    for (what, mask) in [("mask", Some(&causal)), ("no mask", None)] {
        same(&vs, what, &|| attn.masked(&xs, mask, Some(&head)), &|| {
            attn.masked_plain(&xs, mask, Some(&head))
        });
        same(&vs, what, &|| attn.masked(&xs, mask, None), &|| {
            attn.masked_plain(&xs, mask, None)
        });
        same(&vs, what, &|| attn.whole(xs.shallow_clone(), mask), &|| {
            attn.whole_plain(xs.shallow_clone(), mask)
        });
        same(&vs, what, &|| attn.whole(&xs, mask), &|| {
            attn.whole_plain(&xs, mask)
        });
    }
}

/// The decoder of tch's translation example, sized down, with its GRU shared (tch keeps
/// a GRU's weights private) and its step checkpointed whole: the state it takes is the
/// previous step's output.
#[derive(Debug, ShallowClone)]
struct GruDecoder {
    embedding: nn::Embedding,
    gru: Shared<nn::GRU>,
    attn: nn::Linear,
    attn_combine: nn::Linear,
    linear: nn::Linear,
}

const HIDDEN: i64 = 16;
const MAX_LENGTH: i64 = 5;
const VOCAB: i64 = 12;

impl GruDecoder {
    fn new(vs: nn::Path) -> Self {
        GruDecoder {
            embedding: nn::embedding(&vs / "embedding", VOCAB, HIDDEN, Default::default()),
            gru: Shared::new(nn::gru(&vs / "gru", HIDDEN, HIDDEN, Default::default())),
            attn: nn::linear(&vs / "attn", HIDDEN * 2, MAX_LENGTH, Default::default()),
            attn_combine: nn::linear(&vs / "combine", HIDDEN * 2, HIDDEN, Default::default()),
            linear: nn::linear(&vs / "linear", HIDDEN, VOCAB, Default::default()),
        }
    }

    twins!([] forward forward_plain(&self, xs: &Tensor, state: &GRUState, enc_outputs: &Tensor, is_training: bool) -> (Tensor, GRUState) {
        let xs = self.embedding.forward(xs).dropout(0.1, is_training).view([1, -1]);
        let attn_weights = Tensor::cat(&[&xs, &state.value().view([1, -1])], 1)
            .apply(&self.attn)
            .unsqueeze(0);
        let attn_applied = attn_weights.bmm(enc_outputs).squeeze_dim(1);
        let xs = Tensor::cat(&[&xs, &attn_applied], 1)
            .apply(&self.attn_combine)
            .relu();
        let state = self.gru.lock().step(&xs, state);
        let logits = self.linear.forward(&state.value().view([1, -1]));
        (logits.log_softmax(-1, Kind::Float), state)
    });
}

/// An LSTM step with the state flowing on, cut in two.
#[derive(Debug, ShallowClone)]
struct LstmCell {
    lstm: Shared<nn::LSTM>,
    proj: nn::Linear,
}

impl LstmCell {
    twins!([segments = 2] step step_plain(&self, xs: &Tensor, state: &LSTMState) -> (Tensor, LSTMState) {
        let xs = xs.apply(&self.proj).tanh();
        let state = self.lstm.lock().step(&xs, state);
        (state.h(), state)
    });
}

#[test]
fn recurrent_states_flow_through_checkpointed_decoder_steps() {
    let _serial = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let decoder = GruDecoder::new(vs.root() / "dec");
    let cell = LstmCell {
        lstm: Shared::new(nn::lstm(
            vs.root() / "lstm",
            HIDDEN,
            HIDDEN,
            Default::default(),
        )),
        proj: nn::linear(vs.root() / "proj", HIDDEN, HIDDEN, Default::default()),
    };
    let enc_outputs =
        Tensor::randn([1, MAX_LENGTH, HIDDEN], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let targets = [3i64, 7, 1, 4, 9, 2];
    let decode = |ckpt: bool| {
        let mut state = decoder.gru.lock().zero_state(1);
        let mut losses = Vec::new();
        let mut prev = Tensor::from_slice(&[0i64]);
        for &t in &targets {
            let (output, state_) = if ckpt {
                decoder.forward(&prev, &state, &enc_outputs, true)
            } else {
                decoder.forward_plain(&prev, &state, &enc_outputs, true)
            };
            state = state_;
            let target = Tensor::from_slice(&[t]);
            losses.push(output.nll_loss(&target));
            prev = target;
        }
        Tensor::stack(&losses, 0)
    };
    same(&vs, "GRU decoder", &|| decode(true), &|| decode(false));

    let lstm_steps = |ckpt: bool| {
        let mut state = cell.lstm.lock().zero_state(2);
        let mut outs = Vec::new();
        for i in 0..5 {
            let xs = Tensor::full([2, HIDDEN], 0.1 * i as f64, (Kind::Float, Device::Cpu));
            let (h, s) = if ckpt {
                cell.step(&xs, &state)
            } else {
                cell.step_plain(&xs, &state)
            };
            outs.push(h);
            state = s;
        }
        Tensor::stack(&outs, 0)
    };
    same(&vs, "LSTM steps", &|| lstm_steps(true), &|| {
        lstm_steps(false)
    });
}
