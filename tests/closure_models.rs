//! Models written the way tch writes them (issue 11, item 4): recurrent layers in a
//! `#[derive(ShallowClone)]` struct, and closure-built models (`nn::func_t` blocks in an
//! `nn::seq_t`, as tch's min-gpt example writes a GPT) checkpointed through
//! `ckpt::Shared`, which is a `ModuleT`: gradients equal the plain model's bit for bit
//! with dropout on, and the peak is lower.

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::{ShallowClone, Shared};
use tch::nn::{self, Module, ModuleT, RNN};
use tch::{Device, IndexOp, Kind, Tensor};

/// The RNG and the memory counter are process-wide: the tests of this file take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Gradients of every trainable variable, by name, after `loss.backward()`.
fn grads(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut g: Vec<_> = vs
        .variables()
        .into_iter()
        .filter(|(_, v)| v.requires_grad())
        .map(|(k, v)| (k, v.grad().copy()))
        .collect();
    g.sort_by(|a, b| a.0.cmp(&b.0));
    g
}

fn zero_grads(vs: &nn::VarStore) {
    for v in vs.trainable_variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

fn assert_same_grads(what: &str, a: &[(String, Tensor)], b: &[(String, Tensor)]) {
    assert_eq!(a.len(), b.len(), "{what}");
    for ((na, ga), (nb, gb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        assert!(ga.defined() && gb.defined(), "{what}: {na} has a gradient");
        assert!(ga.equal(gb), "{what}: gradient of {na}");
    }
}

// ---------------------------------------------------------------------------------------
// Recurrent layers derive like the other tch layers.

#[derive(Debug, ShallowClone)]
struct Recurrent {
    gru: nn::GRU,
    lstm: nn::LSTM,
    head: nn::Linear,
}

impl Recurrent {
    fn new(p: &nn::Path) -> Self {
        Recurrent {
            gru: nn::gru(p / "gru", 3, 6, Default::default()),
            lstm: nn::lstm(
                p / "lstm",
                6,
                5,
                nn::RNNConfig {
                    num_layers: 2,
                    ..Default::default()
                },
            ),
            head: nn::linear(p / "head", 5, 2, Default::default()),
        }
    }

    fn forward(&self, xs: &Tensor) -> Tensor {
        let (h, _) = self.gru.seq(xs);
        let (h, _) = self.lstm.seq(&h);
        h.apply(&self.head)
    }
}

#[test]
fn derived_struct_with_gru_and_lstm_shares_their_weights() {
    let _serial = serial();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Recurrent::new(&vs.root());
    let copy = model.shallow_clone();
    let xs = Tensor::randn([2, 4, 3], (Kind::Float, Device::Cpu));

    // Same outputs, and the copy's gradients land in the original's variables.
    let plain = model.forward(&xs);
    plain.sum(Kind::Float).backward();
    let want = grads(&vs);
    zero_grads(&vs);
    let through_copy = copy.forward(&xs);
    assert!(plain.equal(&through_copy));
    through_copy.sum(Kind::Float).backward();
    assert_same_grads("shallow clone", &want, &grads(&vs));
    // 4 GRU tensors, 8 LSTM tensors (2 layers), 2 linear.
    assert_eq!(want.len(), 14);

    // Checkpointed: the segment owns a shallow clone of the model.
    zero_grads(&vs);
    let seg = model.shallow_clone();
    let y = ckpt::checkpoint(move |x: Tensor| seg.forward(&x), xs.shallow_clone());
    // A checkpointed segment's forward runs without grad, and libtorch's CPU RNN kernels
    // take another path then (measured: 3e-8 away from the grad-mode output): the output
    // is the no-grad model's, bit for bit; the gradients (from the recompute, in grad
    // mode) are the plain model's, bit for bit.
    let nograd = tch::no_grad(|| model.forward(&xs));
    assert!(y.equal(&nograd));
    y.sum(Kind::Float).backward();
    assert_same_grads("checkpointed GRU + LSTM", &want, &grads(&vs));

    // The copy is the same layer: an in-place change of the original's weights shows.
    tch::no_grad(|| {
        for v in vs.trainable_variables() {
            let _ = v.shallow_clone().fill_(0.5);
        }
    });
    assert!(model.forward(&xs).equal(&copy.forward(&xs)));
}

// ---------------------------------------------------------------------------------------
// A GPT as tch's min-gpt example writes it.

#[derive(Debug, Clone, Copy)]
struct Config {
    vocab_size: i64,
    n_embd: i64,
    n_head: i64,
    n_layer: i64,
    block_size: i64,
    attn_pdrop: f64,
    resid_pdrop: f64,
    embd_pdrop: f64,
}

const CFG: Config = Config {
    vocab_size: 40,
    n_embd: 32,
    n_head: 4,
    n_layer: 6,
    block_size: 64,
    attn_pdrop: 0.1,
    resid_pdrop: 0.1,
    embd_pdrop: 0.1,
};

fn linear(vs: nn::Path, in_dim: i64, out_dim: i64) -> nn::Linear {
    let wd = vs.set_group(0);
    let no_wd = vs.set_group(1);
    nn::Linear {
        ws: wd.randn("weight", &[out_dim, in_dim], 0.0, 0.02),
        bs: Some(no_wd.zeros("bias", &[out_dim])),
    }
}

fn causal_self_attention(p: &nn::Path, cfg: Config) -> impl ModuleT + use<> {
    let key = linear(p / "key", cfg.n_embd, cfg.n_embd);
    let query = linear(p / "query", cfg.n_embd, cfg.n_embd);
    let value = linear(p / "value", cfg.n_embd, cfg.n_embd);
    let proj = linear(p / "proj", cfg.n_embd, cfg.n_embd);
    let mask_init =
        Tensor::ones([cfg.block_size, cfg.block_size], (Kind::Float, p.device())).tril(0);
    let mask_init = mask_init.view([1, 1, cfg.block_size, cfg.block_size]);
    let mask = mask_init;
    nn::func_t(move |xs, train| {
        let (sz_b, sz_t, sz_c) = xs.size3().unwrap();
        let sizes = [sz_b, sz_t, cfg.n_head, sz_c / cfg.n_head];
        let k = xs.apply(&key).view(sizes).transpose(1, 2);
        let q = xs.apply(&query).view(sizes).transpose(1, 2);
        let v = xs.apply(&value).view(sizes).transpose(1, 2);
        let att = q.matmul(&k.transpose(-2, -1)) * (1.0 / f64::sqrt(sizes[3] as f64));
        let att = att.masked_fill(&mask.i((.., .., ..sz_t, ..sz_t)).eq(0.), f64::NEG_INFINITY);
        let att = att.softmax(-1, Kind::Float).dropout(cfg.attn_pdrop, train);
        let ys = att
            .matmul(&v)
            .transpose(1, 2)
            .contiguous()
            .view([sz_b, sz_t, sz_c]);
        ys.apply(&proj).dropout(cfg.resid_pdrop, train)
    })
}

fn block(p: &nn::Path, cfg: Config) -> impl ModuleT + use<> {
    let ln1 = nn::layer_norm(p / "ln1", vec![cfg.n_embd], Default::default());
    let ln2 = nn::layer_norm(p / "ln2", vec![cfg.n_embd], Default::default());
    let attn = causal_self_attention(p, cfg);
    let lin1 = linear(p / "lin1", cfg.n_embd, 4 * cfg.n_embd);
    let lin2 = linear(p / "lin2", 4 * cfg.n_embd, cfg.n_embd);
    nn::func_t(move |xs, train| {
        let xs = xs + xs.apply(&ln1).apply_t(&attn, train);
        let ys = xs
            .apply(&ln2)
            .apply(&lin1)
            .gelu("none")
            .apply(&lin2)
            .dropout(cfg.resid_pdrop, train);
        xs + ys
    })
}

/// How the GPT's blocks run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// tch's model: the blocks in an `nn::seq_t`.
    Plain,
    /// The whole `nn::seq_t` as one checkpointed segment.
    Stack,
    /// Each `nn::func_t` block a checkpointed segment.
    PerBlock,
    /// `checkpoint_sequential_t` over the blocks, in this many segments.
    Groups(usize),
}

/// tch's min-gpt `gpt` function; the blocks are written as there, only the container
/// differs with `mode` (a `Shared` `nn::seq_t`, or a `Vec` of `Shared` blocks).
fn gpt(p: nn::Path, cfg: Config, mode: Mode) -> impl ModuleT + use<> {
    let p = &p.set_group(0);
    let tok_emb = nn::embedding(
        p / "tok_emb",
        cfg.vocab_size,
        cfg.n_embd,
        Default::default(),
    );
    let pos_emb = p.zeros("pos_emb", &[1, cfg.block_size, cfg.n_embd]);
    let ln_f = nn::layer_norm(p / "ln_f", vec![cfg.n_embd], Default::default());
    let head = nn::linear(
        p / "head",
        cfg.n_embd,
        cfg.vocab_size,
        nn::LinearConfig {
            bias: false,
            ..Default::default()
        },
    );
    let mut stack = nn::seq_t();
    let mut blocks = Vec::new();
    for block_idx in 0..cfg.n_layer {
        let b = block(&(p / block_idx), cfg);
        if mode == Mode::Plain || mode == Mode::Stack {
            stack = stack.add(b);
        } else {
            blocks.push(Shared::new(nn::func_t(move |xs, train| {
                b.forward_t(xs, train)
            })));
        }
    }
    let stack = Shared::new(stack);
    nn::func_t(move |xs, train| {
        let (_sz_b, sz_t) = xs.size2().unwrap();
        let tok_emb = xs.apply(&tok_emb);
        let pos_emb = pos_emb.i((.., ..sz_t, ..));
        let h = (tok_emb + pos_emb).dropout(cfg.embd_pdrop, train);
        let h = match mode {
            Mode::Plain => h.apply_t(&stack, train),
            Mode::Stack => {
                let stack = stack.shallow_clone();
                ckpt::checkpoint(move |h: Tensor| h.apply_t(&stack, train), h)
            }
            Mode::PerBlock => blocks.iter().fold(h, |h, b| {
                let b = b.shallow_clone();
                ckpt::checkpoint(move |h: Tensor| h.apply_t(&b, train), h)
            }),
            Mode::Groups(n) => ckpt::checkpoint_sequential_t(&blocks, n, &h, train),
        };
        h.apply(&ln_f).apply(&head)
    })
}

/// One training step's loss, gradients and peak tensor bytes above the start.
fn gpt_step(mode: Mode) -> (Tensor, Vec<(String, Tensor)>, i64) {
    tch::manual_seed(42);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = gpt(vs.root(), CFG, mode);
    let xs = Tensor::randint(
        CFG.vocab_size,
        [4, CFG.block_size],
        (Kind::Int64, Device::Cpu),
    );
    let ys = Tensor::randint(
        CFG.vocab_size,
        [4, CFG.block_size],
        (Kind::Int64, Device::Cpu),
    );
    tch::manual_seed(7);
    let (loss, report) = ckpt::memory::measure(Device::Cpu, || {
        let logits = xs.apply_t(&model, true);
        let loss = logits
            .view([-1, CFG.vocab_size])
            .cross_entropy_for_logits(&ys.view([-1]));
        loss.backward();
        loss.detach()
    });
    (loss, grads(&vs), report.peak_above_baseline_bytes)
}

#[test]
fn min_gpt_checkpointed_per_block_and_per_group_trains_as_plain() {
    let _serial = serial();
    ckpt::memory::enable();
    let (loss, want, plain_peak) = gpt_step(Mode::Plain);
    assert_eq!(
        want.len(),
        5 + 6 * 16,
        "embeddings (2), ln_f (2), head, 6 blocks of 16"
    );
    for mode in [
        Mode::Stack,
        Mode::PerBlock,
        Mode::Groups(2),
        Mode::Groups(3),
    ] {
        let (l, got, peak) = gpt_step(mode);
        assert!(l.equal(&loss), "{mode:?}: loss");
        assert_same_grads(&format!("{mode:?}"), &want, &got);
        println!(
            "min-gpt {mode:?}: peak {peak} bytes, plain {plain_peak} bytes, ratio {:.3}",
            peak as f64 / plain_peak as f64
        );
        // The whole stack as one segment recomputes every block at once in backward:
        // its peak is the plain one's (plus the stash); per block and per group save.
        if mode != Mode::Stack {
            assert!(
                peak < plain_peak,
                "{mode:?}: peak {peak} >= plain {plain_peak}"
            );
        }
    }
}

/// A boxed `dyn ModuleT` (as tch's model builders return them) goes into `Shared` through
/// `nn::func_t`; `Shared<T: Module>` keeps `forward`.
#[test]
fn shared_boxed_dyn_module_t_checkpoints() {
    let _serial = serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks: Vec<Shared<nn::FuncT<'static>>> = (0..4)
        .map(|i| {
            let boxed: Box<dyn ModuleT> = Box::new(block(&(vs.root() / i), CFG));
            Shared::new(nn::func_t(move |xs, train| boxed.forward_t(xs, train)))
        })
        .collect();
    let x = Tensor::randn([2, 8, CFG.n_embd], (Kind::Float, Device::Cpu));
    tch::manual_seed(5);
    let plain = blocks
        .iter()
        .fold(x.shallow_clone(), |h, b| h.apply_t(b, true));
    plain.sum(Kind::Float).backward();
    let want = grads(&vs);
    zero_grads(&vs);
    tch::manual_seed(5);
    let y = ckpt::checkpoint_sequential_t(&blocks, 2, &x, true);
    assert!(y.equal(&plain));
    y.sum(Kind::Float).backward();
    assert_same_grads("Box<dyn ModuleT>", &want, &grads(&vs));
    // `Shared<T: Module>` keeps `forward`.
    let lin = Shared::new(nn::linear(vs.root() / "lin", 3, 2, Default::default()));
    let x = Tensor::ones([1, 3], (Kind::Float, Device::Cpu));
    assert!(lin.forward(&x).equal(&lin.lock().forward(&x)));
}

// ---------------------------------------------------------------------------------------
// The same closure-built blocks from `#[checkpointed]` and `model!`.

fn shared_block(p: nn::Path) -> Shared<nn::FuncT<'static>> {
    let b = block(&p, CFG);
    Shared::new(nn::func_t(move |xs, train| b.forward_t(xs, train)))
}

