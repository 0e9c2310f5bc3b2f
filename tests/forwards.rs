//! `#[checkpointed]` on the forwards tch code really has (issue 15), each written as tch's
//! own examples write it and checked against the same body without the attribute:
//!
//! - tch's MNIST conv net, one method chain, `segments = 3`;
//! - tch's llama `Block` checkpointed whole, called from the model's loop, against the
//!   `ckpt::cut!()` form and plain;
//! - a llama-style decoder (RMSNorm, attention with the rotary table passed to every
//!   block, 8 blocks), a CLIP-encoder-style stack with a causal mask argument and
//!   `let residual = xs;` skips, a ResNet-style loop over residual blocks with batch norm,
//!   a `fold` form and an `enumerate` form, each `segments = 4` on the unchanged forward;
//! - `segments = auto` and `budget` on a loop forward.
//!
//! Outputs and gradients equal the plain function's bit for bit; peak bytes (exact, from
//! `ckpt::memory`) are within 2 % of the same model cut the same way through `model!`, and
//! below plain. The ratios are printed (`cargo test --test forwards -- --nocapture`).
//! The tests share the process-wide CPU counter and the RNG, so they run one at a time.

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::plan::Schedule;
use ckpt::{ShallowClone, checkpointed};
use tch::nn::{self, Module, ModuleT};
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
        #[allow(dead_code)]
        fn $plain $($rest)*
    };
}

/// What one training step produced: the output, every parameter's gradient (name order),
/// and the step's peak bytes above the bytes live before it.
struct Step {
    output: Tensor,
    grads: Vec<Tensor>,
    peak: u64,
}

/// One step of `f` (seeded, so dropout draws the same masks): a fixed-weight loss on the
/// output, backward, and the peak. A first, unmeasured step allocates the parameter
/// gradients and the loss weights and keeps the output; the measured step is a training
/// loop's (`let loss = (f() * w).sum(); loss.backward();`: the output is consumed by the
/// loss), so every measured step starts from the same state and measures the forward,
/// the loss and the backward only.
fn step(vs: &nn::VarStore, f: &dyn Fn() -> Tensor) -> Step {
    let zero_grads = || {
        for v in vs.trainable_variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        tch::manual_seed(7);
    };
    zero_grads();
    let y = f();
    let w = (Tensor::arange(y.numel() as i64, (Kind::Float, Device::Cpu)) * 0.37)
        .sin()
        .reshape(y.size());
    (&y * &w).sum(Kind::Float).backward();
    let output = y.detach().copy();
    drop(y);
    zero_grads();
    let ((), report) = ckpt::memory::measure(Device::Cpu, || {
        let loss = (f() * &w).sum(Kind::Float);
        loss.backward();
    });
    let grads = common::params(vs)
        .iter()
        .filter(|p| p.requires_grad())
        .map(|p| p.grad().copy())
        .collect();
    Step {
        output,
        grads,
        peak: u64::try_from(report.peak_above_baseline_bytes).unwrap(),
    }
}

/// Outputs and every parameter gradient equal, bit for bit; each gradient is nonzero
/// (the step reached every parameter), unless `partial` (a part of the model ran).
fn assert_same(what: &str, plain: &Step, ckpt: &Step) {
    assert_equal(what, plain, ckpt, false);
}

fn assert_equal(what: &str, plain: &Step, ckpt: &Step, partial: bool) {
    assert!(plain.output.equal(&ckpt.output), "{what}: outputs differ");
    assert!(!plain.grads.is_empty());
    let mut reached = 0;
    for (i, (a, b)) in plain.grads.iter().zip(&ckpt.grads).enumerate() {
        let nonzero = a.abs().sum(Kind::Float).double_value(&[]) > 0.0;
        assert!(nonzero || partial, "{what}: gradient {i} is zero");
        reached += usize::from(nonzero);
        assert!(a.equal(b), "{what}: gradient {i} differs");
    }
    assert!(reached > 0, "{what}: every gradient is zero");
}

/// Prints the ratios and checks the function's peak against plain and against `model!`
/// cut the same way (within 2 %).
fn report_peaks(what: &str, plain: u64, function: u64, model: u64) {
    let r = |x: u64| x as f64 / plain as f64;
    println!(
        "{what}: plain {plain} B; #[checkpointed] {function} B ({:.3} of plain); model! cut the same way {model} B ({:.3}); function / model! = {:.4}",
        r(function),
        r(model),
        function as f64 / model as f64
    );
    assert!(function < plain, "{what}: checkpointing saves nothing");
    let diff = (function as f64 - model as f64).abs() / model as f64;
    assert!(
        diff <= 0.02,
        "{what}: #[checkpointed] {function} B vs model! {model} B"
    );
}

// ---------------------------------------------------------------------------------------
// tch's MNIST conv net: the forward is one method chain.

