//! A transformer encoder classifier (6 pre-LN blocks, 4 heads,
//! d_model 256, feed-forward 1024, learned positions, mean pooling, linear head),
//! declared with [`ckpt::model!`] and checkpointed in 3 segments; `main` builds it and
//! runs one training step.
//!
//! ```text
//! cargo run --release --example encoder
//! ```
//!
//! The model is [`Block`] (an ordinary struct: attention with a key padding mask and a
//! feed-forward layer) and the `model!` declaration of [`Encoder`]: the chain
//! `tok → dropout → blocks[0..6] → ln_f → mean pooling → head`, 11 stages, cut by
//! `ckpt::sequential_segments(11, 3)` into stages `0..3 | 3..6 | 6..11`. Both are `pub`
//! so that other programs can reuse them (`#[path = "../encoder.rs"] mod encoder;`).

use anyhow::Result;
use tch::nn::{self, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// Sizes of the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Token ids are `0..vocab`; id 0 is padding.
    pub vocab: i64,
    /// Number of classes (output logits).
    pub classes: i64,
    /// Longest input: the number of learned positions.
    pub seq_len: i64,
    /// Encoder blocks.
    pub layers: usize,
    /// Attention heads; `d_model` must be a multiple.
    pub heads: i64,
    /// Width of the residual stream.
    pub d_model: i64,
    /// Width of the feed-forward hidden layer.
    pub ff: i64,
    /// Dropout probability (embeddings, attention weights, both residual branches, FF).
    pub dropout: f64,
}

/// A pre-LN encoder block: `x + attention(ln[0](x))`, then `x + ff(ln[1](x))`.
#[derive(Debug, ckpt::ShallowClone)]
pub struct Block {
    ln: [nn::LayerNorm; 2],
    qkv: nn::Linear,
    out: nn::Linear,
    ff: [nn::Linear; 2],
    cfg: Config,
}

impl Block {
    /// The block's variables under `p`: `ln1`, `ln2`, `qkv`, `out`, `ff1`, `ff2`.
    pub fn new(p: nn::Path, c: &Config) -> Self {
        let d = c.d_model;
        let ln = |name| nn::layer_norm(&p / name, vec![d], Default::default());
        let lin = |name, i, o| nn::linear(&p / name, i, o, Default::default());
        Block {
            ln: [ln("ln1"), ln("ln2")],
            qkv: lin("qkv", d, 3 * d),
            out: lin("out", d, d),
            ff: [lin("ff1", d, c.ff), lin("ff2", c.ff, d)],
            cfg: *c,
        }
    }

    /// `xs: [batch, seq, d_model]`, `pad: [batch, seq]` (true at padding) → like `xs`.
    pub fn forward(&self, xs: &Tensor, pad: &Tensor, train: bool) -> Tensor {
        let (b, s, d) = xs.size3().expect("block input is [batch, seq, d_model]");
        let (h, p) = (self.cfg.heads, self.cfg.dropout);
        let qkv = xs.apply(&self.ln[0]).apply(&self.qkv).chunk(3, -1);
        let [q, k, v] = [0, 1, 2].map(|i| qkv[i].view([b, s, h, d / h]).transpose(1, 2));
        let keep = Some(pad.logical_not().view([b, 1, 1, s]));
        let p_att = if train { p } else { 0.0 };
        let a = Tensor::scaled_dot_product_attention(&q, &k, &v, keep, p_att, false, None, false);
        let a = a.transpose(1, 2).reshape([b, s, d]).apply(&self.out);
        let xs = xs + a.dropout(p, train);
        let ff = xs.apply(&self.ln[1]).apply(&self.ff[0]).relu();
        &xs + ff.dropout(p, train).apply(&self.ff[1]).dropout(p, train)
    }
}

ckpt::model! {
    /// Token ids `[batch, seq]` (0 = padding) → logits `[batch, classes]`.
    #[checkpointed(segments = 3)]
    pub struct Encoder(p, c: &Config) {
        let pad: Tensor = xs.eq(0),
        let keep: Tensor = xs.ne(0).unsqueeze(-1).to_kind(Kind::Float),
        #[field] pos: Tensor = p.randn("pos", &[c.seq_len, c.d_model], 0.0, 0.02),
        tok: nn::Embedding = nn::embedding(p, c.vocab, c.d_model, Default::default())
            => |tok, ids| ids.apply(tok) + self.pos.narrow(0, 0, ids.size()[1]),
        dropout(c.dropout),
        blocks: [Block; c.layers] = Block::new(p, c) => |b, xs, train| b.forward(xs, &pad, train),
        ln_f: nn::LayerNorm = nn::layer_norm(p, vec![c.d_model], Default::default()),
        |xs| (xs * &keep).sum_dim_intlist(1, false, Kind::Float) / keep.sum_dim_intlist(1, false, Kind::Float),
        head: nn::Linear = nn::linear(p, c.d_model, c.classes, Default::default()),
    }
}

/// Builds the model (6 layers, 4 heads, d_model 256) and trains it on a batch of random
/// token ids with padded tails: one warm-up step (it allocates Adam's state), then one
/// step plain (`set_segments(1)`) and one checkpointed (the declared 3 segments); prints
/// the losses and the two steps' peak tensor memory.
fn main() -> Result<()> {
    tch::manual_seed(0);
    let c = Config {
        vocab: 1000,
        classes: 10,
        seq_len: 128,
        layers: 6,
        heads: 4,
        d_model: 256,
        ff: 1024,
        dropout: 0.1,
    };
    let (batch, device) = (16, Device::Cpu);
    let vs = nn::VarStore::new(device);
    let mut model = Encoder::new(vs.root(), &c);
    let mut opt = nn::Adam::default().build(&vs, 3e-4)?;

    // Random ids, each row padded after a random length in 8..=seq_len.
    let ids = Tensor::randint_low(1, c.vocab, [batch, c.seq_len], (Kind::Int64, device));
    let lengths = Tensor::randint_low(8, c.seq_len + 1, [batch, 1], (Kind::Int64, device));
    let positions = Tensor::arange(c.seq_len, (Kind::Int64, device)).unsqueeze(0);
    let ids = ids.masked_fill(&positions.ge_tensor(&lengths), 0);
    let labels = Tensor::randint(c.classes, [batch], (Kind::Int64, device));

    let mut step = |model: &Encoder| {
        ckpt::memory::measure(device, || {
            let loss = model
                .forward_t(&ids, true)
                .cross_entropy_for_logits(&labels);
            opt.backward_step(&loss);
            loss.double_value(&[])
        })
    };
    step(&model);
    model.set_segments(1)?;
    let (plain_loss, plain) = step(&model);
    model.set_segments(3)?;
    let (ckpt_loss, ckpt) = step(&model);

    let params: usize = vs.trainable_variables().iter().map(Tensor::numel).sum();
    let mib = |r: ckpt::memory::PeakReport| r.peak_above_baseline_bytes as f64 / 1048576.0;
    println!("{} blocks, {params} parameters", c.layers);
    println!(
        "plain step:        loss {plain_loss:.4}, peak tensor memory {:.1} MiB",
        mib(plain)
    );
    println!(
        "checkpointed step: loss {ckpt_loss:.4}, peak tensor memory {:.1} MiB (3 segments)",
        mib(ckpt)
    );
    Ok(())
}
