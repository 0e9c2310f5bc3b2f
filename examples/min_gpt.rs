//! A GPT written as tch's min-gpt example writes it (blocks are `nn::func_t` closures),
//! checkpointed without changing the blocks: each block goes into a `ckpt::Shared`, which
//! is a `ModuleT`, and `ckpt::checkpoint_sequential_t` runs them in segments. One
//! training step plain and one checkpointed, from the same seed: the gradients are
//! compared bit for bit (dropout on) and the peak tensor bytes printed.
//!
//! `cargo run --release --example min_gpt -- [segments]` (default 3).

use ckpt::Shared;
use tch::nn::{self, ModuleT};
use tch::{Device, IndexOp, Kind, Tensor};

const VOCAB: i64 = 64;
const EMBD: i64 = 64;
const HEADS: i64 = 4;
const LAYERS: i64 = 8;
const BLOCK: i64 = 128;
const PDROP: f64 = 0.1;

fn linear(p: nn::Path, i: i64, o: i64) -> nn::Linear {
    nn::linear(p, i, o, Default::default())
}

/// tch's min-gpt block: causal self-attention and an MLP, each residual.
fn block(p: &nn::Path) -> impl ModuleT + use<> {
    let (ln1, ln2) = (
        nn::layer_norm(p / "ln1", vec![EMBD], Default::default()),
        nn::layer_norm(p / "ln2", vec![EMBD], Default::default()),
    );
    let (key, query, value) = (
        linear(p / "key", EMBD, EMBD),
        linear(p / "query", EMBD, EMBD),
        linear(p / "value", EMBD, EMBD),
    );
    let proj = linear(p / "proj", EMBD, EMBD);
    let (lin1, lin2) = (
        linear(p / "lin1", EMBD, 4 * EMBD),
        linear(p / "lin2", 4 * EMBD, EMBD),
    );
    let mask = Tensor::ones([BLOCK, BLOCK], (Kind::Float, p.device())).tril(0);
    let attn = nn::func_t(move |xs, train| {
        let (b, t, c) = xs.size3().unwrap();
        let sizes = [b, t, HEADS, c / HEADS];
        let k = xs.apply(&key).view(sizes).transpose(1, 2);
        let q = xs.apply(&query).view(sizes).transpose(1, 2);
        let v = xs.apply(&value).view(sizes).transpose(1, 2);
        let att = q.matmul(&k.transpose(-2, -1)) * (1.0 / (sizes[3] as f64).sqrt());
        let att = att.masked_fill(&mask.i((..t, ..t)).eq(0.), f64::NEG_INFINITY);
        let att = att.softmax(-1, Kind::Float).dropout(PDROP, train);
        let ys = att.matmul(&v).transpose(1, 2).contiguous().view([b, t, c]);
        ys.apply(&proj).dropout(PDROP, train)
    });
    nn::func_t(move |xs, train| {
        let xs = xs + xs.apply(&ln1).apply_t(&attn, train);
        let ys = xs.apply(&ln2).apply(&lin1).gelu("none").apply(&lin2);
        xs + ys.dropout(PDROP, train)
    })
}

/// The GPT; `segments = None` is tch's model, `Some(n)` checkpoints the blocks in `n`
/// segments.
fn gpt(p: &nn::Path, segments: Option<usize>) -> impl ModuleT + use<> {
    let tok_emb = nn::embedding(p / "tok_emb", VOCAB, EMBD, Default::default());
    let pos_emb = p.zeros("pos_emb", &[1, BLOCK, EMBD]);
    let ln_f = nn::layer_norm(p / "ln_f", vec![EMBD], Default::default());
    let head = linear(p / "head", EMBD, VOCAB);
    let blocks: Vec<Shared<nn::FuncT<'static>>> = (0..LAYERS)
        .map(|i| {
            let b = block(&(p / i));
            Shared::new(nn::func_t(move |xs, train| b.forward_t(xs, train)))
        })
        .collect();
    nn::func_t(move |xs, train| {
        let t = xs.size()[1];
        let h = (xs.apply(&tok_emb) + pos_emb.i((.., ..t, ..))).dropout(PDROP, train);
        let h = match segments {
            None => blocks.iter().fold(h, |h, b| h.apply_t(b, train)),
            Some(n) => ckpt::checkpoint_sequential_t(&blocks, n, &h, train),
        };
        h.apply(&ln_f).apply(&head)
    })
}

/// One training step: the gradients (by name) and the step's peak tensor bytes.
fn step(segments: Option<usize>) -> (Vec<(String, Tensor)>, i64) {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = gpt(&vs.root(), segments);
    let xs = Tensor::randint(VOCAB, [8, BLOCK], (Kind::Int64, Device::Cpu));
    let ys = Tensor::randint(VOCAB, [8, BLOCK], (Kind::Int64, Device::Cpu));
    let ((), report) = ckpt::memory::measure(Device::Cpu, || {
        let logits = xs.apply_t(&model, true);
        logits
            .view([-1, VOCAB])
            .cross_entropy_for_logits(&ys.view([-1]))
            .backward();
    });
    let mut grads: Vec<_> = vs
        .variables()
        .into_iter()
        .map(|(k, v)| (k, v.grad().copy()))
        .collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    (grads, report.peak_above_baseline_bytes)
}

fn main() {
    let segments = std::env::args()
        .nth(1)
        .map_or(3, |s| s.parse().expect("segments"));
    let (plain, plain_peak) = step(None);
    let (ckpt, ckpt_peak) = step(Some(segments));
    let identical = plain.iter().zip(&ckpt).all(|((_, a), (_, b))| a.equal(b));
    println!("{LAYERS} blocks, {segments} segments, dropout {PDROP}");
    println!(
        "peak MiB: plain {:.2}, checkpointed {:.2} (ratio {:.3})",
        plain_peak as f64 / 1048576.0,
        ckpt_peak as f64 / 1048576.0,
        ckpt_peak as f64 / plain_peak as f64
    );
    println!(
        "gradients of {} variables bit-identical: {identical}",
        plain.len()
    );
    assert!(identical);
}