#[derive(Debug, ShallowClone)]
struct MnistNet {
    conv1: nn::Conv2D,
    conv2: nn::Conv2D,
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl MnistNet {
    fn new(vs: &nn::Path) -> MnistNet {
        MnistNet {
            conv1: nn::conv2d(vs / "conv1", 1, 32, 5, Default::default()),
            conv2: nn::conv2d(vs / "conv2", 32, 64, 5, Default::default()),
            fc1: nn::linear(vs / "fc1", 1024, 1024, Default::default()),
            fc2: nn::linear(vs / "fc2", 1024, 10, Default::default()),
        }
    }

    twins!([segments = 3] forward_ckpt forward_plain(&self, xs: &Tensor, train: bool) -> Tensor {
        xs.view([-1, 1, 28, 28])
            .apply(&self.conv1)
            .max_pool2d_default(2)
            .apply(&self.conv2)
            .max_pool2d_default(2)
            .view([-1, 1024])
            .apply(&self.fc1)
            .relu()
            .dropout(0.5, train)
            .apply(&self.fc2)
    });
}

#[test]
fn mnist_chain_in_three_segments() {
    let _serial = serial();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = MnistNet::new(&vs.root());
    let xs = Tensor::rand([128, 784], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &|| net.forward_plain(&xs, true));
    let ckpt = step(&vs, &|| net.forward_ckpt(&xs, true));
    assert_same("mnist", &plain, &ckpt);
    println!(
        "tch's MNIST conv net, batch 128, segments = 3 on the chain: plain {} B, checkpointed {} B ({:.3} of plain)",
        plain.peak,
        ckpt.peak,
        ckpt.peak as f64 / plain.peak as f64
    );
    // The peak of this net is inside the backward of its first convolution and pooling:
    // when the pooling's backward allocates the gradient of the convolution's output
    // (`[128, 32, 24, 24]` floats), that output, the pooling's int64 indices and the
    // gradient of the pooled output are alive. No cut between layers can lower that
    // moment (the recompute of the first segment rebuilds it), so the checkpointed peak is
    // the plain one plus the segments' bookkeeping.
    let b = 128;
    let moment = b * (32 * 24 * 24 * 4 * 2 + 32 * 12 * 12 * 8 + 32 * 12 * 12 * 4);
    assert!(plain.peak >= moment && plain.peak - moment < moment / 100);
    assert!(
        ckpt.peak <= plain.peak + 16 * 1024,
        "{} > {}",
        ckpt.peak,
        plain.peak
    );
}

// ---------------------------------------------------------------------------------------
// llama, as tch's example writes it (examples/llama/main.rs), sized down.

#[derive(Debug, Clone, Copy)]
struct LlamaConfig {
    vocab: i64,
    n_layer: usize,
    n_head: i64,
    n_embd: i64,
    seq: i64,
}

const LLAMA: LlamaConfig = LlamaConfig {
    vocab: 96,
    n_layer: 8,
    n_head: 4,
    n_embd: 64,
    seq: 64,
};

#[derive(Debug, ShallowClone)]
struct RmsNorm {
    scale: Tensor,
    size: i64,
}

impl RmsNorm {
    fn new(vs: nn::Path, size: i64) -> Self {
        let scale = vs.ones("scale", &[size]);
        Self { scale, size }
    }
}

impl Module for RmsNorm {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let norm_xs = (xs * xs).mean_dim(-1, true, Kind::Float);
        let xs_normed = xs * (norm_xs + 1e-5).rsqrt();
        let scale = self.scale.reshape([1, 1, self.size]);
        scale * xs_normed
    }
}

#[derive(Debug, ShallowClone)]
struct Mlp {
    c_fc1: nn::Linear,
    c_fc2: nn::Linear,
    c_proj: nn::Linear,
}

impl Mlp {
    fn new(vs: nn::Path, n_embd: i64) -> Self {
        let n_hidden = 8 * n_embd / 3;
        let c = nn::LinearConfig {
            bias: false,
            ..Default::default()
        };
        let c_fc1 = nn::linear(&vs / "c_fc1", n_embd, n_hidden, c);
        let c_fc2 = nn::linear(&vs / "c_fc2", n_embd, n_hidden, c);
        let c_proj = nn::linear(&vs / "c_proj", n_hidden, n_embd, c);
        Self {
            c_fc1,
            c_fc2,
            c_proj,
        }
    }
}

impl Module for Mlp {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let xs = xs.apply(&self.c_fc1).silu() * xs.apply(&self.c_fc2);
        xs.apply(&self.c_proj)
    }
}

#[derive(Debug, ShallowClone)]
struct CausalSelfAttention {
    c_attn: nn::Linear,
    c_proj: nn::Linear,
    n_head: i64,
    n_embd: i64,
    device: Device,
}

impl CausalSelfAttention {
    fn new(vs: nn::Path, n_head: i64, n_embd: i64) -> Self {
        let c = nn::LinearConfig {
            bias: false,
            ..Default::default()
        };
        let c_attn = nn::linear(&vs / "c_attn", n_embd, 3 * n_embd, c);
        let c_proj = nn::linear(&vs / "c_proj", n_embd, n_embd, c);
        Self {
            c_attn,
            c_proj,
            n_head,
            n_embd,
            device: vs.device(),
        }
    }

