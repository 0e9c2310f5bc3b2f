//! A breaker's pass over the selective policies (`Policy::masks`, `narrowing`,
//! `selective`), kept as regression tests: `Linear` layouts and shapes on and off the kept
//! (fused `addmm`) path, in-place changes inside the segment and by the caller, shared
//! weights, slices of one weight storage, `keep_graph`, double backward, float64,
//! `no_grad`, `preserve_rng_state(false)` (the generator after backward as without
//! checkpointing), a recompute whose layout leaves the fused path, and checkpoints and
//! checkpointed chains (`SequentialPlanner`, `model!`, `#[checkpointed(segments = auto)]`)
//! nested in a segment with a policy, whose calls must stay out of the enclosing segment's
//! cache in its forward and in its recompute alike. Each compares with the plain
//! computation bit for bit (double backward: to rounding, the documented limit) and
//! asserts the bytes kept. A recompute that calls one layer on same-shape inputs in
//! another order than forward cannot be told apart from forward; it is documented, not
//! tested.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ckpt::plan::{Objective, SequentialPlanner};
use ckpt::{CheckpointOptions, Policy, ShallowClone, checkpointed, model};
use common::{assert_all_equal, grads_and_output, params};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

static RNG: Mutex<()> = Mutex::new(());

/// The global generator, the memory meter and `live_segments` are process-wide: the
/// tests of this file take turns.
fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every policy a segment may have.
const POLICIES: [Policy; 4] = [
    Policy::RECOMPUTE_ALL,
    Policy::masks(),
    Policy::narrowing(),
    Policy::selective(),
];

/// Output, gradients (the variables of `vs` in name order, then the input) and the next
/// random draw, from seed 7.
fn step(vs: &nn::VarStore, x: &Tensor, f: &dyn Fn(&Tensor) -> Tensor) -> Vec<Tensor> {
    tch::manual_seed(7);
    let mut out = grads_and_output(vs, x, f);
    out.push(Tensor::rand([8], (Kind::Float, Device::Cpu)));
    out
}

/// [`common::kept_by`] from seed 7.
fn kept_by(x: &Tensor, f: impl FnOnce(&Tensor) -> Tensor) -> i64 {
    tch::manual_seed(7);
    common::kept_by(x, f)
}

/// `f` as one segment with `policy`, the variables of `vs` listed as its parameters.
fn ck<F>(
    policy: Policy,
    vs: &nn::VarStore,
    f: F,
) -> impl Fn(&Tensor) -> Tensor + Clone + Send + use<F>
where
    F: Fn(&Tensor) -> Tensor + Send + 'static,
{
    let f = Arc::new(Mutex::new(f));
    let params = Arc::new(Mutex::new(params(vs)));
    move |x: &Tensor| {
        let f = Arc::clone(&f);
        let listed: Vec<Tensor> = params
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.shallow_clone())
            .collect();
        let opts = CheckpointOptions::new()
            .policy(policy)
            .name("break27")
            .parameters(&listed);
        ckpt::checkpoint_with(
            &opts,
            move |x: Tensor| (*f.lock().unwrap())(&x),
            x.shallow_clone(),
        )
    }
}

/// Asserts that `f` as a segment under every policy gives the plain step; returns the
/// bytes `Policy::narrowing()` keeps beyond `Policy::masks()`.
fn compare<F>(what: &str, vs: &nn::VarStore, x: &Tensor, f: F) -> i64
where
    F: Fn(&Tensor) -> Tensor + Send + Clone + 'static,
{
    let plain = step(vs, x, &f);
    for policy in POLICIES {
        let got = step(vs, x, &ck(policy, vs, f.clone()));
        assert_all_equal(&format!("{what}: {policy:?} vs plain"), &got, &plain);
    }
    assert_eq!(ckpt::live_segments(), 0, "{what}: segments leaked");
    kept_by(x, ck(Policy::narrowing(), vs, f.clone())) - kept_by(x, ck(Policy::masks(), vs, f))
}

