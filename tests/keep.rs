//! `#[ckpt::keep]` on a `let` of a `#[checkpointed]` function: the statement runs once,
//! inline between the segments, and is not recomputed in backward; outputs and gradients
//! stay bit-equal to the unannotated function, and exactly the kept value's bytes stay
//! alive besides what the cut would keep anyway.
//!
//! The tests share the RNG, the memory counter and the run counters: one at a time.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::{ShallowClone, checkpointed};
use common::{assert_all_equal, grads_and_output};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const D: i64 = 16;
const HEADS: i64 = 2;

/// How often the projection statement and the feed-forward statement ran.
static PROJECTIONS: AtomicUsize = AtomicUsize::new(0);
static ATTENTION: AtomicUsize = AtomicUsize::new(0);

fn counted(counter: &AtomicUsize, t: Tensor) -> Tensor {
    counter.fetch_add(1, Ordering::SeqCst);
    t
}

#[derive(ShallowClone)]
struct Block {
    ln1: nn::LayerNorm,
    qkv: nn::Linear,
    out: nn::Linear,
    ln2: nn::LayerNorm,
    ff1: nn::Linear,
    ff2: nn::Linear,
}

fn block(vs: &nn::VarStore) -> Block {
    let p = vs.root();
    Block {
        ln1: nn::layer_norm(&p / "ln1", vec![D], Default::default()),
        qkv: nn::linear(&p / "qkv", D, 3 * D, Default::default()),
        out: nn::linear(&p / "out", D, D, Default::default()),
        ln2: nn::layer_norm(&p / "ln2", vec![D], Default::default()),
        ff1: nn::linear(&p / "ff1", D, 4 * D, Default::default()),
        ff2: nn::linear(&p / "ff2", 4 * D, D, Default::default()),
    }
}

/// Multi-head attention over a fused `[b, t, 3D]` projection, with dropout on the weights.
fn attention(qkv: &Tensor) -> Tensor {
    let (b, t, _) = qkv.size3().unwrap();
    let heads = |z: Tensor| z.view([b, t, HEADS, D / HEADS]).transpose(1, 2);
    let q = heads(qkv.narrow(2, 0, D));
    let k = heads(qkv.narrow(2, D, D));
    let v = heads(qkv.narrow(2, 2 * D, D));
    let w = (q.matmul(&k.transpose(-2, -1)) / ((D / HEADS) as f64).sqrt())
        .softmax(-1, Kind::Float)
        .dropout(0.2, true);
    w.matmul(&v).transpose(1, 2).contiguous().view([b, t, D])
}

/// The projections kept: segment 1 is the norm, then the kept projection runs inline,
/// segment 2 is the attention core and its output projection, the rest runs inline.
#[checkpointed]
fn kept_projection(m: &Block, x: &Tensor) -> Tensor {
    let h = m.ln1.forward(x);
    #[ckpt::keep]
    let qkv = counted(&PROJECTIONS, m.qkv.forward(&h));
    let a = counted(&ATTENTION, attention(&qkv));
    let y = x + m.out.forward(&a).dropout(0.2, true);
    ckpt::cut!();
    let f = m.ff1.forward(&m.ln2.forward(&y)).relu();
    y + m.ff2.forward(&f)
}

/// The same cuts without the mark: the projection is recomputed with segment 2.
#[checkpointed]
fn recomputed_projection(m: &Block, x: &Tensor) -> Tensor {
    let h = m.ln1.forward(x);
    ckpt::cut!();
    let qkv = counted(&PROJECTIONS, m.qkv.forward(&h));
    let a = counted(&ATTENTION, attention(&qkv));
    let y = x + m.out.forward(&a).dropout(0.2, true);
    ckpt::cut!();
    let f = m.ff1.forward(&m.ln2.forward(&y)).relu();
    y + m.ff2.forward(&f)
}

/// The unannotated function.
fn plain(m: &Block, x: &Tensor) -> Tensor {
    let h = m.ln1.forward(x);
    let qkv = counted(&PROJECTIONS, m.qkv.forward(&h));
    let a = counted(&ATTENTION, attention(&qkv));
    let y = x + m.out.forward(&a).dropout(0.2, true);
    let f = m.ff1.forward(&m.ln2.forward(&y)).relu();
    y + m.ff2.forward(&f)
}