    fn apply_rotary_emb(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
        let mut dims = x.size();
        let v = dims.pop().unwrap();
        dims.push(v / 2);
        dims.push(2);
        let x = x.reshape(&dims);
        let re_x = x.slice(-1, 0, 1, 1);
        let im_x = x.slice(-1, 1, 2, 1);
        let re_f = freqs_cis.slice(-1, 0, 1, 1);
        let im_f = freqs_cis.slice(-1, 1, 2, 1);
        let re = &re_x * &re_f - &im_x * &im_f;
        let im = &re_x * &im_f + &im_x * &re_f;
        let rope = Tensor::cat(&[&re, &im], -1);
        let mut dims = rope.size();
        let v1 = dims.pop().unwrap();
        let v2 = dims.pop().unwrap();
        dims.push(v1 * v2);
        rope.reshape(&dims)
    }

    fn forward(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
        let (b, t, c) = x.size3().unwrap();
        let kind = x.kind();
        let qkv = self.c_attn.forward(x);
        let n_embd = self.n_embd;
        let q = qkv.slice(2, 0, n_embd, 1);
        let k = qkv.slice(2, n_embd, 2 * n_embd, 1);
        let v = qkv.slice(2, 2 * n_embd, 3 * n_embd, 1);
        let target_dim = [b, t, self.n_head, c / self.n_head];
        let k = k.reshape(target_dim).transpose(1, 2);
        let q = q.reshape(target_dim).transpose(1, 2);
        let v = v.reshape(target_dim).transpose(1, 2);
        let q = self.apply_rotary_emb(&q, freqs_cis);
        let k = self.apply_rotary_emb(&k, freqs_cis);
        let k_shape = k.size();
        let att: Tensor = q.matmul(&k.transpose(-2, -1)) / (*k_shape.last().unwrap() as f64).sqrt();
        let mask = Tensor::ones([t, t], (kind, self.device))
            .tril(0)
            .reshape([1, 1, t, t]);
        let att = att.masked_fill(&mask.eq(0.), f64::NEG_INFINITY);
        let y = att.softmax(-1, kind).matmul(&v);
        let y = y.transpose(1, 2).reshape([b, t, c]);
        self.c_proj.forward(&y)
    }
}

#[derive(Debug, ShallowClone)]
struct Block {
    rms_1: RmsNorm,
    attn: CausalSelfAttention,
    rms_2: RmsNorm,
    mlp: Mlp,
}

impl Block {
    fn new(vs: nn::Path, config: &LlamaConfig) -> Self {
        let rms_1 = RmsNorm::new(&vs / "rms_1", config.n_embd);
        let attn = CausalSelfAttention::new(&vs / "attn", config.n_head, config.n_embd);
        let rms_2 = RmsNorm::new(&vs / "rms_2", config.n_embd);
        let mlp = Mlp::new(&vs / "mlp", config.n_embd);
        Self {
            rms_1,
            attn,
            rms_2,
            mlp,
        }
    }

    /// tch's `Block::forward`, unchanged.
    fn forward(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
        let x = self.attn.forward(&self.rms_1.forward(x), freqs_cis) + x;
        self.mlp.forward(&self.rms_2.forward(&x)) + x
    }

    /// The same body, checkpointed whole.
    #[checkpointed]
    fn forward_whole(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
        let x = self.attn.forward(&self.rms_1.forward(x), freqs_cis) + x;
        self.mlp.forward(&self.rms_2.forward(&x)) + x
    }

    /// The form users had to write before: the attention checkpointed, the MLP inline.
    #[checkpointed]
    fn forward_cut(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
        let x = self.attn.forward(&self.rms_1.forward(x), freqs_cis) + x;
        ckpt::cut!();
        self.mlp.forward(&self.rms_2.forward(&x)) + x
    }
}

#[derive(Debug, ShallowClone)]
struct Llama {
    wte: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: RmsNorm,
    lm_head: nn::Linear,
}

impl Llama {
    fn new(vs: nn::Path, config: &LlamaConfig) -> Self {
        let c = nn::LinearConfig {
            bias: false,
            ..Default::default()
        };
        let lm_head = nn::linear(&vs / "lm_head", config.n_embd, config.vocab, c);
        let wte = nn::embedding(
            &vs / "transformer" / "wte",
            config.vocab,
            config.n_embd,
            Default::default(),
        );
        let blocks = (0..config.n_layer)
            .map(|i| Block::new(&vs / "transformer" / "h" / i, config))
            .collect::<Vec<_>>();
        let ln_f = RmsNorm::new(&vs / "transformer" / "ln_f", config.n_embd);
        Self {
            wte,
            blocks,
            ln_f,
            lm_head,
        }
    }

    // tch's `Llama::forward`, unchanged, under `segments = 4`.
    twins!([segments = 4] forward_ckpt forward(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
        let (_, t) = x.size2().unwrap();
        let mut x = self.wte.forward(x);
        for block in self.blocks.iter() {
            x = block.forward(&x, freqs_cis);
        }
        let x = self.ln_f.forward(&x);
        let x = x.slice(1, t - 1, t, 1);
        self.lm_head.forward(&x)
    });