/// A `Linear` whose clones share its weights.
struct Lin(nn::Linear);

impl Clone for Lin {
    fn clone(&self) -> Self {
        Lin(self.0.shallow_clone())
    }
}

impl Lin {
    fn new(p: nn::Path, i: i64, o: i64) -> Lin {
        Lin(nn::linear(p, i, o, Default::default()))
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.0.forward(x)
    }
}

/// `down` 16 -> 4 (narrowing, with a bias or not), `up` 4 -> 16 (widening).
fn down_up(vs: &nn::VarStore, bias: bool) -> (Lin, Lin) {
    let cfg = nn::LinearConfig {
        bias,
        ..Default::default()
    };
    (
        Lin(nn::linear(vs.root() / "down", 16, 4, cfg)),
        Lin::new(vs.root() / "up", 4, 16),
    )
}

/// The tests' lock, seed `seed`, a new `VarStore` and its [`down_up`] layers.
fn setup(seed: i64, bias: bool) -> (MutexGuard<'static, ()>, nn::VarStore, Lin, Lin) {
    let guard = rng();
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let (d, u) = down_up(&vs, bias);
    (guard, vs, d, u)
}

fn randn(dims: &[i64]) -> Tensor {
    Tensor::randn(dims, (Kind::Float, Device::Cpu))
}

#[test]
fn a_linear_without_bias_keeps_nothing() {
    let (_g, vs, d, u) = setup(1, false);
    let x = randn(&[5, 16]);
    let kept = compare("no bias", &vs, &x, move |x| {
        u.forward(&d.forward(x).gelu("none").dropout(0.2, true))
    });
    assert_eq!(kept, 0);
}

#[test]
fn a_non_contiguous_3d_input_keeps_nothing() {
    let (_g, vs, d, u) = setup(2, true);
    let x = randn(&[3, 16, 5]);
    let kept = compare("non-contiguous 3-d", &vs, &x, move |x| {
        u.forward(&d.forward(&x.transpose(1, 2)).gelu("none"))
            .tanh()
    });
    assert_eq!(kept, 0, "off the fused path");
}

#[test]
fn a_non_contiguous_2d_input_is_kept() {
    let (_g, vs, d, u) = setup(3, true);
    let x = randn(&[16, 5]);
    let kept = compare("non-contiguous 2-d", &vs, &x, move |x| {
        u.forward(&d.forward(&x.tanh().tr()).gelu("none")).tanh()
    });
    assert_eq!(kept, 5 * 4 * 4, "down's [5, 4] float output");
}

#[test]
fn a_4d_input_is_kept_and_a_1d_one_is_not() {
    let (_g, vs, d, u) = setup(4, true);
    let f = move |x: &Tensor| {
        u.forward(&d.forward(&x.tanh()).gelu("none").dropout(0.3, true))
            .tanh()
    };
    assert_eq!(
        compare("4-d", &vs, &randn(&[2, 3, 5, 16]), f.clone()),
        2 * 3 * 5 * 4 * 4
    );
    assert_eq!(
        compare("1-d", &vs, &randn(&[16]), f),
        0,
        "a 1-d input is not fused"
    );
}

#[test]
fn the_same_linear_twice_keeps_two_outputs() {
    let (_g, vs, d, u) = setup(5, true);
    let kept = compare("twice", &vs, &randn(&[6, 16]), move |x| {
        let a = d.forward(x).gelu("none");
        let b = d.forward(&u.forward(&a).sin()).gelu("none");
        u.forward(&(a * b))
    });
    assert_eq!(kept, 2 * 6 * 4 * 4);
}

#[test]
fn a_kept_output_changed_in_place_inside_the_segment() {
    let (_g, vs, d, u) = setup(6, true);
    compare(
        "in place in the segment",
        &vs,
        &randn(&[2, 6, 16]),
        move |x| {
            let mut h = d.forward(&x.tanh());
            let _ = h.f_mul_(&Tensor::from(2.0f32)).unwrap();
            let _ = h.sigmoid_();
            u.forward(&h)
        },
    );
}