ckpt::model! {
    #[checkpointed(segments = 3)]
    struct GptBlocks(p, n: usize) {
        #[train] blocks: [Shared<nn::FuncT<'static>>; n] = shared_block(p),
    }
}

#[derive(Debug, ShallowClone)]
struct Blocks {
    blocks: Vec<Shared<nn::FuncT<'static>>>,
}

impl Blocks {
    fn plain(&self, xs: &Tensor, train: bool) -> Tensor {
        self.blocks
            .iter()
            .fold(xs.shallow_clone(), |h, b| h.apply_t(b, train))
    }

    #[ckpt::checkpointed(segments = 3)]
    fn segmented(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut xs = xs.shallow_clone();
        for block in self.blocks.iter() {
            xs = block.forward_t(&xs, train);
        }
        xs
    }

    /// Through `Shared::lock()`, which the mutation rule accepts (reading through a lock).
    #[ckpt::checkpointed(segments = 2)]
    fn locked(&self, xs: &Tensor, train: bool) -> Tensor {
        let h = self.blocks[0].lock().forward_t(xs, train);
        let h = self.blocks[1].lock().forward_t(&h, train);
        let h = self.blocks[2].lock().forward_t(&h, train);
        self.blocks[3].lock().forward_t(&h, train)
    }
}