    /// The loop calling the block checkpointed whole.
    fn forward_blocks_whole(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
        let (_, t) = x.size2().unwrap();
        let mut x = self.wte.forward(x);
        for block in self.blocks.iter() {
            x = block.forward_whole(&x, freqs_cis);
        }
        let x = self.ln_f.forward(&x);
        let x = x.slice(1, t - 1, t, 1);
        self.lm_head.forward(&x)
    }

    /// The loop calling the block in its `cut!()` form.
    fn forward_blocks_cut(&self, x: &Tensor, freqs_cis: &Tensor) -> Tensor {
        let (_, t) = x.size2().unwrap();
        let mut x = self.wte.forward(x);
        for block in self.blocks.iter() {
            x = block.forward_cut(&x, freqs_cis);
        }
        let x = self.ln_f.forward(&x);
        let x = x.slice(1, t - 1, t, 1);
        self.lm_head.forward(&x)
    }
}

/// tch's `precompute_freqs_cis`, for the sequence length of the test.
fn precompute_freqs_cis(config: &LlamaConfig) -> Tensor {
    let seq_len = config.seq;
    let n_elem = config.n_embd / config.n_head;
    let theta: Vec<_> = (0..n_elem)
        .step_by(2)
        .map(|i| 1f32 / 10000f32.powf(i as f32 / n_elem as f32))
        .collect();
    let arange: Vec<_> = (0..seq_len).map(|c| c as f32).collect();
    let theta = Tensor::from_slice(&theta);
    let arange = Tensor::from_slice(&arange);
    let idx_theta = arange.outer(&theta);
    let shape = [1, 1, seq_len, n_elem / 2, 1];
    let idx_theta_cos = idx_theta.cos().reshape(shape);
    let idx_theta_sin = idx_theta.sin().reshape(shape);
    Tensor::cat(&[&idx_theta_cos, &idx_theta_sin], -1)
}

ckpt::model! {
    /// The same llama through `model!`, the rotary table a field.
    #[checkpointed(segments = 4)]
    struct LlamaModel(p, c: &LlamaConfig) {
        #[field] freqs: Tensor = precompute_freqs_cis(c),
        wte: nn::Embedding = nn::embedding(&p / "transformer" / "wte", c.vocab, c.n_embd, Default::default()),
        blocks: [Block; c.n_layer] = Block::new(p, c) => |b, xs| b.forward(xs, &self.freqs),
        ln_f: RmsNorm = RmsNorm::new(p, c.n_embd),
        |xs| { let t = xs.size()[1]; xs.slice(1, t - 1, t, 1) },
        lm_head: nn::Linear = nn::linear(p, c.n_embd, c.vocab, nn::LinearConfig { bias: false, ..Default::default() }),
    }
}

fn llama_ids() -> Tensor {
    Tensor::randint_low(0, LLAMA.vocab, [8, LLAMA.seq], (Kind::Int64, Device::Cpu))
}

#[test]
fn llama_block_checkpointed_whole_from_the_models_loop() {
    let _serial = serial();
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let llama = Llama::new(vs.root(), &LLAMA);
    let freqs = precompute_freqs_cis(&LLAMA);
    let ids = llama_ids();
    let plain = step(&vs, &|| llama.forward(&ids, &freqs));
    let whole = step(&vs, &|| llama.forward_blocks_whole(&ids, &freqs));
    let cut = step(&vs, &|| llama.forward_blocks_cut(&ids, &freqs));
    assert_same("llama, blocks whole", &plain, &whole);
    assert_same("llama, blocks cut", &plain, &cut);
    println!(
        "llama (8 blocks, batch 8, seq {}): plain {} B; each block checkpointed whole {} B ({:.3} of plain); the cut!() form {} B ({:.3})",
        LLAMA.seq,
        plain.peak,
        whole.peak,
        whole.peak as f64 / plain.peak as f64,
        cut.peak,
        cut.peak as f64 / plain.peak as f64
    );
    assert!(whole.peak <= cut.peak, "{} > {}", whole.peak, cut.peak);
}

#[test]
fn llama_decoder_loop_in_four_segments() {
    let _serial = serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let llama = Llama::new(vs.root(), &LLAMA);
    let freqs = precompute_freqs_cis(&LLAMA);
    let ids = llama_ids();
    let plain = step(&vs, &|| llama.forward(&ids, &freqs));
    let ckpt = step(&vs, &|| llama.forward_ckpt(&ids, &freqs));
    assert_same("llama decoder", &plain, &ckpt);

    // The function's stages: `size2`, `wte`, 8 blocks, `ln_f`, the slice, `lm_head` (13);
    // `segments = 4` cuts them 3 | 3 | 3 | 4. `model!`'s chain has no `size2` stage, so the
    // same segments start one stage earlier there.
    let ranges = ckpt::sequential_segments(13, 4).unwrap();
    let cuts: Vec<usize> = ranges[1..].iter().map(|r| r.start - 1).collect();
    assert_eq!(cuts, [2, 5, 8]);
    let mvs = nn::VarStore::new(Device::Cpu);
    let mut model = LlamaModel::new(mvs.root(), &LLAMA);
    model.set_schedule(Schedule::Cuts(cuts)).unwrap();
    let via_model = step(&mvs, &|| model.forward(&ids));
    report_peaks(
        "llama decoder, 8 blocks, segments = 4",
        plain.peak,
        ckpt.peak,
        via_model.peak,
    );
}