#[test]
fn a_kept_output_that_is_the_segment_output() {
    let (_g, vs, d, _) = setup(7, true);
    for dims in [vec![6, 16], vec![2, 6, 16]] {
        let d = d.clone();
        let rows: i64 = dims[..dims.len() - 1].iter().product();
        let kept = compare("segment output", &vs, &randn(&dims), move |x| {
            d.forward(&x.tanh())
        });
        // The output is a view of the kept tensor: no byte beyond the output itself.
        assert_eq!(kept, 0, "{dims:?}: {rows} rows kept as the output");
    }
}

/// The segment's output is a kept narrowing output, which the caller then changes in
/// place before backward; gradients of `x` and the parameters.
fn changed_by_the_caller(policy: Option<Policy>, dims: &[i64]) -> Result<Vec<Tensor>, String> {
    tch::manual_seed(9);
    let vs = nn::VarStore::new(Device::Cpu);
    let (d, _) = down_up(&vs, true);
    let x = randn(dims).set_requires_grad(true);
    let f = move |x: &Tensor| {
        let h = d.forward(&x.tanh());
        let t = h.tanh(); // tanh saves its result, so the plain graph allows h.mul_
        (h, t)
    };
    let (mut h, t) = match policy {
        None => f(&x),
        Some(p) => {
            let opts = CheckpointOptions::new()
                .policy(p)
                .name("changed by the caller")
                .parameters(&params(&vs));
            ckpt::f_checkpoint_with(&opts, move |x: Tensor| f(&x), x.shallow_clone())
                .map_err(|e| e.to_string())?
        }
    };
    let _ = h.f_mul_(&Tensor::from(3.0f32)).map_err(|e| e.to_string())?;
    let loss = (&h * &h).sum(Kind::Float) + (&t * &h.sin()).sum(Kind::Float);
    let mut wrt = params(&vs);
    wrt.push(x);
    Tensor::f_run_backward(&[loss], &wrt, false, false).map_err(|e| e.to_string())
}

#[test]
fn a_kept_segment_output_changed_in_place_by_the_caller() {
    let _g = rng();
    for dims in [&[6, 16][..], &[2, 6, 16]] {
        let plain = changed_by_the_caller(None, dims).expect("plain");
        for p in POLICIES {
            let got = changed_by_the_caller(Some(p), dims)
                .unwrap_or_else(|e| panic!("{dims:?} {p:?}: {e}"));
            assert_all_equal(
                &format!("changed by the caller {dims:?} {p:?}"),
                &got,
                &plain,
            );
        }
    }
}

/// Two calls of one narrowing layer; in the recompute the first one's input has another
/// layout (the same values, non-contiguous: off the fused path).
fn other_layout(vs: &nn::VarStore, d: &Lin, policy: Option<Policy>) -> Vec<Tensor> {
    let d = d.clone();
    let f = move |x: &Tensor| {
        let s = x.sin();
        let s = if ckpt::is_recomputing() {
            s.transpose(0, 1).contiguous().transpose(0, 1)
        } else {
            s
        };
        d.forward(&s) * 2.0 + d.forward(&x.cos()).exp()
    };
    let x = Tensor::from_slice(
        &(0..2 * 6 * 16)
            .map(|i| (i as f32 * 0.37).sin())
            .collect::<Vec<_>>(),
    )
    .view([2, 6, 16]);
    match policy {
        None => step(vs, &x, &f),
        Some(p) => step(vs, &x, &ck(p, vs, f)),
    }
}

#[test]
fn a_recompute_whose_call_leaves_the_fused_path() {
    let (_g, vs, d, _) = setup(11, true);
    let plain = other_layout(&vs, &d, None);
    for p in POLICIES {
        let got = other_layout(&vs, &d, Some(p));
        assert_all_equal(&format!("other layout {p:?}"), &got, &plain);
    }
}

