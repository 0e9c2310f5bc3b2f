//! The transformer encoder classifier of `examples/encoder.rs` and the planner's examples
//! and tests (6 pre-LN blocks, 4 heads, d_model 256, feed-forward 1024, learned positions,
//! mean pooling, linear head), written twice: declared with [`ckpt::model!`] ([`Encoder`]),
//! and as tch code is usually written, a struct and a `forward_t` with a loop over the
//! blocks, under `#[checkpointed(segments = 3)]` ([`HandEncoder`]).
//!
//! The model is [`Block`] (an ordinary struct: attention with a key padding mask and a
//! feed-forward layer) and either
//! - the `model!` declaration of [`Encoder`]: the chain `tok → dropout → blocks[0..6] →
//!   ln_f → mean pooling → head`, 11 stages, cut by `ckpt::sequential_segments(11, 3)`
//!   into stages `0..3 | 3..6 | 6..11`; or
//! - [`HandEncoder`], whose forward's 13 stages (7 statements, 6 loop iterations) the
//!   same rule cuts `0..4 | 4..8 | 8..13`: the masks, embedding and dropout, then blocks
//!   0 to 3 checkpointed, and blocks 4 and 5 with the head inline.

use ckpt::checkpointed;
use tch::nn;
use tch::{Kind, Tensor};

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

/// The encoder at test size (vocabulary 100, 4 classes, seq 64, 6 blocks, 4 heads,
/// d_model 64, feed-forward 256, dropout 0.1): the model of the planner's and the
/// macros' integration tests, small enough for a debug build.
pub const SMALL: Config = Config {
    vocab: 100,
    classes: 4,
    seq_len: 64,
    layers: 6,
    heads: 4,
    d_model: 64,
    ff: 256,
    dropout: 0.1,
};

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

/// The same encoder as tch code is usually written: a struct of layers and a forward with
/// a loop over the blocks, checkpointed by one attribute. Its variables have the names
/// `model!` gives [`Encoder`]'s (`pos`, `tok`, `blocks.{i}`, `ln_f`, `head`), so each
/// loads the other's weights.
#[derive(Debug, ckpt::ShallowClone)]
pub struct HandEncoder {
    pos: Tensor,
    tok: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    head: nn::Linear,
    dropout: f64,
}

impl HandEncoder {
    /// The encoder's variables under `p`.
    pub fn new(p: nn::Path, c: &Config) -> Self {
        HandEncoder {
            pos: p.randn("pos", &[c.seq_len, c.d_model], 0.0, 0.02),
            tok: nn::embedding(&p / "tok", c.vocab, c.d_model, Default::default()),
            blocks: (0..c.layers)
                .map(|i| Block::new(&p / "blocks" / i, c))
                .collect(),
            ln_f: nn::layer_norm(&p / "ln_f", vec![c.d_model], Default::default()),
            head: nn::linear(&p / "head", c.d_model, c.classes, Default::default()),
            dropout: c.dropout,
        }
    }

    /// Token ids `[batch, seq]` (0 = padding) → logits `[batch, classes]`.
    #[checkpointed(segments = 3)]
    pub fn forward_t(&self, ids: &Tensor, train: bool) -> Tensor {
        let pad = ids.eq(0);
        let keep = ids.ne(0).unsqueeze(-1).to_kind(Kind::Float);
        let mut xs = ids.apply(&self.tok) + self.pos.narrow(0, 0, ids.size()[1]);
        xs = xs.dropout(self.dropout, train);
        for block in self.blocks.iter() {
            xs = block.forward(&xs, &pad, train);
        }
        let xs = xs.apply(&self.ln_f);
        let pooled = (xs * &keep).sum_dim_intlist(1, false, Kind::Float)
            / keep.sum_dim_intlist(1, false, Kind::Float);
        pooled.apply(&self.head)
    }
}
