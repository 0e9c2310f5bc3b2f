//! Behaviour of `model!` through the `ckpt` facade: a `model!` model computes exactly
//! what the equivalent hand-written tch model computes — outputs and gradients (of every
//! parameter and of the input) equal bit for bit on CPU, without checkpointing and with
//! every `segments` count from 1 to the length of the chain (dividing or not), with
//! dropout in training mode under the same seed — and it saves and loads the same weight
//! files in both directions. A checkpointed training step needs less peak memory.
//!
//! Models: a residual stack (`Module`), the transformer encoder of `ckpt-models/src/encoder.rs`
//! (`ModuleT`, per-call values, a `#[field]`, apply closures), a model with every stage
//! form, and a generic model with a const-generic count.
//!
//! The tests share the global RNG (weights, dropout) and the process-wide memory
//! counters, so each holds `serial()` throughout.

use std::fmt::Debug;
use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::{ShallowClone, model};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

use ckpt_models::encoder;

use encoder::{Block, Config};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------
// Running and comparing.

/// What one forward + backward produced.
struct Run {
    output: Tensor,
    grads: Vec<(String, Tensor)>,
    input_grad: Option<Tensor>,
}

fn zero_grad(t: &Tensor) {
    let mut g = t.grad();
    if g.defined() {
        let _ = g.zero_();
    }
}

/// Seeds the RNG, runs `f` on `x` (a fresh leaf requiring grad when `x` is float),
/// backpropagates `<output, w>` for fixed non-random weights `w`, and collects the output
/// and the gradients of every trainable variable (by name) and of the input.
fn run(vs: &nn::VarStore, x: &Tensor, seed: i64, f: impl FnOnce(&Tensor) -> Tensor) -> Run {
    for v in vs.trainable_variables() {
        zero_grad(&v);
    }
    let float = x.kind() == Kind::Float;
    let x = if float {
        x.detach().set_requires_grad(true)
    } else {
        x.shallow_clone()
    };
    tch::manual_seed(seed);
    let y = f(&x);
    let w = (Tensor::arange(y.numel() as i64, (Kind::Float, Device::Cpu)) + 1.0)
        .sin()
        .reshape(y.size());
    (&y * w).sum(Kind::Float).backward();
    let mut vars: Vec<(String, Tensor)> = vs.trainable_variables_named();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    Run {
        output: y.detach().copy(),
        grads: vars
            .into_iter()
            .map(|(n, v)| (n, v.grad().copy()))
            .collect(),
        input_grad: float.then(|| x.grad().copy()),
    }
}

/// `VarStore::trainable_variables` with names.
trait Named {
    fn trainable_variables_named(&self) -> Vec<(String, Tensor)>;
}

impl Named for nn::VarStore {
    fn trainable_variables_named(&self) -> Vec<(String, Tensor)> {
        self.variables()
            .into_iter()
            .filter(|(_, v)| v.requires_grad())
            .collect()
    }
}

fn assert_bitwise_equal(what: &str, reference: &Run, other: &Run) {
    assert!(
        reference.output.equal(&other.output),
        "{what}: outputs differ (max abs diff {})",
        max_abs_diff(&reference.output, &other.output)
    );
    assert!(!reference.grads.is_empty());
    let names = |r: &Run| r.grads.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(reference), names(other), "{what}: variables differ");
    for ((name, a), (_, b)) in reference.grads.iter().zip(&other.grads) {
        assert!(
            a.defined() && b.defined(),
            "{what}: gradient of `{name}` missing"
        );
        assert!(
            a.abs().sum(Kind::Float).double_value(&[]) > 0.0,
            "{what}: `{name}` has a zero gradient"
        );
        assert!(
            a.equal(b),
            "{what}: gradient of `{name}` differs (max abs diff {})",
            max_abs_diff(a, b)
        );
    }
    match (&reference.input_grad, &other.input_grad) {
        (Some(a), Some(b)) => assert!(a.equal(b), "{what}: gradient of the input differs"),
        (None, None) => {}
        _ => panic!("{what}: only one run has an input gradient"),
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// Variable names of a store, sorted.
fn names(vs: &nn::VarStore) -> Vec<String> {
    let mut n: Vec<String> = vs.variables().into_keys().collect();
    n.sort();
    n
}

/// How many checkpointed segments one forward of `f` leaves in the autograd graph.
fn segments_created(f: impl FnOnce() -> Tensor) -> i64 {
    let before = ckpt::live_segments();
    let y = f();
    let created = ckpt::live_segments() - before;
    drop(y);
    assert_eq!(
        ckpt::live_segments(),
        before,
        "segments outlive their graph"
    );
    created
}

// ---------------------------------------------------------------------------------------
// A residual stack: `Module`, repeated blocks with a count known at run time.

#[derive(Debug, Clone, Copy)]
struct StackConfig {
    d_in: i64,
    d: i64,
    d_out: i64,
    layers: usize,
}

/// `x + relu(linear(x))`.
#[derive(Debug, ShallowClone)]
struct Residual {
    lin: nn::Linear,
}

impl Residual {
    fn new(p: nn::Path, d: i64) -> Self {
        Residual {
            lin: nn::linear(p, d, d, Default::default()),
        }
    }
}

impl Module for Residual {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + xs.apply(&self.lin).relu()
    }
}