#[test]
fn weights_shared_between_segments() {
    let (_g, vs, d, u) = setup(12, true);
    let seg = move |x: &Tensor| u.forward(&d.forward(x).gelu("none").dropout(0.1, true)) + x;
    let x = randn(&[5, 16]);
    let plain = step(&vs, &x, &|x| seg(&seg(x)));
    for p in POLICIES {
        let f = ck(p, &vs, seg.clone());
        let got = step(&vs, &x, &|x| f(&f(x)));
        assert_all_equal(&format!("shared weights {p:?}"), &got, &plain);
    }
}

#[test]
fn keep_graph_backward_three_times() {
    let (_g, vs, d, u) = setup(13, true);
    let f = move |x: &Tensor| {
        u.forward(&d.forward(x).gelu("none").dropout(0.2, true))
            .tanh()
    };
    let run = |seg: &dyn Fn(&Tensor) -> Tensor| {
        tch::manual_seed(3);
        let x = randn(&[5, 16]).set_requires_grad(true);
        let y = seg(&x);
        let loss = (&y * &y).sum(Kind::Float);
        let mut wrt = params(&vs);
        wrt.push(x);
        let mut all = Tensor::run_backward(&[&loss], &wrt, true, false);
        all.extend(Tensor::run_backward(&[&loss], &wrt, true, false));
        all.extend(Tensor::run_backward(&[&loss], &wrt, false, false));
        all
    };
    let plain = run(&f);
    for p in POLICIES {
        assert_all_equal(
            &format!("keep_graph {p:?}"),
            &run(&ck(p, &vs, f.clone())),
            &plain,
        );
        assert_eq!(ckpt::live_segments(), 0);
    }
}

#[test]
fn double_backward_first_order_bit_for_bit_second_to_rounding() {
    let (_g, vs, d, u) = setup(14, true);
    let f = move |x: &Tensor| u.forward(&d.forward(x).tanh()).tanh();
    let run = |seg: &dyn Fn(&Tensor) -> Tensor| {
        tch::manual_seed(3);
        let x = randn(&[5, 16]).set_requires_grad(true);
        let y = seg(&x);
        let loss = (&y * &y).sum(Kind::Float);
        let gx = Tensor::run_backward(&[&loss], &[&x], true, true).remove(0);
        let mut wrt = params(&vs);
        wrt.push(x.shallow_clone());
        let mut out = Tensor::run_backward(&[(&gx * &gx).sum(Kind::Float)], &wrt, false, false);
        out.push(gx.detach());
        out
    };
    let plain = run(&f);
    for p in POLICIES {
        let got = run(&ck(p, &vs, f.clone()));
        assert!(
            got.last().unwrap().equal(plain.last().unwrap()),
            "{p:?}: first order"
        );
        for (g, w) in got.iter().zip(&plain) {
            assert!(g.allclose(w, 1e-4, 1e-5, false), "{p:?}: second order");
        }
    }
}

#[test]
fn float64_outputs_are_kept_at_8_bytes_an_element() {
    let _g = rng();
    tch::manual_seed(15);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let (d, u) = down_up(&vs, true);
    vs.double();
    let x = Tensor::randn([2, 5, 16], (Kind::Double, Device::Cpu));
    let kept = compare("float64", &vs, &x, move |x| {
        u.forward(&d.forward(x).gelu("none").dropout(0.2, true))
            .tanh()
    });
    assert_eq!(kept, 2 * 5 * 4 * 8);
}

