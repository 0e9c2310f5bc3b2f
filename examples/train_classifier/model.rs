//! The model: a pre-LN transformer encoder classifier, checkpointed with
//! [`ckpt::checkpoint_sequential_t`] over its blocks.
//!
//! ```text
//! ids [batch, seq] ─▶ token embedding + learned positions ─▶ dropout
//!   ─▶ layers × Block ─▶ LayerNorm ─▶ mean over non-pad positions ─▶ Linear ─▶ logits [batch, classes]
//! Block (pre-LN, as PyTorch's TransformerEncoderLayer with norm_first = true, ReLU):
//!   x = x + dropout(out_proj(attention(ln1(x))))
//!   x = x + dropout(ff2(dropout(relu(ff1(ln2(x))))))
//! attention: q, k, v from one linear; softmax(q kᵀ / sqrt(d_head) + key_bias) with
//!   key_bias = -inf at padding keys; dropout on the attention weights
//! ```
//!
//! Pre-LN (layer norm at the start of each residual branch, one more at the end) is
//! chosen because it trains stably with little learning-rate warm-up (Xiong et al.
//! 2020, "On Layer Normalization in the Transformer Architecture") and keeps the
//! residual stream free of normalisation, so each block's input, the tensor a
//! checkpointed segment stashes, is the plain sum that the previous block returned.
//!
//! A block needs the batch's padding mask besides its input, while a module in
//! `checkpoint_sequential_t` takes one tensor; [`MaskedBlock`] pairs a shallow clone of
//! a block with the mask of the current batch (a few reference-count increments per
//! step). The `ShallowClone` impls are written by hand; `model!` and
//! `#[derive(ShallowClone)]` will replace them.

use ckpt::ShallowClone;
use tch::nn::{self, ModuleT};
use tch::{Kind, Tensor};

use crate::data::PAD;

/// Sizes of the model; every one is a command-line flag.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    /// Token ids are `0..vocab_size`; id 0 is padding.
    pub vocab_size: i64,
    /// Number of classes (output logits).
    pub n_classes: i64,
    /// Longest input, the number of learned positions.
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

/// One encoder block's parameters.
#[derive(Debug)]
pub struct Block {
    ln1: nn::LayerNorm,
    qkv: nn::Linear,
    out: nn::Linear,
    ln2: nn::LayerNorm,
    ff1: nn::Linear,
    ff2: nn::Linear,
    heads: i64,
    dropout: f64,
}

impl Block {
    /// A block with its variables under `p` (`ln1`, `qkv`, `out`, `ln2`, `ff1`, `ff2`).
    pub fn new(p: nn::Path, cfg: &ModelConfig) -> Self {
        let d = cfg.d_model;
        Block {
            ln1: nn::layer_norm(&p / "ln1", vec![d], Default::default()),
            qkv: nn::linear(&p / "qkv", d, 3 * d, Default::default()),
            out: nn::linear(&p / "out", d, d, Default::default()),
            ln2: nn::layer_norm(&p / "ln2", vec![d], Default::default()),
            ff1: nn::linear(&p / "ff1", d, cfg.ff, Default::default()),
            ff2: nn::linear(&p / "ff2", cfg.ff, d, Default::default()),
            heads: cfg.heads,
            dropout: cfg.dropout,
        }
    }

    /// `xs: [batch, seq, d_model]`, `key_bias: [batch * heads, 1, seq]` (0 or -inf) →
    /// `[batch, seq, d_model]`.
    ///
    /// Each intermediate is dropped as soon as the next one exists, as Python frees a
    /// tensor at its last use: a `let` binding would otherwise hold it to the end of the
    /// function, and on top of what autograd saves that is about 48 MiB a block at seq
    /// 256, batch 16 (the `[batch * heads, seq, seq]` scores, the fused q/k/v output),
    /// which a checkpointed recompute would pay too.
    pub fn forward(&self, xs: &Tensor, key_bias: &Tensor, train: bool) -> Tensor {
        let (b, s, d) = xs.size3().expect("block input is [batch, seq, d_model]");
        let (h, p) = (self.heads, self.dropout);
        let dh = d / h;
        let (q, k, v) = {
            // [batch, seq, 3, heads, d_head] -> [3, batch, heads, seq, d_head]
            let qkv = xs
                .apply(&self.ln1)
                .apply(&self.qkv)
                .view([b, s, 3, h, dh])
                .permute([2, 0, 3, 1, 4]);
            let per_head = |i: i64| qkv.get(i).reshape([b * h, s, dh]);
            (per_head(0), per_head(1), per_head(2))
        };
        // key_bias + q kᵀ / sqrt(d_head) in one [batch * heads, seq, seq] allocation.
        let scores = key_bias.baddbmm(&q, &k.transpose(1, 2), 1.0, 1.0 / (dh as f64).sqrt());
        drop((q, k));
        let probs = scores.softmax(-1, Kind::Float);
        drop(scores);
        let weights = probs.dropout(p, train);
        drop(probs);
        let ctx = weights.bmm(&v);
        drop((weights, v));
        let attn = ctx
            .view([b, h, s, dh])
            .transpose(1, 2)
            .reshape([b, s, d])
            .apply(&self.out)
            .dropout(p, train);
        drop(ctx);
        let xs = xs + attn;
        let hidden = xs.apply(&self.ln2).apply(&self.ff1).relu();
        let ff = hidden.dropout(p, train).apply(&self.ff2).dropout(p, train);
        drop(hidden);
        xs + ff
    }
}