/// The stack, one `model!` per `segments` value (and one without `#[checkpointed]`).
macro_rules! stacks {
    ($($name:ident $(= $n:literal)?),* $(,)?) => {$(
        model! {
            /// A residual stack.
            $(#[checkpointed(segments = $n)])?
            struct $name(p, c: &StackConfig) {
                inp: nn::Linear = nn::linear(p, c.d_in, c.d, Default::default()),
                gelu,
                blocks: [Residual; c.layers] = Residual::new(p, c.d),
                tanh,
                out: nn::Linear = nn::linear(p, c.d, c.d_out, Default::default()),
            }
        }
    )*};
}

stacks!(
    Stack,
    Stack1 = 1,
    Stack2 = 2,
    Stack3 = 3,
    Stack4 = 4,
    Stack5 = 5,
    Stack6 = 6,
    Stack7 = 7,
    Stack8 = 8,
    Stack9 = 9,
    Stack12 = 12,
);

/// The same model, written by hand as tch users do.
#[derive(Debug)]
struct HandStack {
    inp: nn::Linear,
    blocks: Vec<Residual>,
    out: nn::Linear,
}

impl HandStack {
    fn new(p: &nn::Path, c: &StackConfig) -> Self {
        HandStack {
            inp: nn::linear(p / "inp", c.d_in, c.d, Default::default()),
            blocks: (0..c.layers)
                .map(|i| Residual::new(p / "blocks" / i, c.d))
                .collect(),
            out: nn::linear(p / "out", c.d, c.d_out, Default::default()),
        }
    }
}

impl Module for HandStack {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let h = xs.apply(&self.inp).gelu("none");
        let h = self.blocks.iter().fold(h, |h, b| b.forward(&h));
        h.tanh().apply(&self.out)
    }
}

const STACK: StackConfig = StackConfig {
    d_in: 6,
    d: 16,
    d_out: 3,
    layers: 5,
};

/// A `model!` model of type `M` in a fresh store, its weights copied from `reference`.
fn copy_of<M>(reference: &nn::VarStore, build: impl FnOnce(nn::Path) -> M) -> (nn::VarStore, M) {
    let mut vs = nn::VarStore::new(Device::Cpu);
    let m = build(vs.root());
    assert_eq!(names(&vs), names(reference), "variable names differ");
    vs.copy(reference).expect("same variables");
    (vs, m)
}

#[test]
fn stack_matches_hand_written_for_every_segment_count() {
    let _guard = serial();
    tch::manual_seed(1);
    let ref_vs = nn::VarStore::new(Device::Cpu);
    let hand = HandStack::new(&ref_vs.root(), &STACK);
    let x = Tensor::randn([4, STACK.d_in], (Kind::Float, Device::Cpu));
    let reference = run(&ref_vs, &x, 7, |x| hand.forward(x));
    assert_eq!(reference.grads.len(), 2 * (STACK.layers + 2));

    // 9 stages: inp, gelu, blocks[0..5], tanh, out.
    macro_rules! check {
        ($($ty:ident => $n:expr),* $(,)?) => {$(
            let (vs, m) = copy_of(&ref_vs, |p| $ty::new(p, &STACK));
            let created = segments_created(|| m.forward(&x));
            assert_eq!(created, $n, "{}: checkpointed segments", stringify!($ty));
            let got = run(&vs, &x, 7, |x| m.forward(x));
            assert_bitwise_equal(stringify!($ty), &reference, &got);
        )*};
    }
    // `segments = N` cuts 9 stages into min(N, 9) groups; all but the last checkpointed.
    check!(
        Stack => 0,
        Stack1 => 0,
        Stack2 => 1,
        Stack3 => 2,
        Stack4 => 3,
        Stack5 => 4,
        Stack6 => 5,
        Stack7 => 6,
        Stack8 => 7,
        Stack9 => 8,
        Stack12 => 8,
    );
}