#[test]
fn under_no_grad_only_the_output_stays_alive() {
    let (_g, vs, d, u) = setup(16, true);
    let f = move |x: &Tensor| {
        u.forward(&d.forward(x).gelu("none").dropout(0.2, true))
            .tanh()
    };
    let x = randn(&[5, 16]);
    tch::manual_seed(1);
    let plain = tch::no_grad(|| f(&x));
    for p in POLICIES {
        let seg = ck(p, &vs, f.clone());
        tch::manual_seed(1);
        let before = ckpt::memory::current_bytes(Device::Cpu);
        let got = tch::no_grad(|| seg(&x));
        let after = ckpt::memory::current_bytes(Device::Cpu);
        assert!(got.equal(&plain), "{p:?}");
        assert!(!got.requires_grad());
        assert_eq!(ckpt::live_segments(), 0);
        assert_eq!(
            after - before,
            got.numel() as i64 * 4,
            "{p:?}: only the output alive"
        );
    }
}

#[test]
fn a_frozen_narrowing_weight() {
    let (_g, vs, d, u) = setup(17, true);
    let _ = d.0.ws.shallow_clone().set_requires_grad(false);
    let kept = compare("frozen", &vs, &randn(&[5, 16]), move |x| {
        u.forward(&d.forward(x).gelu("none")).tanh()
    });
    assert_eq!(kept, 5 * 4 * 4, "kept: the input's gradient needs it");
}

/// Two halves of one parameter's storage as the weights of two narrowing calls, called
/// in swapped order in the recompute (the same values either way).
#[test]
fn two_weights_on_one_storage_called_in_swapped_order() {
    let _g = rng();
    tch::manual_seed(19);
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().randn("w", &[8, 16], 0.0, 0.3);
    let bias = vs.root().zeros("b", &[4]);
    let calls = Arc::new(AtomicUsize::new(0));
    let f = {
        let calls = calls.clone();
        let (w, bias) = (Lin0(w.shallow_clone()), Lin0(bias.shallow_clone()));
        move |x: &Tensor| {
            let (w, bias) = (&w, &bias); // the whole `Lin0`s, which clone
            let (w1, w2) = (w.0.narrow(0, 0, 4), w.0.narrow(0, 4, 4));
            let (a, b) = if calls.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
                (x.linear(&w1, Some(&bias.0)), x.linear(&w2, Some(&bias.0)))
            } else {
                let b = x.linear(&w2, Some(&bias.0));
                (x.linear(&w1, Some(&bias.0)), b)
            };
            a.sin() * b.exp()
        }
    };
    let x = randn(&[5, 16]);
    let plain = step(&vs, &x, &f);
    for p in POLICIES {
        // Forward is call 0, the recompute call 1.
        calls.store(0, Ordering::SeqCst);
        assert_all_equal(
            &format!("one storage {p:?}"),
            &step(&vs, &x, &ck(p, &vs, f.clone())),
            &plain,
        );
    }
}

/// A tensor whose clones share it.
struct Lin0(Tensor);

impl Clone for Lin0 {
    fn clone(&self) -> Self {
        Lin0(self.0.shallow_clone())
    }
}

/// `inner` as a checkpoint with `inner_policy` inside a segment with `outer_policy`
/// around it: `outer(checkpoint(inner)(x))`.
fn nested<I, O>(
    vs: &nn::VarStore,
    outer_policy: Policy,
    inner_policy: Policy,
    inner: I,
    outer: O,
) -> impl Fn(&Tensor) -> Tensor + Clone + Send + use<I, O>
where
    I: Fn(&Tensor) -> Tensor + Send + Clone + 'static,
    O: Fn(&Tensor) -> Tensor + Send + Clone + 'static,
{
    let inner = ck(inner_policy, vs, inner);
    ck(outer_policy, vs, move |x: &Tensor| outer(&inner(x)))
}

/// Asserts that `outer(checkpoint(inner)(x))` as a segment gives the plain step for every
/// pair of outer and inner policies, leaking no segment.
fn compare_nested<I, O>(what: &str, vs: &nn::VarStore, x: &Tensor, inner: I, outer: O)
where
    I: Fn(&Tensor) -> Tensor + Send + Clone + 'static,
    O: Fn(&Tensor) -> Tensor + Send + Clone + 'static,
{
    let plain = step(vs, x, &{
        let (inner, outer) = (inner.clone(), outer.clone());
        move |x: &Tensor| outer(&inner(x))
    });
    for po in POLICIES {
        for pi in POLICIES {
            let f = nested(vs, po, pi, inner.clone(), outer.clone());
            let what = format!("{what}: outer {po:?}, inner {pi:?}");
            assert_all_equal(&what, &step(vs, x, &f), &plain);
            assert_eq!(ckpt::live_segments(), 0, "{what}");
        }
    }
}

