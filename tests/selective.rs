//! Selective checkpointing (`CheckpointOptions::policy`): a segment keeps its linear
//! outputs and dropout masks from forward, and the recompute uses them. Gradients,
//! outputs and the generator's state afterwards are bit-equal to the plain model and to
//! the full recompute; the bytes kept are exactly the linear outputs and the masks.
//! The global generator is shared by the tests of this binary: each takes a lock.

mod common;

use std::sync::{Mutex, MutexGuard};

use ckpt::{CheckpointOptions, Policy, ShallowClone};
use common::{assert_all_equal, grads_and_output, kept_by};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

static RNG: Mutex<()> = Mutex::new(());

fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

const D: i64 = 32;
const HEADS: i64 = 4;

/// A pre-LN transformer block with dropout, written as tch code writes one.
#[derive(Debug, ShallowClone)]
struct Block {
    ln1: nn::LayerNorm,
    qkv: nn::Linear,
    proj: nn::Linear,
    ln2: nn::LayerNorm,
    ff1: nn::Linear,
    ff2: nn::Linear,
}

impl Block {
    fn new(p: nn::Path) -> Block {
        Block {
            ln1: nn::layer_norm(&p / "ln1", vec![D], Default::default()),
            qkv: nn::linear(&p / "qkv", D, 3 * D, Default::default()),
            proj: nn::linear(&p / "proj", D, D, Default::default()),
            ln2: nn::layer_norm(&p / "ln2", vec![D], Default::default()),
            ff1: nn::linear(&p / "ff1", D, 4 * D, Default::default()),
            ff2: nn::linear(&p / "ff2", 4 * D, D, Default::default()),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (b, t, _) = x.size3().unwrap();
        let qkv = self.qkv.forward(&self.ln1.forward(x));
        let heads = |z: Tensor| z.view([b, t, HEADS, D / HEADS]).transpose(1, 2);
        let q = heads(qkv.narrow(2, 0, D));
        let k = heads(qkv.narrow(2, D, D));
        let v = heads(qkv.narrow(2, 2 * D, D));
        let att = (q.matmul(&k.transpose(-2, -1)) / ((D / HEADS) as f64).sqrt())
            .softmax(-1, Kind::Float)
            .dropout(0.1, true);
        let y = att.matmul(&v).transpose(1, 2).contiguous().view([b, t, D]);
        let x = x + self.proj.forward(&y).dropout(0.1, true);
        let h = self.ff1.forward(&self.ln2.forward(&x)).gelu("none");
        &x + self.ff2.forward(&h).dropout(0.1, true)
    }
}

fn stack(vs: &nn::VarStore, n: usize) -> Vec<Block> {
    (0..n).map(|i| Block::new(vs.root() / i)).collect()
}

fn run_plain(blocks: &[Block], x: &Tensor) -> Tensor {
    blocks.iter().fold(x.shallow_clone(), |x, b| b.forward(&x))
}

/// Every block its own checkpointed segment with `policy`.
fn run_checkpointed(blocks: &[Block], x: &Tensor, policy: Policy) -> Tensor {
    let opts = CheckpointOptions::new().policy(policy);
    blocks.iter().fold(x.shallow_clone(), |x, b| {
        let b = b.shallow_clone();
        ckpt::checkpoint_with(&opts, move |x: Tensor| b.forward(&x), x)
    })
}

/// Output, gradients (parameters, then the input) and the next random draw.
fn step(vs: &nn::VarStore, x: &Tensor, f: &dyn Fn(&Tensor) -> Tensor) -> Vec<Tensor> {
    tch::manual_seed(7);
    let mut out = grads_and_output(vs, x, f);
    out.push(Tensor::rand([8], (Kind::Float, Device::Cpu)));
    out
}

#[test]
fn selective_policy_gives_the_plain_gradients_bit_for_bit() {
    let _rng = rng();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = stack(&vs, 3);
    let x = Tensor::randn([2, 16, D], (Kind::Float, Device::Cpu));

    let plain = step(&vs, &x, &|x| run_plain(&blocks, x));
    let full = step(&vs, &x, &|x| {
        run_checkpointed(&blocks, x, Policy::RECOMPUTE_ALL)
    });
    assert_all_equal("full recompute vs plain", &full, &plain);
    for policy in [
        Policy::selective(),
        Policy::RECOMPUTE_ALL.save_linear(true),
        Policy::RECOMPUTE_ALL.save_dropout_masks(true),
        Policy::narrowing(),
        Policy::RECOMPUTE_ALL.save_narrowing_linear(true),
    ] {
        let sel = step(&vs, &x, &|x| run_checkpointed(&blocks, x, policy));
        assert_all_equal(&format!("{policy:?} vs plain"), &sel, &plain);
    }
    assert_eq!(ckpt::live_segments(), 0);
}

/// Bytes alive between forward and backward: the stash alone for the full recompute;
/// with the selective policy also every linear output (float32) and every dropout mask
/// (one bit an element, rounded up to whole bytes) with the generator state after its
/// draw.
#[test]
fn selective_policy_keeps_exactly_the_linear_outputs_and_the_masks() {
    let _rng = rng();
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = stack(&vs, 2);
    let (b, t) = (2i64, 16i64);
    let x = Tensor::randn([b, t, D], (Kind::Float, Device::Cpu));
    let alive = |policy: Policy| -> i64 {
        let before = ckpt::memory::current_bytes(Device::Cpu);
        let y = run_checkpointed(&blocks, &x, policy);
        let after = ckpt::memory::current_bytes(Device::Cpu);
        drop(y);
        after - before
    };
    let full = alive(Policy::RECOMPUTE_ALL);
    let linear = alive(Policy::RECOMPUTE_ALL.save_linear(true));
    let masks = alive(Policy::RECOMPUTE_ALL.save_dropout_masks(true));
    let rows = b * t;
    let f32_bytes = 4;
    // Per block: qkv [rows, 3D], proj [rows, D], ff1 [rows, 4D], ff2 [rows, D].
    let linear_per_block = rows * (3 * D + D + 4 * D + D) * f32_bytes;
    assert_eq!(linear - full, 2 * linear_per_block, "linear outputs kept");
    // Per block: the attention mask [b, heads, t, t] and two [b, t, D] masks, 8 elements
    // a byte.
    let bits = |elems: i64| (elems + 7) / 8;
    let mask_bytes = bits(b * HEADS * t * t) + 2 * bits(b * t * D);
    let per_block_state = (masks - full - 2 * mask_bytes) / 6;
    assert_eq!(
        masks - full,
        2 * mask_bytes + 6 * per_block_state,
        "masks kept, plus one generator state per dropout"
    );
    assert!(
        (1..=8192).contains(&per_block_state),
        "a generator state is a few KiB: {per_block_state} B"
    );
    println!(
        "kept between forward and backward, 2 blocks: stash {full} B; linear outputs +{} B; \
         dropout masks +{} B ({per_block_state} B of generator state a dropout)",
        linear - full,
        masks - full
    );
}

/// A kept linear output changed in place after the layer (here by the segment itself,
/// `relu_`) is recomputed, not replayed: gradients stay the plain ones.
#[test]
fn a_kept_output_changed_in_place_is_recomputed() {
    let _rng = rng();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let a = nn::linear(vs.root() / "a", 8, 8, Default::default());
    let b = nn::linear(vs.root() / "b", 8, 8, Default::default());
    let f = |a: &nn::Linear, b: &nn::Linear, x: &Tensor| {
        let mut h = a.forward(x);
        let _ = h.relu_();
        b.forward(&h)
    };
    let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &x, &|x| f(&a, &b, x));
    let opts = CheckpointOptions::new().policy(Policy::selective());
    let sel = step(&vs, &x, &|x| {
        let (a, b) = (a.shallow_clone(), b.shallow_clone());
        ckpt::checkpoint_with(&opts, move |x: Tensor| f(&a, &b, &x), x.shallow_clone())
    });
    assert_all_equal("in-place on a kept output", &sel, &plain);
}