#[test]
fn stack_saves_and_loads_the_hand_written_weight_files() {
    let _guard = serial();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let x = Tensor::randn([3, STACK.d_in], (Kind::Float, Device::Cpu));

    // model! → file → hand-written.
    tch::manual_seed(11);
    let vs_model = nn::VarStore::new(Device::Cpu);
    let m = Stack3::new(vs_model.root(), &STACK);
    tch::manual_seed(12);
    let mut vs_hand = nn::VarStore::new(Device::Cpu);
    let hand = HandStack::new(&vs_hand.root(), &STACK);
    assert_eq!(names(&vs_model), names(&vs_hand));
    assert!(!m.forward(&x).equal(&hand.forward(&x)), "different seeds");
    let file = dir.path().join("model.safetensors");
    vs_model.save(&file).expect("save");
    vs_hand
        .load(&file)
        .expect("the hand-written model loads the model!'s file");
    assert!(m.forward(&x).equal(&hand.forward(&x)));

    // hand-written → file → model!.
    tch::manual_seed(13);
    let vs_hand = nn::VarStore::new(Device::Cpu);
    let hand = HandStack::new(&vs_hand.root(), &STACK);
    let mut vs_model = nn::VarStore::new(Device::Cpu);
    let m = Stack::new(vs_model.root(), &STACK);
    let file = dir.path().join("hand.ot");
    vs_hand.save(&file).expect("save");
    vs_model
        .load(&file)
        .expect("the model! loads the hand-written file");
    assert!(m.forward(&x).equal(&hand.forward(&x)));
}

#[test]
fn generated_impls() {
    let _guard = serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Stack2::new(vs.root() / "stack", &STACK);
    assert_eq!(
        names(&vs)[..4],
        [
            "stack.blocks.0.bias",
            "stack.blocks.0.weight",
            "stack.blocks.1.bias",
            "stack.blocks.1.weight"
        ]
    );
    // Debug shows the fields.
    let debug = format!("{m:?}");
    for field in ["Stack2 {", "inp:", "blocks: [Residual", "out:"] {
        assert!(debug.contains(field), "{debug}");
    }
    // ShallowClone shares the parameters: gradients through the clone land in `vs`.
    let clone = m.shallow_clone();
    let x = Tensor::randn([2, STACK.d_in], (Kind::Float, Device::Cpu));
    clone.forward(&x).sum(Kind::Float).backward();
    for (name, v) in vs.variables() {
        assert!(
            v.grad().defined(),
            "no gradient for `{name}` through the clone"
        );
    }
    // A `Module` model is a `ModuleT` through tch's blanket impl.
    fn module_t<M: ModuleT>(m: &M, x: &Tensor) -> Tensor {
        m.forward_t(x, true)
    }
    assert!(module_t(&m, &x).equal(&m.forward(&x)));
}

// ---------------------------------------------------------------------------------------
// The encoder of ckpt-models/src/encoder.rs: `ModuleT`, per-call values, a `#[field]`, apply
// closures, dropout in training mode.