#[test]
fn a_checkpoint_nested_in_a_policy_segment() {
    let (_g, vs, d, u) = setup(18, true);
    let other = Lin::new(vs.root() / "other", 16, 4);
    let x = randn(&[5, 16]);
    let inner = {
        let (d, u) = (d.clone(), u.clone());
        move |x: &Tensor| u.forward(&d.forward(x).gelu("none").dropout(0.2, true))
    };
    // The outer segment's own narrowing layer: the inner one's, or another of the same
    // shapes; with a dropout of its own or not.
    for (which, outer_lin) in [("shared", d.clone()), ("other", other)] {
        for dropout in [false, true] {
            let outer = {
                let l = outer_lin.clone();
                move |h: &Tensor| {
                    let y = l.forward(h);
                    if dropout {
                        y.dropout(0.5, true).sin()
                    } else {
                        y.sin()
                    }
                }
            };
            let what = format!("{which} outer layer, dropout {dropout}");
            compare_nested(&what, &vs, &x, inner.clone(), outer);
        }
    }
}

#[test]
fn a_nested_checkpoint_keeps_nothing_in_the_enclosing_segment() {
    let (_g, vs, d, u) = setup(23, true);
    let x = randn(&[3, 16]);
    let inner = {
        let (d, u) = (d.clone(), u.clone());
        move |x: &Tensor| u.forward(&d.forward(x).dropout(0.5, true)).tanh()
    };
    let outer = move |h: &Tensor| d.forward(h).sin();
    let by = |po| {
        kept_by(
            &x,
            nested(&vs, po, Policy::RECOMPUTE_ALL, inner.clone(), outer.clone()),
        )
    };
    // The outer segment keeps its own narrowing call's [3, 4] output and no mask: the
    // inner dropout's mask and the inner narrowing call are the inner segment's.
    assert_eq!(
        by(Policy::narrowing()) - by(Policy::RECOMPUTE_ALL),
        3 * 4 * 4
    );
    assert_eq!(by(Policy::masks()), by(Policy::RECOMPUTE_ALL));
}

#[test]
fn a_nested_checkpoint_with_dropouts_of_another_shape() {
    let _g = rng();
    tch::manual_seed(26);
    let vs = nn::VarStore::new(Device::Cpu);
    let a = Lin::new(vs.root() / "a", 8, 8);
    let b = Lin::new(vs.root() / "b", 8, 16);
    let x = randn(&[3, 8]);
    let inner = move |x: &Tensor| a.forward(x).dropout(0.5, true).tanh();
    let outer = move |h: &Tensor| b.forward(h).dropout(0.5, true).sin();
    compare_nested("dropouts of another shape", &vs, &x, inner, outer);
}

// Checkpointed chains nested in a policy segment. Under no grad (the enclosing segment's
// forward) a planned chain runs every stage inline; in the recompute (grad on) it runs
// the plan it cached: its checkpointed segments as segments of their own, the rest
// inline. The enclosing segment's policy must see neither.

/// `x + dropout(linear(x))`, every block of the same shapes (so a misplaced mask or kept
/// output would be used without a shape error).
#[derive(Debug, ShallowClone)]
struct Block {
    lin: nn::Linear,
}

impl Block {
    fn new(p: nn::Path) -> Block {
        Block {
            lin: nn::linear(p, 16, 16, Default::default()),
        }
    }
}

impl Module for Block {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + xs.apply(&self.lin).gelu("none").dropout(0.3, true)
    }
}