/// A recompute that calls linear on other shapes than forward did is an error, not
/// wrong gradients.
#[test]
fn a_recompute_that_diverges_is_an_error() {
    let _rng = rng();
    let vs = nn::VarStore::new(Device::Cpu);
    let a = nn::linear(vs.root() / "a", 8, 8, Default::default());
    let opts = CheckpointOptions::new()
        .policy(Policy::selective())
        .name("diverging")
        .determinism_check(false);
    let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
    let y: Tensor = ckpt::checkpoint_with(
        &opts,
        move |x: Tensor| {
            // Data-dependent behaviour the macro would refuse: fewer rows in the recompute.
            let rows = if ckpt::is_recomputing() { 2 } else { 4 };
            a.forward(&x.narrow(0, 0, rows)).sum(Kind::Float)
        },
        x,
    );
    let err = y.f_backward().expect_err("the recompute diverged");
    let msg = err.to_string();
    assert!(
        msg.contains("selective checkpointing") && msg.contains("[2, 8]") && msg.contains("[4, 8]"),
        "{msg}"
    );
}

/// Linear layers without a bias, and a 4-d input, go the composite's other paths: they
/// are recomputed, and the gradients are still the plain ones.
#[test]
fn linear_paths_that_are_not_kept_still_match() {
    let _rng = rng();
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let nobias = nn::LinearConfig {
        bias: false,
        ..Default::default()
    };
    let a = nn::linear(vs.root() / "a", 8, 8, nobias);
    let b = nn::linear(vs.root() / "b", 8, 8, Default::default());
    let f = |a: &nn::Linear, b: &nn::Linear, x: &Tensor| {
        let h = a.forward(x).gelu("none");
        b.forward(&h.transpose(1, 2)).dropout(0.2, true)
    };
    let x = Tensor::randn([2, 3, 8, 8], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &x, &|x| f(&a, &b, x));
    let opts = CheckpointOptions::new().policy(Policy::selective());
    let sel = step(&vs, &x, &|x| {
        let (a, b) = (a.shallow_clone(), b.shallow_clone());
        ckpt::checkpoint_with(&opts, move |x: Tensor| f(&a, &b, &x), x.shallow_clone())
    });
    assert_all_equal("bias-less and strided linear", &sel, &plain);
}