impl ShallowClone for Block {
    fn shallow_clone(&self) -> Self {
        Block {
            ln1: self.ln1.shallow_clone(),
            qkv: self.qkv.shallow_clone(),
            out: self.out.shallow_clone(),
            ln2: self.ln2.shallow_clone(),
            ff1: self.ff1.shallow_clone(),
            ff2: self.ff2.shallow_clone(),
            heads: self.heads,
            dropout: self.dropout,
        }
    }
}

/// A block with the key padding mask of the current batch: the one-tensor module that
/// `checkpoint_sequential_t` chains. A checkpointed segment captures it, mask included.
#[derive(Debug)]
pub struct MaskedBlock {
    block: Block,
    key_bias: Tensor,
}

impl ModuleT for MaskedBlock {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        self.block.forward(xs, &self.key_bias, train)
    }
}

impl ShallowClone for MaskedBlock {
    fn shallow_clone(&self) -> Self {
        MaskedBlock {
            block: self.block.shallow_clone(),
            key_bias: self.key_bias.shallow_clone(),
        }
    }
}

/// How the blocks are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// One after the other, every activation kept for backward (no `ckpt` involved).
    Plain,
    /// `ckpt::checkpoint_sequential_t` with this many segments (the last one is not
    /// checkpointed; 1 checkpoints nothing).
    Checkpointed(usize),
}

/// The classifier.
#[derive(Debug)]
pub struct Classifier {
    tok: nn::Embedding,
    pos: Tensor,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    head: nn::Linear,
    heads: i64,
    dropout: f64,
}

impl Classifier {
    /// The model's variables under `p`: `tok`, `pos`, `blocks/0..layers`, `ln_f`, `head`.
    ///
    /// # Panics
    ///
    /// When `d_model` is not a multiple of `heads` (the flags are checked before).
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> Self {
        assert_eq!(
            cfg.d_model % cfg.heads,
            0,
            "d_model must be a multiple of heads"
        );
        let emb = nn::EmbeddingConfig {
            padding_idx: PAD,
            ..Default::default()
        };
        let blocks = p / "blocks";
        Classifier {
            tok: nn::embedding(p / "tok", cfg.vocab_size, cfg.d_model, emb),
            pos: p.var(
                "pos",
                &[cfg.seq_len, cfg.d_model],
                nn::Init::Randn {
                    mean: 0.,
                    stdev: 0.02,
                },
            ),
            blocks: (0..cfg.layers)
                .map(|i| Block::new(&blocks / i, cfg))
                .collect(),
            ln_f: nn::layer_norm(p / "ln_f", vec![cfg.d_model], Default::default()),
            head: nn::linear(p / "head", cfg.d_model, cfg.n_classes, Default::default()),
            heads: cfg.heads,
            dropout: cfg.dropout,
        }
    }

    /// `ids: [batch, seq]` (int64, 0 = padding, at least one real token a row) → logits
    /// `[batch, classes]`.
    pub fn forward_t(&self, ids: &Tensor, train: bool, strategy: Strategy) -> Tensor {
        let (b, s) = ids.size2().expect("ids are [batch, seq]");
        let pad = ids.eq(PAD); // [batch, seq]
        // 0 for real keys, -inf for padding: [batch * heads, 1, seq].
        let key_bias = Tensor::zeros([b, 1, 1, s], (Kind::Float, ids.device()))
            .masked_fill(&pad.view([b, 1, 1, s]), f64::NEG_INFINITY)
            .expand([b, self.heads, 1, s], false)
            .reshape([b * self.heads, 1, s]);
        let xs = (ids.apply(&self.tok) + self.pos.narrow(0, 0, s)).dropout(self.dropout, train);
        let masked: Vec<MaskedBlock> = self
            .blocks
            .iter()
            .map(|block| MaskedBlock {
                block: block.shallow_clone(),
                key_bias: key_bias.shallow_clone(),
            })
            .collect();
        let xs = match strategy {
            Strategy::Plain => masked
                .iter()
                .fold(xs, |xs, block| block.forward_t(&xs, train)),
            Strategy::Checkpointed(segments) => {
                ckpt::checkpoint_sequential_t(&masked, segments, &xs, train)
            }
        };
        // Mean over the real tokens.
        let keep = pad.logical_not().to_kind(Kind::Float).unsqueeze(-1); // [batch, seq, 1]
        let count = keep.sum_dim_intlist(1, false, Kind::Float).clamp_min(1.0);
        let pooled = (xs.apply(&self.ln_f) * &keep).sum_dim_intlist(1, false, Kind::Float) / count;
        pooled.apply(&self.head)
    }
}
