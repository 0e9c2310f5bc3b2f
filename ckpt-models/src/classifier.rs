//! The main program's model (`examples/train_classifier`, also benchmarked in `bench/`): a
//! pre-LN transformer encoder classifier, declared with [`ckpt::model!`] and checkpointed
//! over its blocks.
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
//! The classifier is declared with [`ckpt::model!`]: eleven stages (embedding, dropout,
//! the blocks one by one, final norm, pooling, head), two per-call values (the key
//! padding bias and the pooling mask) that every checkpointed segment receives in its
//! stash, and a schedule that [`Strategy`] sets at run time: `--segments N` cuts the
//! *blocks* as PyTorch's `checkpoint_sequential(blocks, N)` would (6 blocks, N = 3: two
//! blocks a segment), the embedding joining the first segment and the norm, pooling and
//! head the last, plain one; `--segments auto` lets `ckpt`'s planner choose the cuts.

use ckpt::plan::{Objective, Schedule};
use tch::nn;
use tch::{Kind, Tensor};

/// Id of the padding token, as in the data sets.
pub const PAD: i64 = crate::data::PAD;

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
#[derive(Debug, ckpt::ShallowClone)]
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

/// `0` for real keys, `-inf` for padding, `[batch * heads, 1, seq]`, from `ids: [batch,
/// seq]`: the additive attention bias of every block.
pub fn key_bias(ids: &Tensor, heads: i64) -> Tensor {
    let (b, s) = ids.size2().expect("ids are [batch, seq]");
    Tensor::zeros([b, 1, 1, s], (Kind::Float, ids.device()))
        .masked_fill(&ids.eq(PAD).view([b, 1, 1, s]), f64::NEG_INFINITY)
        .expand([b, heads, 1, s], false)
        .reshape([b * heads, 1, s])
}

ckpt::model! {
    /// Token ids `[batch, seq]` (int64, 0 = padding, at least one real token a row) →
    /// logits `[batch, classes]`. Variables: `tok`, `pos`, `blocks/0..layers`, `ln_f`,
    /// `head`.
    #[checkpointed(segments = 1)] // set at run time by `Strategy::apply`
    pub struct Classifier(p, cfg: &ModelConfig) {
        let key_bias: Tensor = key_bias(xs, self.heads),
        let keep: Tensor = xs.ne(PAD).to_kind(Kind::Float).unsqueeze(-1),
        #[field] heads: i64 = cfg.heads,
        #[field] pos: Tensor = p.var("pos", &[cfg.seq_len, cfg.d_model], nn::Init::Randn { mean: 0., stdev: 0.02 }),
        tok: nn::Embedding = nn::embedding(p, cfg.vocab_size, cfg.d_model, nn::EmbeddingConfig { padding_idx: PAD, ..Default::default() })
            => |tok, ids| ids.apply(tok) + self.pos.narrow(0, 0, ids.size()[1]),
        dropout(cfg.dropout),
        blocks: [Block; cfg.layers] = Block::new(p, cfg) => |b, xs, train| b.forward(xs, &key_bias, train),
        ln_f: nn::LayerNorm = nn::layer_norm(p, vec![cfg.d_model], Default::default()),
        // Mean over the real tokens.
        |xs| (xs * &keep).sum_dim_intlist(1, false, Kind::Float) / keep.sum_dim_intlist(1, false, Kind::Float).clamp_min(1.0),
        head: nn::Linear = nn::linear(p, cfg.d_model, cfg.n_classes, Default::default()),
    }
}

/// Stages of [`Classifier`] before its first block (embedding, dropout).
const STAGES_BEFORE_BLOCKS: usize = 2;

/// How the blocks are run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Strategy {
    /// One after the other, every activation kept for backward (nothing checkpointed).
    Plain,
    /// The blocks cut into this many segments as `checkpoint_sequential(blocks, N)` cuts
    /// them (the last one is not checkpointed; 1 checkpoints nothing).
    Checkpointed(usize),
    /// The cuts `ckpt`'s planner chooses (`segments = auto`) for `Objective::MinPeak`
    /// (the least peak memory) or `Objective::Budget` (the least recompute time within
    /// the budget), from a profile of the model's stages on the first training batch;
    /// without a policy set on the model, also each checkpointed segment's policy.
    Auto(Objective),
}

impl Strategy {
    /// The segment count of the runs table and JSON (0 for plain and auto).
    pub fn segments(self) -> usize {
        match self {
            Strategy::Checkpointed(n) => n,
            Strategy::Plain | Strategy::Auto(_) => 0,
        }
    }

    /// Sets `model`'s schedule. For `Checkpointed(n)` the cuts are the block boundaries
    /// of `ckpt::sequential_segments(layers, n)`, shifted past the stages before the
    /// blocks.
    ///
    /// # Errors
    ///
    /// `n = 0` ([`ckpt::CkptError::InvalidArgument`]).
    pub fn apply(self, model: &mut Classifier, layers: usize) -> Result<(), ckpt::CkptError> {
        match self {
            Strategy::Plain => model.set_segments(1),
            Strategy::Auto(objective) => model.set_schedule(Schedule::Auto(objective)),
            Strategy::Checkpointed(n) => {
                let ranges = ckpt::sequential_segments(layers, n)?;
                let cuts = ranges[1..]
                    .iter()
                    .map(|r| STAGES_BEFORE_BLOCKS + r.start)
                    .collect();
                model.set_schedule(Schedule::Cuts(cuts))
            }
        }
    }
}