/// Dropout masks are kept as bits, 8 elements a byte: element counts that do not fill
/// the last byte, strided (transposed) inputs and float64 still give the plain noise
/// back, so outputs and gradients are bit-equal and the masks take `ceil(n / 8)` bytes.
#[test]
fn kept_mask_bits_of_any_size_and_layout_match_plain() {
    let _rng = rng();
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().randn("w", &[13, 3], 0.0, 1.0);
    let f = |w: &Tensor, x: &Tensor| {
        // [3, 13] -> transposed [13, 3] (not contiguous), 39 elements; then 5 elements.
        let h = (x.transpose(0, 1) * w).dropout(0.3, true);
        let tail = h
            .sum_dim_intlist(1, false, Kind::Float)
            .narrow(0, 0, 5)
            .dropout(0.5, true);
        let wide = x
            .to_kind(Kind::Double)
            .dropout(0.25, true)
            .to_kind(Kind::Float);
        h.sum(Kind::Float) + tail.sum(Kind::Float) + wide.sum(Kind::Float)
    };
    let x = Tensor::randn([3, 13], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &x, &|x| f(&w, x));
    let opts = CheckpointOptions::new().policy(Policy::RECOMPUTE_ALL.save_dropout_masks(true));
    let masked = step(&vs, &x, &|x| {
        let w = w.shallow_clone();
        ckpt::checkpoint_with(&opts, move |x: Tensor| f(&w, &x), x.shallow_clone())
    });
    assert_all_equal("odd-sized, strided and float64 masks", &masked, &plain);
    let kept = |policy: Policy| {
        let x = x.detach().set_requires_grad(true);
        let opts = CheckpointOptions::new().policy(policy);
        let before = ckpt::memory::current_bytes(Device::Cpu);
        let w2 = w.shallow_clone();
        let y = ckpt::checkpoint_with(&opts, move |x: Tensor| f(&w2, &x), x);
        let after = ckpt::memory::current_bytes(Device::Cpu);
        drop(y);
        after - before
    };
    let full = kept(Policy::RECOMPUTE_ALL);
    let masks = kept(Policy::RECOMPUTE_ALL.save_dropout_masks(true));
    let bits = (39 + 7) / 8 + (5 + 7) / 8 + (39 + 7) / 8;
    let states = (masks - full - bits) / 3;
    assert_eq!(masks - full, bits + 3 * states, "ceil(n / 8) bytes a mask");
    assert!((1..=8192).contains(&states), "generator state {states} B");
}