fn blocks(vs: &nn::VarStore, n: usize) -> Vec<Block> {
    (0..n)
        .map(|i| Block::new(vs.root() / format!("b{i}")))
        .collect()
}

fn plain_chain(blocks: &[Block], x: &Tensor) -> Tensor {
    blocks.iter().fold(x.shallow_clone(), |h, b| b.forward(&h))
}

/// A planner and its chain, shared by the closures of one test.
#[derive(Clone)]
struct Planner(Arc<Mutex<(SequentialPlanner, Vec<Block>)>>);

impl Planner {
    fn forward(&self, x: &Tensor) -> Tensor {
        let mut guard = self.0.lock().unwrap();
        let (planner, blocks) = &mut *guard;
        planner.forward(blocks, x)
    }
}

/// Asserts that a planned chain over `blocks`, `make()` giving a handle on it each time,
/// gives the plain chain's step run alone (the first call plans, with grad, and caches the
/// plan), that the plan cuts (`plan_segments`, asked after that call), and that it gives
/// the plain step again as a segment under every policy.
fn compare_planned_chain<F>(
    what: &str,
    vs: &nn::VarStore,
    x: &Tensor,
    blocks: &[Block],
    make: impl Fn() -> F,
    plan_segments: impl FnOnce() -> usize,
) where
    F: Fn(&Tensor) -> Tensor + Send + 'static,
{
    let plain = step(vs, x, &|x| plain_chain(blocks, x).tanh());
    let alone = make();
    let alone = step(vs, x, &|x| alone(x).tanh());
    assert_all_equal(&format!("{what} alone"), &alone, &plain);
    assert!(plan_segments() > 1, "{what}: the plan cuts the chain");
    for po in POLICIES {
        let chain = make();
        let f = ck(po, vs, move |x: &Tensor| chain(x).tanh());
        assert_all_equal(
            &format!("{what} in a {po:?} segment"),
            &step(vs, x, &f),
            &plain,
        );
    }
}

#[test]
fn a_planned_sequential_chain_nested_in_a_policy_segment() {
    let _g = rng();
    tch::manual_seed(31);
    let vs = nn::VarStore::new(Device::Cpu);
    let bs = blocks(&vs, 6);
    let x = randn(&[64, 16]);
    let planner = Planner(Arc::new(Mutex::new((
        SequentialPlanner::new(Objective::MinPeak),
        bs.iter().map(ShallowClone::shallow_clone).collect(),
    ))));
    let make = || {
        let p = planner.clone();
        move |x: &Tensor| p.forward(x)
    };
    let segments = || {
        let guard = planner.0.lock().unwrap();
        guard.0.plan_for(&x, None).expect("a plan").segments()
    };
    compare_planned_chain("planned chain", &vs, &x, &bs, make, segments);
}

model! {
    /// Six blocks cut by the planner.
    #[checkpointed(segments = auto)]
    struct Planned(p, n: usize) {
        blocks: [Block; n] = Block::new(p),
    }
}

#[test]
fn a_planned_model_nested_in_a_policy_segment() {
    let _g = rng();
    tch::manual_seed(32);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Planned::new(vs.root(), 6);
    let x = randn(&[64, 16]);
    let make = || {
        let m = m.shallow_clone();
        move |x: &Tensor| m.forward(x)
    };
    let segments = || m.plan_for(&x).expect("a plan").segments();
    compare_planned_chain("planned model", &vs, &x, &m.blocks, make, segments);
}

/// Six blocks as statements, cut by the planner.
#[derive(ShallowClone)]
struct Stack {
    b: Vec<Block>,
}

impl Stack {
    #[checkpointed(segments = auto)]
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.b[0].forward(x);
        let h = self.b[1].forward(&h);
        let h = self.b[2].forward(&h);
        let h = self.b[3].forward(&h);
        let h = self.b[4].forward(&h);
        self.b[5].forward(&h)
    }
}