// ---------------------------------------------------------------------------------------
// A CLIP text encoder as tch's stable-diffusion example writes it: skip connections as
// references (`let residual = xs;`), a causal mask passed to every layer.

#[derive(Debug, ShallowClone)]
struct ClipAttention {
    k_proj: nn::Linear,
    v_proj: nn::Linear,
    q_proj: nn::Linear,
    out_proj: nn::Linear,
    head_dim: i64,
    scale: f64,
    num_attention_heads: i64,
}

impl ClipAttention {
    fn new(vs: nn::Path, embed_dim: i64, heads: i64) -> Self {
        let c = Default::default();
        let head_dim = embed_dim / heads;
        ClipAttention {
            k_proj: nn::linear(&vs / "k_proj", embed_dim, embed_dim, c),
            v_proj: nn::linear(&vs / "v_proj", embed_dim, embed_dim, c),
            q_proj: nn::linear(&vs / "q_proj", embed_dim, embed_dim, c),
            out_proj: nn::linear(&vs / "out_proj", embed_dim, embed_dim, c),
            head_dim,
            scale: (head_dim as f64).powf(-0.5),
            num_attention_heads: heads,
        }
    }

    fn shape(&self, xs: &Tensor, seq_len: i64, bsz: i64) -> Tensor {
        xs.view([bsz, seq_len, self.num_attention_heads, self.head_dim])
            .transpose(1, 2)
            .contiguous()
    }

    fn forward(&self, xs: &Tensor, causal_attention_mask: &Tensor) -> Tensor {
        let (bsz, tgt_len, embed_dim) = xs.size3().unwrap();
        let query_states = xs.apply(&self.q_proj) * self.scale;
        let proj_shape = [bsz * self.num_attention_heads, -1, self.head_dim];
        let query_states = self.shape(&query_states, tgt_len, bsz).view(proj_shape);
        let key_states = self
            .shape(&xs.apply(&self.k_proj), -1, bsz)
            .view(proj_shape);
        let value_states = self
            .shape(&xs.apply(&self.v_proj), -1, bsz)
            .view(proj_shape);
        let attn_weights = query_states.bmm(&key_states.transpose(1, 2));
        let src_len = key_states.size()[1];
        let attn_weights = attn_weights.view([bsz, self.num_attention_heads, tgt_len, src_len])
            + causal_attention_mask;
        let attn_weights = attn_weights.view([bsz * self.num_attention_heads, tgt_len, src_len]);
        let attn_weights = attn_weights.softmax(-1, Kind::Float);
        let attn_output = attn_weights.bmm(&value_states);
        attn_output
            .view([bsz, self.num_attention_heads, tgt_len, self.head_dim])
            .transpose(1, 2)
            .reshape([bsz, tgt_len, embed_dim])
            .apply(&self.out_proj)
    }
}

#[derive(Debug, ShallowClone)]
struct ClipMlp {
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl ClipMlp {
    fn new(vs: nn::Path, embed_dim: i64, hidden: i64) -> Self {
        ClipMlp {
            fc1: nn::linear(&vs / "fc1", embed_dim, hidden, Default::default()),
            fc2: nn::linear(&vs / "fc2", hidden, embed_dim, Default::default()),
        }
    }
}

impl Module for ClipMlp {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let xs = self.fc1.forward(xs);
        let xs = &xs * (&xs * 1.702).sigmoid(); // quick GELU
        self.fc2.forward(&xs)
    }
}

#[derive(Debug, ShallowClone)]
struct ClipEncoderLayer {
    self_attn: ClipAttention,
    layer_norm1: nn::LayerNorm,
    mlp: ClipMlp,
    layer_norm2: nn::LayerNorm,
}

impl ClipEncoderLayer {
    fn new(vs: nn::Path, embed_dim: i64, heads: i64) -> Self {
        ClipEncoderLayer {
            self_attn: ClipAttention::new(&vs / "self_attn", embed_dim, heads),
            layer_norm1: nn::layer_norm(&vs / "layer_norm1", vec![embed_dim], Default::default()),
            mlp: ClipMlp::new(&vs / "mlp", embed_dim, 4 * embed_dim),
            layer_norm2: nn::layer_norm(&vs / "layer_norm2", vec![embed_dim], Default::default()),
        }
    }

    /// tch's `ClipEncoderLayer::forward`, unchanged.
    fn forward(&self, xs: &Tensor, causal_attention_mask: &Tensor) -> Tensor {
        let residual = xs;
        let xs = self.layer_norm1.forward(xs);
        let xs = self.self_attn.forward(&xs, causal_attention_mask);
        let xs = xs + residual;

        let residual = &xs;
        let xs = self.layer_norm2.forward(&xs);
        let xs = self.mlp.forward(&xs);
        xs + residual
    }