/// The fast paths of the mask kernels (contiguous float32 read and written 8 elements a
/// step, contiguous float64 written from a table) against the plain noise: sizes with
/// and without a partial last byte, several drop probabilities, bit-equal outputs and
/// gradients.
#[test]
fn contiguous_float_masks_of_many_sizes_match_plain() {
    let _rng = rng();
    tch::manual_seed(11);
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().randn("w", &[4099], 0.0, 1.0);
    let f = |w: &Tensor, x: &Tensor| {
        let mut total = Tensor::zeros([], (Kind::Float, Device::Cpu));
        for (n, p) in [(8, 0.5), (9, 0.1), (1001, 0.1), (4096, 0.9), (4099, 0.3)] {
            let h = (x.narrow(0, 0, n) * w.narrow(0, 0, n)).dropout(p, true);
            total += (&h * &h).sum(Kind::Float);
        }
        let d = (x.narrow(0, 0, 77) * w.narrow(0, 0, 77))
            .to_kind(Kind::Double)
            .dropout(0.2, true);
        total + (&d * &d).sum(Kind::Double).to_kind(Kind::Float)
    };
    let x = Tensor::randn([4099], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &x, &|x| f(&w, x));
    for policy in [
        Policy::RECOMPUTE_ALL.save_dropout_masks(true),
        Policy::selective(),
    ] {
        let opts = CheckpointOptions::new().policy(policy);
        let masked = step(&vs, &x, &|x| {
            let w = w.shallow_clone();
            ckpt::checkpoint_with(&opts, move |x: Tensor| f(&w, &x), x.shallow_clone())
        });
        assert_all_equal("contiguous masks", &masked, &plain);
    }
}

/// The recompute really uses what forward kept: under the selective policy a linear
/// layer's output in the recompute is the very storage forward produced; under the full
/// recompute it is a new one.
#[test]
fn the_recompute_replays_the_kept_linear_output() {
    use std::sync::{Arc, Mutex as StdMutex};
    let _rng = rng();
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let a = nn::linear(vs.root() / "a", 8, 8, Default::default());
    // The log holds each output, so the forward's stays alive and the allocator cannot
    // hand its address to the full recompute.
    let pointers = |policy: Policy| -> Vec<(bool, usize)> {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let (a, log) = (a.shallow_clone(), Arc::clone(&seen));
        let opts = CheckpointOptions::new().policy(policy);
        let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let y: Tensor = ckpt::checkpoint_with(
            &opts,
            move |x: Tensor| {
                let h = a.forward(&x);
                log.lock()
                    .unwrap()
                    .push((ckpt::is_recomputing(), h.shallow_clone()));
                h.tanh()
            },
            x,
        );
        y.sum(Kind::Float).backward();
        let seen = seen.lock().unwrap();
        seen.iter()
            .map(|(r, h)| (*r, h.data_ptr() as usize))
            .collect()
    };
    let sel = pointers(Policy::selective());
    assert_eq!(sel.len(), 2, "forward and recompute: {sel:?}");
    assert!(!sel[0].0 && sel[1].0);
    assert_eq!(sel[0].1, sel[1].1, "the recompute replays the kept output");
    let full = pointers(Policy::RECOMPUTE_ALL);
    assert_eq!(full.len(), 2);
    assert_ne!(
        full[0].1, full[1].1,
        "the full recompute computes a new output"
    );
}

#[ckpt::checkpointed(segments = 3, policy = selective)]
fn stack_selective(blocks: &[Block], x: &Tensor) -> Tensor {
    let mut x = x.shallow_clone();
    for b in blocks.iter() {
        x = b.forward(&x);
    }
    x
}

#[ckpt::checkpointed(segments = 3)]
fn stack_full(blocks: &[Block], x: &Tensor) -> Tensor {
    let mut x = x.shallow_clone();
    for b in blocks.iter() {
        x = b.forward(&x);
    }
    x
}