#[test]
fn a_planned_checkpointed_function_nested_in_a_policy_segment() {
    let _g = rng();
    tch::manual_seed(33);
    let vs = nn::VarStore::new(Device::Cpu);
    let s = Stack { b: blocks(&vs, 6) };
    let x = randn(&[64, 16]);
    let make = || {
        let s = s.shallow_clone();
        move |x: &Tensor| s.forward(x)
    };
    // This binary's only `#[checkpointed]` function: the plan its first call made.
    let segments = || {
        let plans = ckpt::plan::function_plans();
        assert_eq!(plans.len(), 1, "one planned function");
        plans[0].plan.segments()
    };
    compare_planned_chain("planned function", &vs, &x, &s.b, make, segments);
}

/// Gradients (the variables, then the input), the output, a draw between forward and
/// backward and one after backward, for one step of `f` run plainly (`None`) or as a
/// segment with `policy` and `preserve_rng_state(false)`.
fn draws_without_preserved_rng(policy: Option<Policy>) -> Vec<Tensor> {
    let (_g, vs, d, u) = setup(12, true);
    let x = randn(&[6, 16]).set_requires_grad(true);
    let f = move |x: &Tensor| u.forward(&d.forward(x).dropout(0.5, true)).tanh();
    tch::manual_seed(5);
    let y = match policy {
        None => f(&x),
        Some(p) => {
            let opts = CheckpointOptions::new()
                .policy(p)
                .preserve_rng_state(false)
                .parameters(&params(&vs));
            ckpt::checkpoint_with(&opts, move |x: Tensor| f(&x), x.shallow_clone())
        }
    };
    let between = Tensor::rand([4], (Kind::Float, Device::Cpu));
    let mut wrt = params(&vs);
    wrt.push(x);
    let mut out = Tensor::run_backward(&[(&y * &y).sum(Kind::Float)], &wrt, false, false);
    out.push(y.detach());
    out.push(between);
    out.push(Tensor::rand([4], (Kind::Float, Device::Cpu)));
    out
}

/// Without `preserve_rng_state` a policy that keeps the masks replays them and leaves
/// the generator alone: the step equals plain's, the draw after backward included (it
/// had been the draw between forward and backward again: the replay rewound the
/// generator to where forward's dropout had left it).
#[test]
fn kept_masks_without_preserved_rng_leave_the_generator_alone() {
    let plain = draws_without_preserved_rng(None);
    for p in [Policy::masks(), Policy::narrowing(), Policy::selective()] {
        let got = draws_without_preserved_rng(Some(p));
        assert_all_equal(&format!("no preserved rng, {p:?}"), &got, &plain);
    }
}

/// Large contiguous float32 and float64 dropouts (several threads' chunks of the draw,
/// of the packing and of the scaled noise, with partial last bytes) under every policy
/// that keeps masks: output, gradients and the next draw equal plain's.
#[test]
fn large_kept_masks_match_plain() {
    let (_g, vs, _, _) = setup(27, true);
    let w = vs.root().randn("w", &[64, 4, 128, 129], 0.0, 1.0);
    let f = {
        let w = Lin0(w);
        move |x: &Tensor| {
            let w = &w;
            let h = (x * &w.0).dropout(0.1, true);
            let flat = h.view([-1]).narrow(0, 3, (1 << 20) + 5).dropout(0.5, true);
            let d = h.to_kind(Kind::Double).dropout(0.3, true);
            (&h * &h).sum(Kind::Float)
                + (&flat * &flat).sum(Kind::Float)
                + (&d * &d).sum(Kind::Double).to_kind(Kind::Float)
        }
    };
    let x = randn(&[64, 4, 128, 129]);
    let plain = step(&vs, &x, &f);
    for p in [Policy::masks(), Policy::narrowing(), Policy::selective()] {
        assert_all_equal(
            &format!("large masks {p:?}"),
            &step(&vs, &x, &ck(p, &vs, f.clone())),
            &plain,
        );
    }
}