    /// The same layer body cut into 4 segments: the references cross the cuts.
    #[checkpointed(segments = 4)]
    fn forward_ckpt(&self, xs: &Tensor, causal_attention_mask: &Tensor) -> Tensor {
        let residual = xs;
        let xs = self.layer_norm1.forward(xs);
        let xs = self.self_attn.forward(&xs, causal_attention_mask);
        let xs = xs + residual;

        let residual = &xs;
        let xs = self.layer_norm2.forward(&xs);
        let xs = self.mlp.forward(&xs);
        xs + residual
    }
}

#[derive(Debug, ShallowClone)]
struct ClipEncoder {
    layers: Vec<ClipEncoderLayer>,
}

impl ClipEncoder {
    twins!([segments = 4] forward_ckpt forward(&self, xs: &Tensor, causal_attention_mask: &Tensor) -> Tensor {
        let mut xs = xs.shallow_clone();
        for layer in self.layers.iter() {
            xs = layer.forward(&xs, causal_attention_mask)
        }
        xs
    });
}

/// tch's `build_causal_attention_mask`.
fn build_causal_attention_mask(bsz: i64, seq_len: i64) -> Tensor {
    let mut mask = Tensor::ones([bsz, seq_len, seq_len], (Kind::Float, Device::Cpu));
    let _ = mask.fill_(f32::MIN as f64).triu_(1).unsqueeze_(1);
    mask
}

const CLIP_LAYERS: usize = 8;

ckpt::model! {
    /// The same encoder through `model!`, the mask a field.
    #[checkpointed(segments = 4)]
    struct ClipModel(p, layers: usize, embed: i64, heads: i64, mask: &Tensor) {
        #[field] mask: Tensor = mask.shallow_clone(),
        layers: [ClipEncoderLayer; layers] = ClipEncoderLayer::new(p, embed, heads)
            => |l, xs| l.forward(xs, &self.mask),
    }
}

#[test]
fn clip_encoder_loop_with_a_causal_mask_in_four_segments() {
    let _serial = serial();
    tch::manual_seed(4);
    let (bsz, seq, embed) = (4, 48, 64);
    let vs = nn::VarStore::new(Device::Cpu);
    let encoder = ClipEncoder {
        layers: (0..CLIP_LAYERS)
            .map(|i| ClipEncoderLayer::new(vs.root() / "layers" / i, embed, 4))
            .collect(),
    };
    let mask = build_causal_attention_mask(bsz, seq);
    let xs = Tensor::randn([bsz, seq, embed], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &|| encoder.forward(&xs, &mask));
    let ckpt = step(&vs, &|| encoder.forward_ckpt(&xs, &mask));
    assert_same("clip encoder", &plain, &ckpt);
    // The layer's own body, with `let residual = xs;` and `let residual = &xs;` crossing
    // its cuts.
    let layer = &encoder.layers[0];
    let one = step(&vs, &|| layer.forward(&xs, &mask));
    let one_ckpt = step(&vs, &|| layer.forward_ckpt(&xs, &mask));
    assert_equal("clip layer", &one, &one_ckpt, true);

    // Stages: `let mut xs`, 8 layers, the tail `xs` (10): 2 | 2 | 2 | 4.
    let ranges = ckpt::sequential_segments(10, 4).unwrap();
    let cuts: Vec<usize> = ranges[1..].iter().map(|r| r.start - 1).collect();
    assert_eq!(cuts, [1, 3, 5]);
    let mvs = nn::VarStore::new(Device::Cpu);
    let mut model = ClipModel::new(mvs.root(), CLIP_LAYERS, embed, 4, &mask);
    model.set_schedule(Schedule::Cuts(cuts)).unwrap();
    let via_model = step(&mvs, &|| model.forward(&xs));
    report_peaks(
        "CLIP encoder, 8 layers, segments = 4",
        plain.peak,
        ckpt.peak,
        via_model.peak,
    );
}

// ---------------------------------------------------------------------------------------
// A ResNet-style loop over residual blocks with batch norm (train mode).

#[derive(Debug, ShallowClone)]
struct BasicBlock {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    conv2: nn::Conv2D,
    bn2: nn::BatchNorm,
}

impl BasicBlock {
    fn new(p: nn::Path, c: i64) -> Self {
        let conv = nn::ConvConfig {
            padding: 1,
            bias: false,
            ..Default::default()
        };
        BasicBlock {
            conv1: nn::conv2d(&p / "conv1", c, c, 3, conv),
            bn1: nn::batch_norm2d(&p / "bn1", c, Default::default()),
            conv2: nn::conv2d(&p / "conv2", c, c, 3, conv),
            bn2: nn::batch_norm2d(&p / "bn2", c, Default::default()),
        }
    }
}