/// `#[checkpointed(policy = selective)]`: plain gradients, and more kept than the full
/// recompute of the same cuts (the linear outputs and masks of the checkpointed blocks).
#[test]
fn checkpointed_functions_take_the_policy() {
    let _rng = rng();
    tch::manual_seed(6);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = stack(&vs, 4);
    let x = Tensor::randn([2, 16, D], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &x, &|x| run_plain(&blocks, x));
    let sel = step(&vs, &x, &|x| stack_selective(&blocks, x));
    assert_all_equal("policy = selective vs plain", &sel, &plain);
    let full = step(&vs, &x, &|x| stack_full(&blocks, x));
    assert_all_equal("policy = full vs plain", &full, &plain);
    let (kept_sel, kept_full) = (
        kept_by(&x, |x| stack_selective(&blocks, x)),
        kept_by(&x, |x| stack_full(&blocks, x)),
    );
    let kept_plain = kept_by(&x, |x| run_plain(&blocks, x));
    assert!(
        kept_full < kept_sel && kept_sel < kept_plain,
        "full {kept_full} B < selective {kept_sel} B < plain {kept_plain} B"
    );
}

ckpt::model! {
    #[checkpointed(segments = 3, policy = selective)]
    struct Stack(p) {
        blocks: [Block; 4] = Block::new(p) => |b, xs| b.forward(xs),
    }
}

/// `model!` with `policy = selective`, and `set_policy` at run time: one model run plain
/// (`set_segments(1)`), selective and with full recompute gives the same gradients.
#[test]
fn model_takes_the_policy_and_changes_it_at_run_time() {
    let _rng = rng();
    tch::manual_seed(8);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = Stack::new(vs.root());
    assert_eq!(model.policy(), Policy::selective());
    let x = Tensor::randn([2, 16, D], (Kind::Float, Device::Cpu));
    let sel = step(&vs, &x, &|x| model.forward(x));
    let kept_sel = kept_by(&x, |x| model.forward(x));
    model.set_policy(Policy::RECOMPUTE_ALL);
    let full = step(&vs, &x, &|x| model.forward(x));
    let kept_full = kept_by(&x, |x| model.forward(x));
    model.set_segments(1).unwrap();
    let plain = step(&vs, &x, &|x| model.forward(x));
    assert_all_equal("model!, selective vs plain", &sel, &plain);
    assert_all_equal("model!, full vs plain", &full, &plain);
    assert!(
        kept_full < kept_sel,
        "full {kept_full} B < selective {kept_sel} B"
    );
}