macro_rules! encoders {
    ($($name:ident $(= $n:literal)?),* $(,)?) => {$(
        model! {
            /// The encoder of ckpt-models/src/encoder.rs.
            $(#[checkpointed(segments = $n)])?
            struct $name(p, c: &Config) {
                let pad: Tensor = xs.eq(0),
                let keep: Tensor = xs.ne(0).unsqueeze(-1).to_kind(Kind::Float),
                #[field] pos: Tensor = p.randn("pos", &[c.seq_len, c.d_model], 0.0, 0.02),
                tok: nn::Embedding = nn::embedding(p, c.vocab, c.d_model, Default::default())
                    => |tok, ids| ids.apply(tok) + self.pos.narrow(0, 0, ids.size()[1]),
                dropout(c.dropout),
                blocks: [Block; c.layers] = Block::new(p, c)
                    => |b, xs, train| b.forward(xs, &pad, train),
                ln_f: nn::LayerNorm = nn::layer_norm(p, vec![c.d_model], Default::default()),
                |xs| (xs * &keep).sum_dim_intlist(1, false, Kind::Float)
                    / keep.sum_dim_intlist(1, false, Kind::Float),
                head: nn::Linear = nn::linear(p, c.d_model, c.classes, Default::default()),
            }
        }
    )*};
}

encoders!(
    Enc,
    Enc1 = 1,
    Enc2 = 2,
    Enc3 = 3,
    Enc4 = 4,
    Enc5 = 5,
    Enc6 = 6,
    Enc7 = 7,
    Enc8 = 8,
);

/// The encoder written by hand, as the seed's main program does.
#[derive(Debug)]
struct HandEncoder {
    pos: Tensor,
    tok: nn::Embedding,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    head: nn::Linear,
    dropout: f64,
}

impl HandEncoder {
    fn new(p: &nn::Path, c: &Config) -> Self {
        HandEncoder {
            pos: p.randn("pos", &[c.seq_len, c.d_model], 0.0, 0.02),
            tok: nn::embedding(p / "tok", c.vocab, c.d_model, Default::default()),
            blocks: (0..c.layers)
                .map(|i| Block::new(p / "blocks" / i, c))
                .collect(),
            ln_f: nn::layer_norm(p / "ln_f", vec![c.d_model], Default::default()),
            head: nn::linear(p / "head", c.d_model, c.classes, Default::default()),
            dropout: c.dropout,
        }
    }
}

impl ModuleT for HandEncoder {
    fn forward_t(&self, ids: &Tensor, train: bool) -> Tensor {
        let pad = ids.eq(0);
        let keep = ids.ne(0).unsqueeze(-1).to_kind(Kind::Float);
        let s = ids.size()[1];
        let xs = (ids.apply(&self.tok) + self.pos.narrow(0, 0, s)).dropout(self.dropout, train);
        let xs = self
            .blocks
            .iter()
            .fold(xs, |xs, b| b.forward(&xs, &pad, train));
        let xs = xs.apply(&self.ln_f);
        let pooled = (xs * &keep).sum_dim_intlist(1, false, Kind::Float)
            / keep.sum_dim_intlist(1, false, Kind::Float);
        pooled.apply(&self.head)
    }
}

const ENC: Config = Config {
    vocab: 50,
    classes: 5,
    seq_len: 12,
    layers: 3,
    heads: 2,
    d_model: 16,
    ff: 32,
    dropout: 0.2,
};

/// Token ids `[4, 12]` with padded tails of different lengths.
fn ids() -> Tensor {
    let ids = Tensor::randint_low(1, ENC.vocab, [4, ENC.seq_len], (Kind::Int64, Device::Cpu));
    let lengths = Tensor::from_slice(&[12i64, 9, 5, 1]).unsqueeze(1);
    let positions = Tensor::arange(ENC.seq_len, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    ids.masked_fill(&positions.ge_tensor(&lengths), 0)
}

#[test]
fn encoder_matches_hand_written_with_dropout_for_every_segment_count() {
    let _guard = serial();
    tch::manual_seed(2);
    let ref_vs = nn::VarStore::new(Device::Cpu);
    let hand = HandEncoder::new(&ref_vs.root(), &ENC);
    let ids = ids();
    for train in [true, false] {
        let reference = run(&ref_vs, &ids, 21, |x| hand.forward_t(x, train));
        // 8 stages: tok, dropout, blocks[0..3], ln_f, pooling, head.
        macro_rules! check {
            ($($ty:ident => $n:expr),* $(,)?) => {$(
                let (vs, m) = copy_of(&ref_vs, |p| $ty::new(p, &ENC));
                let created = segments_created(|| m.forward_t(&ids, train));
                assert_eq!(created, $n, "{}: checkpointed segments", stringify!($ty));
                let got = run(&vs, &ids, 21, |x| m.forward_t(x, train));
                assert_bitwise_equal(&format!("{} (train = {train})", stringify!($ty)), &reference, &got);
            )*};
        }
        check!(
            Enc => 0,
            Enc1 => 0,
            Enc2 => 1,
            Enc3 => 2,
            Enc4 => 3,
            Enc5 => 4,
            Enc6 => 5,
            Enc7 => 6,
            Enc8 => 7,
        );
        // The example's own declaration (segments = 3).
        let (vs, m) = copy_of(&ref_vs, |p| encoder::Encoder::new(p, &ENC));
        let got = run(&vs, &ids, 21, |x| m.forward_t(x, train));
        assert_bitwise_equal("ckpt-models/src/encoder.rs", &reference, &got);
    }
    // Dropout is really on in training mode, and follows the seed.
    let (vs, m) = copy_of(&ref_vs, |p| Enc3::new(p, &ENC));
    let a = run(&vs, &ids, 21, |x| m.forward_t(x, true)).output;
    let b = run(&vs, &ids, 22, |x| m.forward_t(x, true)).output;
    let eval = run(&vs, &ids, 21, |x| m.forward_t(x, false)).output;
    assert!(!a.equal(&b), "another seed, other dropout masks");
    assert!(!a.equal(&eval), "dropout is applied with train = true");
}

#[test]
fn encoder_saves_and_loads_the_hand_written_weight_files() {
    let _guard = serial();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ids = ids();
    tch::manual_seed(31);
    let vs_model = nn::VarStore::new(Device::Cpu);
    let m = encoder::Encoder::new(vs_model.root(), &ENC);
    tch::manual_seed(32);
    let mut vs_hand = nn::VarStore::new(Device::Cpu);
    let hand = HandEncoder::new(&vs_hand.root(), &ENC);
    let n = names(&vs_model);
    assert_eq!(n, names(&vs_hand));
    assert!(
        n.contains(&"pos".to_owned()),
        "a #[field] names its own variable: {n:?}"
    );
    assert!(n.contains(&"blocks.2.qkv.weight".to_owned()), "{n:?}");
    let logits = |f: &dyn Fn(&Tensor) -> Tensor| f(&ids);
    assert!(!logits(&|x| m.forward_t(x, false)).equal(&logits(&|x| hand.forward_t(x, false))));
    let file = dir.path().join("encoder.safetensors");
    vs_model.save(&file).expect("save");
    vs_hand
        .load(&file)
        .expect("load into the hand-written encoder");
    assert!(logits(&|x| m.forward_t(x, false)).equal(&logits(&|x| hand.forward_t(x, false))));

    tch::manual_seed(33);
    let vs_hand = nn::VarStore::new(Device::Cpu);
    let hand = HandEncoder::new(&vs_hand.root(), &ENC);
    let mut vs_model = nn::VarStore::new(Device::Cpu);
    let m = Enc::new(vs_model.root(), &ENC);
    let file = dir.path().join("hand.safetensors");
    vs_hand.save(&file).expect("save");
    vs_model.load(&file).expect("load into the model! encoder");
    assert!(logits(&|x| m.forward_t(x, false)).equal(&logits(&|x| hand.forward_t(x, false))));
}

// ---------------------------------------------------------------------------------------
// Every stage form at once, against its hand-written twin.

/// A layer that needs the train flag (`ModuleT` only).
#[derive(Debug, ShallowClone)]
struct NoisyLinear {
    lin: nn::Linear,
}

impl ModuleT for NoisyLinear {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        xs.apply(&self.lin).dropout(0.3, train)
    }
}

fn swish(xs: &Tensor) -> Tensor {
    xs * xs.sigmoid()
}

fn jitter(xs: &Tensor, train: bool) -> Tensor {
    if train {
        xs + xs.randn_like() * 0.01
    } else {
        xs.shallow_clone()
    }
}

macro_rules! zoos {
    ($($name:ident $(= $n:literal)?),* $(,)?) => {$(
        model! {
            /// Every stage form.
            $(#[checkpointed(segments = $n, preserve_rng_state = true, determinism_check = true)])?
            pub struct $name(p, d: i64, scale: f64) {
                let rows: i64 = xs.size()[0],
                let bias: Tensor = xs.mean_dim(0, true, Kind::Float).detach(),
                #[field] gain: Tensor = p.ones("gain", &[d]),
                #[field] scale: f64 = scale,
                fc: nn::Linear = nn::linear(p, d, d, Default::default()),
                relu,
                #[train] noisy: NoisyLinear = NoisyLinear { lin: nn::linear(p, d, d, Default::default()) },
                gelu,
                reps: [nn::Linear; 2] = |i| nn::linear(p, d, d, nn::LinearConfig { bias: i == 0, ..Default::default() })
                    => |l, xs| xs.apply(l) * self.scale,
                tanh,
                swish,
                #[train] jitter,
                |xs| xs * &self.gain + &bias,
                sigmoid,
                |xs, train| xs.dropout(0.25, train),
                silu,
                Tensor::relu,
                dropout(0.1),
                more: [NoisyLinear; 2] = NoisyLinear { lin: nn::linear(p, d, d, Default::default()) }
                    => |l, xs, train| l.forward_t(xs, train) / rows as f64,
            }
        }
    )*};
}

zoos!(Zoo, Zoo1 = 1, Zoo4 = 4, Zoo7 = 7, Zoo17 = 17, Zoo19 = 19);

#[derive(Debug)]
struct HandZoo {
    gain: Tensor,
    scale: f64,
    fc: nn::Linear,
    noisy: NoisyLinear,
    reps: Vec<nn::Linear>,
    more: Vec<NoisyLinear>,
}

impl HandZoo {
    fn new(p: &nn::Path, d: i64, scale: f64) -> Self {
        let noisy = |p: nn::Path| NoisyLinear {
            lin: nn::linear(p, d, d, Default::default()),
        };
        HandZoo {
            gain: p.ones("gain", &[d]),
            scale,
            fc: nn::linear(p / "fc", d, d, Default::default()),
            noisy: noisy(p / "noisy"),
            reps: (0..2)
                .map(|i| {
                    let cfg = nn::LinearConfig {
                        bias: i == 0,
                        ..Default::default()
                    };
                    nn::linear(p / "reps" / i, d, d, cfg)
                })
                .collect(),
            more: (0..2).map(|i| noisy(p / "more" / i)).collect(),
        }
    }
}

impl ModuleT for HandZoo {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let rows = xs.size()[0];
        let bias = xs.mean_dim(0, true, Kind::Float).detach();
        let mut h = xs.apply(&self.fc).relu();
        h = self.noisy.forward_t(&h, train).gelu("none");
        for l in &self.reps {
            h = h.apply(l) * self.scale;
        }
        h = jitter(&swish(&h.tanh()), train);
        h = (h * &self.gain + &bias).sigmoid().dropout(0.25, train);
        h = h.silu().relu().dropout(0.1, train);
        for l in &self.more {
            h = l.forward_t(&h, train) / rows as f64;
        }
        h
    }
}

#[test]
fn every_stage_form_matches_hand_written() {
    let _guard = serial();
    let (d, scale) = (8, 0.7);
    tch::manual_seed(3);
    let ref_vs = nn::VarStore::new(Device::Cpu);
    let hand = HandZoo::new(&ref_vs.root(), d, scale);
    let x = Tensor::randn([5, d], (Kind::Float, Device::Cpu));
    for train in [true, false] {
        let reference = run(&ref_vs, &x, 41, |x| hand.forward_t(x, train));
        // 17 stages: fc, relu, noisy, gelu, reps[0..2], tanh, swish, jitter, a closure,
        // sigmoid, a closure, silu, Tensor::relu, dropout, more[0..2].
        macro_rules! check {
            ($($ty:ident => $n:expr),* $(,)?) => {$(
                let (vs, m) = copy_of(&ref_vs, |p| $ty::new(p, d, scale));
                assert_eq!(segments_created(|| m.forward_t(&x, train)), $n);
                let got = run(&vs, &x, 41, |x| m.forward_t(x, train));
                assert_bitwise_equal(&format!("{} (train = {train})", stringify!($ty)), &reference, &got);
            )*};
        }
        check!(Zoo => 0, Zoo1 => 0, Zoo4 => 3, Zoo7 => 6, Zoo17 => 16, Zoo19 => 16);
    }
}

// ---------------------------------------------------------------------------------------
// Generics: a type parameter, a const-generic count, a where clause.

model! {
    /// `N` layers made by a user function.
    #[checkpointed(segments = 2)]
    struct Tower<M, const N: usize>(p, make: fn(nn::Path<'_>) -> M) where M: Module {
        layers: [M; N] = make(p),
        relu,
    }
}

#[test]
fn generic_model_with_const_count() {
    let _guard = serial();
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let tower: Tower<Residual, 3> = Tower::new(vs.root(), |p| Residual::new(p, 4));
    assert_eq!(
        names(&vs),
        [
            "layers.0.bias",
            "layers.0.weight",
            "layers.1.bias",
            "layers.1.weight",
            "layers.2.bias",
            "layers.2.weight"
        ]
    );
    let x = Tensor::randn([2, 4], (Kind::Float, Device::Cpu));
    assert_eq!(segments_created(|| tower.forward(&x)), 1);
    let expected = tower
        .layers
        .iter()
        .fold(x.shallow_clone(), |h, l| l.forward(&h))
        .relu();
    assert!(tower.forward(&x).equal(&expected));
    fn debug<T: Debug>(_: &T) {}
    debug(&tower);
}

// ---------------------------------------------------------------------------------------
// Peak memory.

/// Peak tensor bytes above the baseline of a training step (forward, loss, backward),
/// after a warm-up step that allocates the gradients.
fn step_peak(vs: &nn::VarStore, step: impl Fn()) -> i64 {
    step();
    for v in vs.trainable_variables() {
        zero_grad(&v);
    }
    let ((), report) = ckpt::memory::measure(Device::Cpu, step);
    report.peak_above_baseline_bytes
}

model! {
    /// A deep residual stack, checkpointed in 4 segments.
    #[checkpointed(segments = 4)]
    struct DeepStack(p, c: &StackConfig) {
        inp: nn::Linear = nn::linear(p, c.d_in, c.d, Default::default()),
        blocks: [Residual; c.layers] = Residual::new(p, c.d),
        out: nn::Linear = nn::linear(p, c.d, c.d_out, Default::default()),
    }
}

model! {
    /// The same, plain.
    struct PlainDeepStack(p, c: &StackConfig) {
        inp: nn::Linear = nn::linear(p, c.d_in, c.d, Default::default()),
        blocks: [Residual; c.layers] = Residual::new(p, c.d),
        out: nn::Linear = nn::linear(p, c.d, c.d_out, Default::default()),
    }
}

#[test]
fn checkpointing_lowers_the_peak_memory_of_a_training_step() {
    let _guard = serial();
    let c = StackConfig {
        d_in: 64,
        d: 256,
        d_out: 8,
        layers: 14,
    };
    let x = Tensor::randn([128, c.d_in], (Kind::Float, Device::Cpu));
    tch::manual_seed(5);
    let vs_plain = nn::VarStore::new(Device::Cpu);
    let plain = PlainDeepStack::new(vs_plain.root(), &c);
    let (vs_ckpt, ckpt) = copy_of(&vs_plain, |p| DeepStack::new(p, &c));
    let loss = |y: Tensor| (y.square()).sum(Kind::Float);
    let peak_plain = step_peak(&vs_plain, || loss(plain.forward(&x)).backward());
    let peak_ckpt = step_peak(&vs_ckpt, || loss(ckpt.forward(&x)).backward());
    let ratio = peak_ckpt as f64 / peak_plain as f64;
    println!(
        "residual stack, 14 blocks of [128, 256]: peak {peak_plain} B plain, {peak_ckpt} B with segments = 4 (ratio {ratio:.3})"
    );
    assert!(ratio < 0.5, "ratio {ratio}");

    // The encoder: plain vs the example's 3 segments.
    let cfg = encoder::SMALL;
    let ids = Tensor::randint_low(1, cfg.vocab, [16, cfg.seq_len], (Kind::Int64, Device::Cpu));
    tch::manual_seed(6);
    let vs_plain = nn::VarStore::new(Device::Cpu);
    let plain = Enc::new(vs_plain.root(), &cfg);
    let (vs_ckpt, ckpt) = copy_of(&vs_plain, |p| encoder::Encoder::new(p, &cfg));
    let peak_plain = step_peak(&vs_plain, || loss(plain.forward_t(&ids, true)).backward());
    let peak_ckpt = step_peak(&vs_ckpt, || loss(ckpt.forward_t(&ids, true)).backward());
    let ratio = peak_ckpt as f64 / peak_plain as f64;
    println!(
        "encoder, 6 blocks, batch 16 x 64 tokens, d_model 64: peak {peak_plain} B plain, {peak_ckpt} B with segments = 3 (ratio {ratio:.3})"
    );
    assert!(ratio < 0.75, "ratio {ratio}");
}