#[test]
fn closure_built_blocks_through_checkpointed_and_model_train_as_plain() {
    let _serial = serial();
    let x = || {
        tch::manual_seed(9);
        Tensor::randn([2, 16, CFG.n_embd], (Kind::Float, Device::Cpu))
    };
    let run = |vs: &nn::VarStore, f: &dyn Fn(&Tensor) -> Tensor| {
        let x = x();
        tch::manual_seed(10);
        let y = f(&x);
        y.sum(Kind::Float).backward();
        (y.detach(), grads(vs))
    };

    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Blocks {
        blocks: (0..4).map(|i| shared_block(vs.root() / i)).collect(),
    };
    let (want_y, want) = run(&vs, &|x| m.plain(x, true));
    for (what, f) in [
        (
            "segments = 3",
            &(|x: &Tensor| m.segmented(x, true)) as &dyn Fn(&Tensor) -> Tensor,
        ),
        ("lock()", &|x: &Tensor| m.locked(x, true)),
    ] {
        zero_grads(&vs);
        let (y, got) = run(&vs, f);
        assert!(y.equal(&want_y), "{what}: output");
        assert_same_grads(what, &want, &got);
    }

    // `model!` builds the same variables from the same seed.
    tch::manual_seed(1);
    let vs_model = nn::VarStore::new(Device::Cpu);
    let model = GptBlocks::new(vs_model.root(), 4);
    let (y, got) = run(&vs_model, &|x| model.forward_t(x, true));
    assert!(y.equal(&want_y), "model!: output");
    let strip = |g: Vec<(String, Tensor)>| -> Vec<(String, Tensor)> {
        g.into_iter()
            .map(|(k, v)| (k.trim_start_matches("blocks.").to_owned(), v))
            .collect()
    };
    assert_same_grads("model!", &want, &strip(got));
}