/// Output and gradients after seeding the RNG the same way; the run counts of the
/// projection and the attention statements.
fn step(
    vs: &nn::VarStore,
    x: &Tensor,
    f: &dyn Fn(&Tensor) -> Tensor,
) -> (Vec<Tensor>, usize, usize) {
    PROJECTIONS.store(0, Ordering::SeqCst);
    ATTENTION.store(0, Ordering::SeqCst);
    tch::manual_seed(11);
    let out = grads_and_output(vs, x, f);
    (
        out,
        PROJECTIONS.load(Ordering::SeqCst),
        ATTENTION.load(Ordering::SeqCst),
    )
}

/// The block's variables and the block, from the RNG seeded with `seed`.
fn fixture(seed: i64) -> (nn::VarStore, Block) {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = block(&vs);
    (vs, m)
}

#[test]
fn a_kept_statement_runs_once_and_gradients_equal_plain() {
    let _serial = serial();
    let (vs, m) = fixture(3);
    let x = Tensor::randn([2, 5, D], (Kind::Float, Device::Cpu));
    let (want, p_plain, a_plain) = step(&vs, &x, &|x| plain(&m, x));
    assert_eq!((p_plain, a_plain), (1, 1));
    let (kept, p_kept, a_kept) = step(&vs, &x, &|x| kept_projection(&m, x));
    assert_all_equal("kept projection vs plain", &kept, &want);
    assert_eq!(p_kept, 1, "the kept projection is not recomputed");
    assert_eq!(a_kept, 2, "the attention core is recomputed");
    let (recomputed, p_rec, a_rec) = step(&vs, &x, &|x| recomputed_projection(&m, x));
    assert_all_equal("recomputed projection vs plain", &recomputed, &want);
    assert_eq!(
        (p_rec, a_rec),
        (2, 2),
        "without the mark both are recomputed"
    );
}

/// The kept projection's output stays alive in place of its recompute: with the same
/// cuts, exactly its `[b, t, 3D]` float32 bytes more than without the mark (its input,
/// the norm's output, is what the next segment would stash anyway).
#[test]
fn a_kept_statement_keeps_exactly_its_value() {
    let _serial = serial();
    let (_vs, m) = fixture(4);
    let (b, t) = (3i64, 7i64);
    let x = Tensor::randn([b, t, D], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let alive = |f: &dyn Fn(&Tensor) -> Tensor| {
        let before = ckpt::memory::current_bytes(Device::Cpu);
        let y = f(&x);
        let after = ckpt::memory::current_bytes(Device::Cpu);
        drop(y);
        after - before
    };
    let kept = alive(&|x| kept_projection(&m, x));
    let recomputed = alive(&|x| recomputed_projection(&m, x));
    assert_eq!(kept - recomputed, b * t * 3 * D * 4);
}

/// `segments = N` with a mark: the groups are cut as without it, then the kept statement
/// is taken out of its group (here the middle of the first one, which becomes two).
#[checkpointed(segments = 2)]
fn balanced_with_keep(m: &Block, x: &Tensor) -> Tensor {
    let h = m.ln1.forward(x);
    #[ckpt::keep]
    let qkv = counted(&PROJECTIONS, m.qkv.forward(&h));
    let a = counted(&ATTENTION, attention(&qkv));
    let y = x + m.out.forward(&a).dropout(0.2, true);
    let f = m.ff1.forward(&m.ln2.forward(&y)).relu();
    y + m.ff2.forward(&f)
}

#[test]
fn segments_n_with_a_kept_statement_equals_plain() {
    let _serial = serial();
    let (vs, m) = fixture(5);
    let x = Tensor::randn([2, 4, D], (Kind::Float, Device::Cpu));
    let (want, _, _) = step(&vs, &x, &|x| plain(&m, x));
    let (got, projections, attention_runs) = step(&vs, &x, &|x| balanced_with_keep(&m, x));
    assert_all_equal("segments = 2 with a kept statement", &got, &want);
    assert_eq!(projections, 1, "kept");
    // 6 stages in 2 segments cut 3/3: the attention is in the first, checkpointed, one.
    assert_eq!(attention_runs, 2, "recomputed");
}