/// The same four blocks under several attributes: one statement a block, so
/// `segments = 2` checkpoints blocks 0 and 1 (stages `0..2`) and runs 2 and 3 inline.
macro_rules! four_blocks {
    ($($(#[$attr:meta])* fn $name:ident;)*) => {$(
        $(#[$attr])*
        fn $name(blocks: &[Block], x: &Tensor) -> Tensor {
            let h = blocks[0].forward(x);
            let h = blocks[1].forward(&h);
            let h = blocks[2].forward(&h);
            blocks[3].forward(&h)
        }
    )*};
}

four_blocks! {
    fn four_plain;
    #[ckpt::checkpointed(segments = 2, policy = masks)]
    fn four_masks;
    #[ckpt::checkpointed(segments = 2)]
    fn four_full;
    #[ckpt::checkpointed(segments = 2, policy = narrowing)]
    fn four_narrowing;
}

/// Bytes that checkpointing `blocks` one segment each with [`Policy::masks`] keeps
/// beyond full recompute: the dropout masks (one bit an element) and one generator state
/// a dropout, measured on `ckpt::checkpoint_with`.
fn masks_kept_by(blocks: &[Block], x: &Tensor) -> i64 {
    kept_by(x, |x| run_checkpointed(blocks, x, Policy::masks()))
        - kept_by(x, |x| run_checkpointed(blocks, x, Policy::RECOMPUTE_ALL))
}

/// The exact bytes [`Policy::masks`] keeps for `n` blocks on a `[b, t, D]` input:
/// three dropouts a block (attention `[b, heads, t, t]`, two `[b, t, D]`), each a bit mask
/// rounded up to whole bytes, plus `state` bytes of generator state each.
fn mask_bytes(n: i64, (b, t): (i64, i64), state: i64) -> i64 {
    let bits = |elems: i64| (elems + 7) / 8;
    n * (bits(b * HEADS * t * t) + 2 * bits(b * t * D) + 3 * state)
}

/// `Policy::masks()` keeps exactly the dropout masks and a generator state per dropout,
/// none of the linear outputs.
#[test]
fn masks_policy_keeps_exactly_the_masks() {
    let _rng = rng();
    tch::manual_seed(9);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = stack(&vs, 2);
    let x = Tensor::randn([2, 16, D], (Kind::Float, Device::Cpu));
    assert_eq!(Policy::masks(), Policy::selective().save_linear(false));
    let one = masks_kept_by(&blocks[..1], &x);
    let state = (one - mask_bytes(1, (2, 16), 0)) / 3;
    assert!((1..=8192).contains(&state), "generator state {state} B");
    assert_eq!(one, mask_bytes(1, (2, 16), state));
    assert_eq!(masks_kept_by(&blocks, &x), mask_bytes(2, (2, 16), state));
}

/// `#[checkpointed(segments = 2, policy = masks)]`: the plain function's outputs,
/// gradients and generator state bit for bit, and the two checkpointed blocks' dropout
/// masks kept from forward (exact bytes beyond the same cuts with full recompute).
#[test]
fn checkpointed_functions_take_the_masks_policy() {
    let _rng = rng();
    tch::manual_seed(10);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = stack(&vs, 4);
    let x = Tensor::randn([2, 16, D], (Kind::Float, Device::Cpu));
    let plain = step(&vs, &x, &|x| four_plain(&blocks, x));
    let masks = step(&vs, &x, &|x| four_masks(&blocks, x));
    assert_all_equal("policy = masks vs plain", &masks, &plain);
    let full = step(&vs, &x, &|x| four_full(&blocks, x));
    assert_all_equal("policy = full vs plain", &full, &plain);
    let kept = kept_by(&x, |x| four_masks(&blocks, x)) - kept_by(&x, |x| four_full(&blocks, x));
    assert_eq!(
        kept,
        masks_kept_by(&blocks[..2], &x),
        "blocks 0 and 1's masks"
    );
    assert!(kept > 0);
}

ckpt::model! {
    #[checkpointed(segments = 2, policy = masks)]
    struct MaskedStack(p) {
        blocks: [Block; 4] = Block::new(p) => |b, xs| b.forward(xs),
    }
}

/// `model!` with `policy = masks`: the plain run's outputs and gradients bit for bit,
/// and the checkpointed blocks' masks kept (exact bytes beyond full recompute).
#[test]
fn model_takes_the_masks_policy() {
    let _rng = rng();
    tch::manual_seed(12);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = MaskedStack::new(vs.root());
    assert_eq!(model.policy(), Policy::masks());
    let x = Tensor::randn([2, 16, D], (Kind::Float, Device::Cpu));
    let masks = step(&vs, &x, &|x| model.forward(x));
    let kept_masks = kept_by(&x, |x| model.forward(x));
    model.set_policy(Policy::RECOMPUTE_ALL);
    let kept_full = kept_by(&x, |x| model.forward(x));
    model.set_segments(1).unwrap();
    let plain = step(&vs, &x, &|x| model.forward(x));
    assert_all_equal("model!, masks vs plain", &masks, &plain);
    assert_eq!(
        kept_masks - kept_full,
        masks_kept_by(&model.blocks[..2], &x)
    );
}

/// `Policy::narrowing()` keeps the masks and, of the linear outputs, only the narrowing
/// one's: `ff2`'s `[rows, D]` (its weight is `[D, 4D]`), none of `qkv` (`[3D, D]`), `proj`
/// (`[D, D]`, not narrowing) or `ff1` (`[4D, D]`). Exact bytes on `checkpoint_with` and on
/// `#[checkpointed(policy = narrowing)]`, whose gradients equal the plain function's bit
/// for bit.
#[test]
fn narrowing_policy_keeps_the_masks_and_the_narrowing_linear_outputs() {
    let _rng = rng();
    tch::manual_seed(13);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = stack(&vs, 4);
    let (b, t) = (2i64, 16i64);
    let x = Tensor::randn([b, t, D], (Kind::Float, Device::Cpu));
    assert_eq!(
        Policy::narrowing(),
        Policy::masks().save_narrowing_linear(true)
    );
    let ff2_out = b * t * D * 4;
    let narrowing = |blocks: &[Block]| {
        kept_by(&x, |x| run_checkpointed(blocks, x, Policy::narrowing()))
            - kept_by(&x, |x| run_checkpointed(blocks, x, Policy::masks()))
    };
    assert_eq!(narrowing(&blocks[..1]), ff2_out, "one block: ff2's output");
    assert_eq!(narrowing(&blocks[..2]), 2 * ff2_out, "two blocks");
    // Linear outputs alone, narrowing ones: the same bytes beyond full recompute.
    let alone = kept_by(&x, |x| {
        run_checkpointed(
            &blocks[..2],
            x,
            Policy::RECOMPUTE_ALL.save_narrowing_linear(true),
        )
    }) - kept_by(&x, |x| {
        run_checkpointed(&blocks[..2], x, Policy::RECOMPUTE_ALL)
    });
    assert_eq!(alone, 2 * ff2_out);
    // The attribute: blocks 0 and 1 checkpointed, bit-equal to the plain function.
    let plain = step(&vs, &x, &|x| four_plain(&blocks, x));
    let narrow = step(&vs, &x, &|x| four_narrowing(&blocks, x));
    assert_all_equal("policy = narrowing vs plain", &narrow, &plain);
    let kept = kept_by(&x, |x| four_narrowing(&blocks, x)) - kept_by(&x, |x| four_full(&blocks, x));
    assert_eq!(kept, masks_kept_by(&blocks[..2], &x) + 2 * ff2_out);
}

ckpt::model! {
    #[checkpointed(segments = 2, policy = narrowing)]
    struct NarrowingStack(p) {
        blocks: [Block; 4] = Block::new(p) => |b, xs| b.forward(xs),
    }
}

/// `model!` with `policy = narrowing`: the plain run's outputs and gradients bit for
/// bit, and the checkpointed blocks' masks and `ff2` outputs kept (exact bytes beyond
/// full recompute).
#[test]
fn model_takes_the_narrowing_policy() {
    let _rng = rng();
    tch::manual_seed(14);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = NarrowingStack::new(vs.root());
    assert_eq!(model.policy(), Policy::narrowing());
    let (b, t) = (2i64, 16i64);
    let x = Tensor::randn([b, t, D], (Kind::Float, Device::Cpu));
    let narrow = step(&vs, &x, &|x| model.forward(x));
    let kept_narrow = kept_by(&x, |x| model.forward(x));
    model.set_policy(Policy::RECOMPUTE_ALL);
    let kept_full = kept_by(&x, |x| model.forward(x));
    model.set_segments(1).unwrap();
    let plain = step(&vs, &x, &|x| model.forward(x));
    assert_all_equal("model!, narrowing vs plain", &narrow, &plain);
    assert_eq!(
        kept_narrow - kept_full,
        masks_kept_by(&model.blocks[..2], &x) + 2 * b * t * D * 4
    );
}

/// Policies that keep the same things are equal (and hash alike): `save_linear` implies
/// the narrowing linears' outputs.
#[test]
fn policies_that_keep_the_same_things_are_equal() {
    use std::collections::HashSet;
    let same = [
        Policy::selective(),
        Policy::selective().save_narrowing_linear(true),
        Policy::narrowing().save_linear(true),
    ];
    assert!(same.iter().all(|&p| p == Policy::selective()));
    assert_eq!(same.iter().collect::<HashSet<_>>().len(), 1);
    assert_ne!(Policy::narrowing(), Policy::masks());
    assert_ne!(Policy::narrowing(), Policy::selective());
    assert_eq!(ckpt::plan::policy_name(same[1]), "selective");
    assert_eq!(ckpt::plan::policy_name(Policy::narrowing()), "narrowing");
}