impl ModuleT for BasicBlock {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let ys = xs
            .apply(&self.conv1)
            .apply_t(&self.bn1, train)
            .relu()
            .apply(&self.conv2)
            .apply_t(&self.bn2, train);
        (xs + ys).relu()
    }
}

#[derive(Debug, ShallowClone)]
struct ResNet {
    stem: nn::Conv2D,
    blocks: Vec<BasicBlock>,
    fc: nn::Linear,
}

impl ResNet {
    twins!([segments = 4] forward_ckpt forward(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut xs = xs.apply(&self.stem).relu();
        for block in self.blocks.iter() {
            xs = block.forward_t(&xs, train);
        }
        xs.adaptive_avg_pool2d([1, 1]).flat_view().apply(&self.fc)
    });
}

ckpt::model! {
    #[checkpointed(segments = 4)]
    struct ResNetModel(p, c: i64, n: usize) {
        stem: nn::Conv2D = nn::conv2d(p, 3, c, 3, nn::ConvConfig { padding: 1, ..Default::default() }),
        relu,
        #[train] blocks: [BasicBlock; n] = BasicBlock::new(p, c),
        |xs| xs.adaptive_avg_pool2d([1, 1]).flat_view(),
        fc: nn::Linear = nn::linear(p, c, 10, Default::default()),
    }
}

#[test]
fn resnet_style_loop_over_residual_blocks_in_four_segments() {
    let _serial = serial();
    tch::manual_seed(5);
    let (c, n) = (16, 8);
    let vs = nn::VarStore::new(Device::Cpu);
    let p = vs.root();
    let net = ResNet {
        stem: nn::conv2d(
            &p / "stem",
            3,
            c,
            3,
            nn::ConvConfig {
                padding: 1,
                ..Default::default()
            },
        ),
        blocks: (0..n)
            .map(|i| BasicBlock::new(&p / "blocks" / i, c))
            .collect(),
        fc: nn::linear(&p / "fc", c, 10, Default::default()),
    };
    let xs = Tensor::randn([16, 3, 16, 16], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &|| net.forward(&xs, true));
    let ckpt = step(&vs, &|| net.forward_ckpt(&xs, true));
    assert_same("resnet", &plain, &ckpt);

    // Stages: the stem chain (`apply` then `relu`: one layer call, one stage), 8 blocks,
    // the tail chain (one layer call, `fc`): 10, cut 2 | 2 | 2 | 4. `model!` counts the
    // stem and its `relu` as two stages, and the pooling and `fc` as two.
    let ranges = ckpt::sequential_segments(10, 4).unwrap();
    let cuts: Vec<usize> = ranges[1..].iter().map(|r| r.start + 1).collect();
    assert_eq!(cuts, [3, 5, 7]);
    let mvs = nn::VarStore::new(Device::Cpu);
    let mut model = ResNetModel::new(mvs.root(), c, n);
    model.set_schedule(Schedule::Cuts(cuts)).unwrap();
    let via_model = step(&mvs, &|| model.forward_t(&xs, true));
    report_peaks(
        "ResNet-style loop, 8 blocks, segments = 4",
        plain.peak,
        ckpt.peak,
        via_model.peak,
    );
}

// ---------------------------------------------------------------------------------------
// The `fold` and `enumerate` forms over a residual MLP stack.

#[derive(Debug, ShallowClone)]
struct Residual {
    lin: nn::Linear,
}

impl Module for Residual {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + xs.apply(&self.lin).gelu("none")
    }
}

#[derive(Debug, ShallowClone)]
struct Stack {
    embed: nn::Linear,
    blocks: Vec<Residual>,
    head: nn::Linear,
}

impl Stack {
    fn new(p: nn::Path, width: i64, n: usize) -> Self {
        Stack {
            embed: nn::linear(&p / "embed", width, width, Default::default()),
            blocks: (0..n)
                .map(|i| Residual {
                    lin: nn::linear(&p / "blocks" / i, width, width, Default::default()),
                })
                .collect(),
            head: nn::linear(&p / "head", width, width, Default::default()),
        }
    }

    twins!([segments = 4] fold_ckpt fold(&self, xs: &Tensor) -> Tensor {
        let h = self.embed.forward(xs);
        let h = self.blocks.iter().fold(h, |h, b| b.forward(&h));
        self.head.forward(&h)
    });

    twins!([segments = 4] enumerate_ckpt enumerate(&self, xs: &Tensor) -> Tensor {
        let mut h = self.embed.forward(xs);
        for (i, b) in self.blocks.iter().enumerate() {
            h = b.forward(&h) * (1.0 + 0.01 * i as f64);
        }
        self.head.forward(&h)
    });

    #[checkpointed(segments = auto)]
    fn auto(&self, xs: &Tensor) -> Tensor {
        let mut h = self.embed.forward(xs);
        for b in self.blocks.iter() {
            h = b.forward(&h);
        }
        self.head.forward(&h)
    }

    #[checkpointed(budget = "40%")]
    fn budget40(&self, xs: &Tensor) -> Tensor {
        let mut h = self.embed.forward(xs);
        for b in self.blocks.iter() {
            h = b.forward(&h);
        }
        self.head.forward(&h)
    }

    fn looped(&self, xs: &Tensor) -> Tensor {
        let mut h = self.embed.forward(xs);
        for b in self.blocks.iter() {
            h = b.forward(&h);
        }
        self.head.forward(&h)
    }
}

ckpt::model! {
    #[checkpointed(segments = 4)]
    struct StackModel(p, width: i64, n: usize) {
        embed: nn::Linear = nn::linear(p, width, width, Default::default()),
        blocks: [Residual; n] = Residual { lin: nn::linear(p, width, width, Default::default()) },
        head: nn::Linear = nn::linear(p, width, width, Default::default()),
    }
}

const STACK_WIDTH: i64 = 128;
const STACK_BLOCKS: usize = 12;

#[test]
fn fold_and_enumerate_forms_in_four_segments() {
    let _serial = serial();
    tch::manual_seed(6);
    let vs = nn::VarStore::new(Device::Cpu);
    let stack = Stack::new(vs.root(), STACK_WIDTH, STACK_BLOCKS);
    let xs = Tensor::randn([512, STACK_WIDTH], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &|| stack.fold(&xs));
    let ckpt = step(&vs, &|| stack.fold_ckpt(&xs));
    assert_same("fold", &plain, &ckpt);
    let plain_enum = step(&vs, &|| stack.enumerate(&xs));
    let ckpt_enum = step(&vs, &|| stack.enumerate_ckpt(&xs));
    assert_same("enumerate", &plain_enum, &ckpt_enum);

    // Stages: `embed`, 12 blocks, `head` (14; the fold's `let` is its iterations): cut
    // 3 | 3 | 3 | 5, as `model!` cuts the same 14 stages.
    let mvs = nn::VarStore::new(Device::Cpu);
    let model = StackModel::new(mvs.root(), STACK_WIDTH, STACK_BLOCKS);
    assert_eq!(model.stage_names().len(), 14);
    let via_model = step(&mvs, &|| model.forward(&xs));
    report_peaks(
        "fold form, 12 blocks, segments = 4",
        plain.peak,
        ckpt.peak,
        via_model.peak,
    );
    report_peaks(
        "enumerate form, 12 blocks, segments = 4",
        plain_enum.peak,
        ckpt_enum.peak,
        via_model.peak,
    );
}

#[test]
fn auto_and_budget_on_a_loop_forward() {
    let _serial = serial();
    tch::manual_seed(8);
    let vs = nn::VarStore::new(Device::Cpu);
    let stack = Stack::new(vs.root(), STACK_WIDTH, STACK_BLOCKS);
    let xs = Tensor::randn([1024, STACK_WIDTH], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &|| stack.looped(&xs));
    // The same chain through `model!`, for comparison.
    {
        let mvs = nn::VarStore::new(Device::Cpu);
        let mut model = StackModel::new(mvs.root(), STACK_WIDTH, STACK_BLOCKS);
        model.set_auto().unwrap();
        let mut plan = model.plan_for(&xs).unwrap();
        let m = step(&mvs, &|| model.forward(&xs));
        plan.set_measured_peak_bytes(m.peak);
        println!("model!, auto:\n{plan}\n");
    }
    for (name, f) in [
        ("Stack::auto", Stack::auto as fn(&Stack, &Tensor) -> Tensor),
        ("Stack::budget40", Stack::budget40),
    ] {
        // `step` runs twice: the first call profiles (every iteration a stage) and plans.
        let ckpt = step(&vs, &|| f(&stack, &xs));
        assert_same(name, &plain, &ckpt);
        let plans = ckpt::plan::function_plans();
        let mut plan = plans
            .iter()
            .find(|p| p.function.starts_with(&format!("{name} (")))
            .unwrap_or_else(|| panic!("no plan for {name}: {plans:#?}"))
            .plan
            .clone();
        plan.set_measured_peak_bytes(ckpt.peak);
        println!("{name}, plain {} B:\n{}\n", plain.peak, plan.explain());
        // Each stage is named after its statement, a loop's with its iteration.
        assert_eq!(plan.stage_names()[0], "let mut h = self.embed.forward(xs)");
        assert_eq!(plan.stage_names()[3], "for b in self.blocks.iter() [2]");
        assert_eq!(plan.stage_names()[13], "self.head.forward(&h)");
        assert_eq!(
            plan.len(),
            2 + STACK_BLOCKS,
            "`embed`, one stage per block, and the last statement (`head`)"
        );
        let predicted = plan.predicted_peak_bytes();
        let error = (ckpt.peak as f64 - predicted as f64).abs() / predicted as f64;
        assert!(
            error <= 0.10,
            "{name}: measured {} vs predicted {predicted}",
            ckpt.peak
        );
        if let Some(budget) = plan.budget_bytes() {
            assert!(ckpt.peak <= budget, "{name}: {} over {budget}", ckpt.peak);
        }
        assert!(ckpt.peak < plain.peak);
    }
    assert_eq!(ckpt::live_segments(), 0);
}
