//! break28: adversarial tests of `ckpt::compact_dropout` and of the policies' bit-mask
//! dropout (commits 3312f77, 7bf5faf; a breaker's pass). The gradient-layout cases (a
//! broadcast incoming gradient on a non-contiguous input) failed before the node laid its
//! rebuilt noise out as forward's. Every test compares against libtorch's own dropout
//! on the same seed, bit for bit (the bit patterns of the floats, so -0.0 and NaN count).
//! The global generator (and `set_num_threads`) is shared by the test threads: every test
//! takes the lock.

mod common;

use std::sync::{Mutex, MutexGuard};

use ckpt::{CheckpointOptions, Policy};
use common::kept_by;
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, TchError, Tensor};

static RNG: Mutex<()> = Mutex::new(());

fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

const CPU: Device = Device::Cpu;

/// A differentiable op applied after (or around) a dropout.
type Op = Box<dyn Fn(&Tensor) -> Tensor>;

/// An op that may fail (plain and compact must then fail alike).
type FallibleOp = Box<dyn Fn(&Tensor) -> Result<Tensor, TchError>>;

/// The tensor's bit patterns (an integer view of the same width), contiguous.
fn bits_of(t: &Tensor) -> Tensor {
    let t = t.detach().contiguous();
    match t.kind() {
        Kind::Half | Kind::BFloat16 => t.view_dtype(Kind::Int16),
        Kind::Float => t.view_dtype(Kind::Int),
        Kind::Double => t.view_dtype(Kind::Int64),
        _ => t,
    }
}

fn same_bits(what: &str, a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len(), "{what}: different counts");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.defined(), y.defined(), "{what}[{i}]: one is undefined");
        if !x.defined() {
            continue;
        }
        assert_eq!(x.kind(), y.kind(), "{what}[{i}]: kinds");
        assert_eq!(x.size(), y.size(), "{what}[{i}]: sizes");
        let (bx, by) = (bits_of(x), bits_of(y));
        if !bx.equal(&by) {
            let n = bx.ne_tensor(&by).sum(Kind::Int64).int64_value(&[]);
            panic!("{what}[{i}] differs in {n} of {} elements", x.numel());
        }
    }
}

/// Asserts that `run(Some(policy), compact)` equals `plain` bit for bit for every policy of
/// `policies`, with compact dropout off and on.
fn every_policy_equals_plain(
    what: &str,
    plain: &[Tensor],
    policies: &[Policy],
    run: impl Fn(Policy, bool) -> Vec<Tensor>,
) {
    for &policy in policies {
        for compact in [false, true] {
            same_bits(
                &format!("{what} {policy:?} compact {compact}"),
                plain,
                &run(policy, compact),
            );
        }
    }
}

fn same_result(what: &str, a: &Result<Vec<Tensor>, String>, b: &Result<Vec<Tensor>, String>) {
    match (a, b) {
        (Ok(a), Ok(b)) => same_bits(what, a, b),
        (Err(_), Err(_)) => {}
        (Ok(_), Err(e)) => panic!("{what}: plain works, compact fails: {e}"),
        (Err(e), Ok(_)) => panic!("{what}: plain fails ({e}), compact works"),
    }
}

type Pre<'a> = &'a dyn Fn(&Tensor) -> Tensor;
type Post<'a> = &'a dyn Fn(&Tensor) -> Result<Tensor, TchError>;

/// Output of the dropout, output after `post`, first-order gradient, optionally the
/// second-order gradient, and the next draw; run from seed 11.
fn outcome(
    x0: &Tensor,
    p: f64,
    compact: bool,
    pre: Pre,
    post: Post,
    order2: bool,
) -> Result<Vec<Tensor>, String> {
    let e = |e: TchError| e.to_string();
    let x = x0.detach().set_requires_grad(true);
    tch::manual_seed(11);
    let src = pre(&x);
    let y = if compact {
        ckpt::compact_dropout(|| src.f_dropout(p, true))
    } else {
        src.f_dropout(p, true)
    }
    .map_err(e)?;
    let y_out = y.detach().copy();
    let y2 = post(&y).map_err(e)?;
    let w = y2.rand_like();
    let loss = (&y2 * &y2 * &w).sum(y2.kind());
    let g = Tensor::f_run_backward(&[&loss], &[&x], order2, order2).map_err(e)?;
    let rg = Tensor::from(i64::from(g[0].requires_grad()));
    let mut out = vec![y_out, y2.detach().copy(), g[0].detach().copy(), rg];
    // (run_backward on a tensor without history crashes in tch itself)
    if order2 && g[0].requires_grad() {
        let l2 = (&g[0] * &g[0]).sum(g[0].kind());
        let gg = Tensor::f_run_backward(&[&l2], &[&x], false, false).map_err(e)?;
        out.push(gg[0].shallow_clone());
    }
    out.push(Tensor::rand([4], (Kind::Float, CPU)));
    Ok(out)
}

fn compare(what: &str, x0: &Tensor, p: f64, pre: Pre, post: Post, order2: bool) {
    let plain = outcome(x0, p, false, pre, post, order2);
    let compact = outcome(x0, p, true, pre, post, order2);
    same_result(what, &plain, &compact);
}

fn id(x: &Tensor) -> Tensor {
    x.shallow_clone()
}

fn ok(y: &Tensor) -> Result<Tensor, TchError> {
    Ok(y.shallow_clone())
}

const KINDS: [Kind; 4] = [Kind::Float, Kind::Double, Kind::Half, Kind::BFloat16];

#[test]
fn odd_sizes_all_dtypes() {
    let _rng = rng();
    tch::manual_seed(0);
    let sizes: Vec<Vec<i64>> = vec![
        vec![],
        vec![0],
        vec![3, 0],
        vec![1],
        vec![7],
        vec![8],
        vec![9],
        vec![15],
        vec![17],
        vec![3, 5, 7],
        vec![(1 << 20) + 3],
    ];
    for kind in KINDS {
        for s in &sizes {
            let x = Tensor::randn(s.as_slice(), (kind, CPU));
            for p in [0.1, 0.5] {
                let order2 = s.iter().product::<i64>() < 100_000;
                compare(&format!("{kind:?} {s:?} p={p}"), &x, p, &id, &ok, order2);
            }
        }
    }
}

#[test]
fn non_contiguous_inputs() {
    let _rng = rng();
    tch::manual_seed(1);
    for kind in KINDS {
        let base = Tensor::randn([6, 10, 12], (kind, CPU));
        let cases: Vec<(&str, Op)> = vec![
            ("transpose", Box::new(|x: &Tensor| x.transpose(0, 2))),
            ("permute", Box::new(|x: &Tensor| x.permute([1, 2, 0]))),
            ("step slice", Box::new(|x: &Tensor| x.slice(2, 1, 12, 3))),
            ("narrow offset", Box::new(|x: &Tensor| x.narrow(0, 2, 3))),
            ("select", Box::new(|x: &Tensor| x.select(1, 4))),
            (
                "expand",
                Box::new(|x: &Tensor| x.select(0, 1).narrow(0, 0, 1).expand([9, 10, 12], false)),
            ),
            (
                "channels last",
                Box::new(|x: &Tensor| {
                    x.view([2, 3, 10, 12])
                        .permute([0, 2, 3, 1])
                        .contiguous()
                        .permute([0, 3, 1, 2])
                }),
            ),
            ("flip", Box::new(|x: &Tensor| x.flip([1]))),
            ("diagonal", Box::new(|x: &Tensor| x.diagonal(0, 1, 2))),
            (
                "unsqueeze",
                Box::new(|x: &Tensor| x.unsqueeze(1).transpose(1, 3)),
            ),
        ];
        for (what, pre) in &cases {
            for p in [0.2, 0.7] {
                // The dropout input a view of the leaf.
                compare(
                    &format!("{kind:?} view {what} p={p}"),
                    &base,
                    p,
                    pre.as_ref(),
                    &ok,
                    true,
                );
                // The leaf itself non-contiguous.
                let leaf = pre(&base);
                compare(
                    &format!("{kind:?} leaf {what} p={p}"),
                    &leaf,
                    p,
                    &id,
                    &ok,
                    true,
                );
            }
        }
    }
}

#[test]
fn extreme_probabilities() {
    let _rng = rng();
    tch::manual_seed(2);
    for kind in KINDS {
        let x = Tensor::randn([257], (kind, CPU));
        for p in [
            1e-300,
            1e-12,
            1e-7,
            0.001,
            1.0 / 3.0,
            0.999,
            0.9999999,
            1.0 - 1e-12,
            1.0 - 1e-16,
            f64::MIN_POSITIVE,
            1.0 - f64::EPSILON / 2.0,
        ] {
            compare(&format!("{kind:?} p={p:e}"), &x, p, &id, &ok, true);
        }
        // Out of range: plain errors, compact must as well.
        for p in [-0.5, 1.5, f64::NAN, f64::INFINITY, 0.0, 1.0, -0.0] {
            compare(&format!("{kind:?} bad p={p}"), &x, p, &id, &ok, false);
        }
    }
}

#[test]
fn special_values() {
    let _rng = rng();
    let vals = [
        0.0_f64,
        -0.0,
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-310,
        -1e-310,
        1e-40,
        -1e-40,
        65504.0,
        1e38,
        -3.5,
        f64::MAX,
    ];
    let x = Tensor::from_slice(&vals).repeat([23]);
    for kind in KINDS {
        let x = x.to_kind(kind);
        for p in [0.3, 0.9] {
            compare(&format!("{kind:?} specials p={p}"), &x, p, &id, &ok, true);
            compare(
                &format!("{kind:?} specials transposed p={p}"),
                &x.view([23, 14]),
                p,
                &|x| x.tr(),
                &ok,
                true,
            );
        }
    }
}

#[test]
fn in_place_ops_on_the_output() {
    let _rng = rng();
    tch::manual_seed(3);
    let posts: Vec<(&str, FallibleOp)> = vec![
        ("relu_", Box::new(|y: &Tensor| y.shallow_clone().f_relu_())),
        (
            "mul_ 2",
            Box::new(|y: &Tensor| y.shallow_clone().f_mul_scalar_(2.0)),
        ),
        (
            "sigmoid_",
            Box::new(|y: &Tensor| y.shallow_clone().f_sigmoid_()),
        ),
        (
            "mul_ by itself",
            Box::new(|y: &Tensor| {
                let z = y.copy();
                y.shallow_clone().f_mul_(&z)
            }),
        ),
        (
            "narrow mul_",
            Box::new(|y: &Tensor| {
                let _ = y.narrow(0, 1, 2).f_mul_scalar_(3.0)?;
                Ok(y.shallow_clone())
            }),
        ),
        (
            "dropout_",
            Box::new(|y: &Tensor| y.shallow_clone().f_dropout_(0.4, true)),
        ),
        (
            "dropout again",
            Box::new(|y: &Tensor| y.f_dropout(0.4, true)),
        ),
        (
            "y + y.dropout",
            Box::new(|y: &Tensor| Ok(y + y.dropout(0.25, true))),
        ),
        ("zero_", Box::new(|y: &Tensor| y.shallow_clone().f_zero_())),
    ];
    for kind in KINDS {
        let x = Tensor::randn([5, 13], (kind, CPU));
        for (what, post) in &posts {
            compare(
                &format!("{kind:?} {what}"),
                &x,
                0.3,
                &id,
                post.as_ref(),
                true,
            );
            compare(
                &format!("{kind:?} t {what}"),
                &x.tr(),
                0.3,
                &id,
                post.as_ref(),
                true,
            );
        }
    }
}

#[test]
fn in_place_on_the_input_after_dropout() {
    let _rng = rng();
    tch::manual_seed(4);
    for kind in KINDS {
        let x0 = Tensor::randn([4, 9], (kind, CPU));
        let run = |compact: bool| -> Result<Vec<Tensor>, String> {
            let x = x0.detach().set_requires_grad(true);
            tch::manual_seed(5);
            let mut src = &x * 1.5;
            let y = if compact {
                ckpt::compact_dropout(|| src.dropout(0.4, true))
            } else {
                src.dropout(0.4, true)
            };
            let _ = src.f_mul_scalar_(2.0).map_err(|e| e.to_string())?;
            let loss = (&y * &src).sum(kind);
            let g =
                Tensor::f_run_backward(&[&loss], &[&x], false, false).map_err(|e| e.to_string())?;
            Ok(vec![y.detach(), g[0].shallow_clone()])
        };
        same_result(&format!("{kind:?}"), &run(false), &run(true));
        // In place on a view of the leaf used as the input: an error both ways.
        let run2 = |compact: bool| -> Result<Vec<Tensor>, String> {
            let x = x0.detach().set_requires_grad(true);
            tch::manual_seed(5);
            let v = x.narrow(0, 1, 2);
            let y = if compact {
                ckpt::compact_dropout(|| v.dropout(0.4, true))
            } else {
                v.dropout(0.4, true)
            };
            let two = Tensor::full([1], 2.0, (kind, CPU));
            let _ = v.shallow_clone().f_mul_(&two).map_err(|e| e.to_string())?;
            let g = Tensor::f_run_backward(&[&y.sum(kind)], &[&x], false, false)
                .map_err(|e| e.to_string())?;
            Ok(vec![y.detach(), g[0].shallow_clone()])
        };
        same_result(&format!("{kind:?} leaf view"), &run2(false), &run2(true));
    }
}

#[test]
fn keep_graph_many_times_then_an_error() {
    let _rng = rng();
    for kind in KINDS {
        let x0 = Tensor::randn([37], (kind, CPU));
        let run = |compact: bool| {
            let x = x0.detach().set_requires_grad(true);
            tch::manual_seed(6);
            let y = if compact {
                ckpt::compact_dropout(|| x.dropout(0.35, true))
            } else {
                x.dropout(0.35, true)
            };
            let loss = (&y * &y).sum(kind);
            let mut out = vec![];
            for _ in 0..3 {
                out.push(Tensor::run_backward(&[&loss], &[&x], true, false)[0].copy());
            }
            let g = Tensor::run_backward(&[&loss], &[&x], true, true);
            let gg = Tensor::run_backward(&[(&g[0] * &g[0]).sum(kind)], &[&x], true, false);
            out.push(g[0].detach());
            out.push(gg[0].shallow_clone());
            out.push(Tensor::run_backward(&[&loss], &[&x], false, false)[0].copy());
            let again = Tensor::f_run_backward(&[&loss], &[&x], false, false);
            (out, again.map(|_| ()).map_err(|e| e.to_string()))
        };
        let (plain, plain_again) = run(false);
        let (compact, compact_again) = run(true);
        same_bits(&format!("{kind:?}"), &plain, &compact);
        assert!(plain_again.is_err(), "plain allows a third backward");
        let err = compact_again.expect_err("compact allowed a backward after the graph was freed");
        assert!(err.contains("second time"), "{err}");
    }
}

#[test]
fn a_second_backward_through_the_graph_with_loss_backward() {
    let _rng = rng();
    let x = Tensor::randn([64], (Kind::Float, CPU)).set_requires_grad(true);
    let y = ckpt::compact_dropout(|| x.dropout(0.5, true));
    let loss = y.sum(Kind::Float);
    loss.f_backward().unwrap();
    let r = loss.f_backward();
    assert!(r.is_err(), "second backward without keep_graph succeeded");
    // Still usable afterwards.
    let y = ckpt::compact_dropout(|| x.dropout(0.5, true));
    y.sum(Kind::Float).f_backward().unwrap();
}

#[test]
fn backward_on_another_thread_and_scope_boundaries() {
    let _rng = rng();
    let x0 = Tensor::randn([33, 65], (Kind::Float, CPU));
    let plain = {
        let x = x0.detach().set_requires_grad(true);
        tch::manual_seed(7);
        let y = x.dropout(0.3, true);
        let w = y.rand_like();
        let g = Tensor::run_backward(&[(&y * &w).sum(Kind::Float)], &[&x], false, false);
        vec![y.detach(), g[0].shallow_clone()]
    };
    // Forward in the scope, backward on another thread.
    let x = x0.detach().set_requires_grad(true);
    tch::manual_seed(7);
    let y = ckpt::compact_dropout(|| x.dropout(0.3, true));
    let w = y.rand_like();
    let (xs, ys, ws) = (x.shallow_clone(), y.shallow_clone(), w.shallow_clone());
    let g = std::thread::spawn(move || {
        Tensor::run_backward(&[(&ys * &ws).sum(Kind::Float)], &[&xs], false, false)[0]
            .shallow_clone()
    })
    .join()
    .unwrap();
    same_bits("backward on another thread", &plain, &[y.detach(), g]);
    // Forward in the scope, backward outside; forward outside, backward inside.
    let x = x0.detach().set_requires_grad(true);
    tch::manual_seed(7);
    let y = ckpt::compact_dropout(|| x.dropout(0.3, true));
    let w = y.rand_like();
    let g = Tensor::run_backward(&[(&y * &w).sum(Kind::Float)], &[&x], false, false);
    same_bits(
        "backward outside",
        &plain,
        &[y.detach(), g[0].shallow_clone()],
    );
    let x = x0.detach().set_requires_grad(true);
    tch::manual_seed(7);
    let y = x.dropout(0.3, true);
    let w = y.rand_like();
    let g = ckpt::compact_dropout(|| {
        Tensor::run_backward(&[(&y * &w).sum(Kind::Float)], &[&x], false, false)
    });
    same_bits(
        "backward inside",
        &plain,
        &[y.detach(), g[0].shallow_clone()],
    );
    // Dropout inside a backward (create_graph) within the scope: nothing to test but no crash.
}

#[test]
fn bytes_held_for_odd_layouts_and_dtypes() {
    let _rng = rng();
    tch::manual_seed(8);
    for kind in KINDS {
        let es = match kind {
            Kind::Half | Kind::BFloat16 => 2,
            Kind::Float => 4,
            _ => 8,
        };
        let base = Tensor::randn([6, 10, 12], (kind, CPU));
        let leaves: Vec<(&str, Tensor)> = vec![
            ("contiguous", base.copy()),
            ("one", Tensor::randn([1], (kind, CPU))),
            ("seven", Tensor::randn([7], (kind, CPU))),
            ("nine", Tensor::randn([9], (kind, CPU))),
            ("scalar", Tensor::randn([], (kind, CPU))),
            ("transposed", base.transpose(0, 2)),
            ("step slice", base.slice(2, 1, 12, 3)),
            (
                "expanded",
                base.select(0, 0).narrow(0, 0, 1).expand([9, 10, 12], false),
            ),
            (
                "channels last",
                base.view([2, 3, 10, 12])
                    .permute([0, 2, 3, 1])
                    .contiguous()
                    .permute([0, 3, 1, 2]),
            ),
        ];
        for (what, x) in &leaves {
            let n = x.numel() as i64;
            let plain = kept_by(x, |x| x.dropout(0.25, true));
            let compact = kept_by(x, |x| ckpt::compact_dropout(|| x.dropout(0.25, true)));
            assert_eq!(
                compact,
                n * es + (n + 7) / 8,
                "{kind:?} {what}: compact holds (plain {plain})"
            );
            assert_eq!(plain, 2 * n * es, "{kind:?} {what}: plain holds");
        }
    }
}

#[test]
fn complex_and_other_calls_left_alone() {
    let _rng = rng();
    let x = Tensor::randn([40], (Kind::ComplexFloat, CPU));
    let run = |compact: bool| -> Result<Vec<Tensor>, String> {
        let x = x.detach().set_requires_grad(true);
        tch::manual_seed(9);
        let y = if compact {
            ckpt::compact_dropout(|| x.f_dropout(0.5, true))
        } else {
            x.f_dropout(0.5, true)
        }
        .map_err(|e| e.to_string())?;
        let g = Tensor::f_run_backward(&[&y.abs().sum(Kind::Float)], &[&x], false, false)
            .map_err(|e| e.to_string())?;
        Ok(vec![y.detach().view_as_real(), g[0].view_as_real()])
    };
    same_result("complex", &run(false), &run(true));
}

/// Two threads with the scope and two without, concurrently: each checks its own
/// output and gradient against the composite's formula for the mask it got.
#[test]
fn concurrent_threads_with_and_without_the_scope() {
    let _rng = rng();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..15 {
                    let kind = KINDS[(t + i) % 4];
                    let n = if i % 3 == 0 {
                        (1 << 18) + 5
                    } else {
                        1000 + i as i64
                    };
                    let x = (Tensor::rand([n], (kind, CPU)) + 1.0).set_requires_grad(true);
                    let p = 0.3;
                    let compact = t % 2 == 0;
                    let y = if compact {
                        ckpt::compact_dropout(|| x.dropout(p, true))
                    } else {
                        x.dropout(p, true)
                    };
                    let noise = y.detach().ne(0.0).to_kind(kind).g_div_scalar_(1.0 - p);
                    let want = x.detach() * &noise;
                    let w = Tensor::rand([n], (kind, CPU));
                    let g = Tensor::run_backward(&[(&y * &w).sum(kind)], &[&x], false, false);
                    same_bits(
                        &format!("thread {t} iter {i} {kind:?}"),
                        &[y.detach(), g[0].shallow_clone()],
                        &[want, &w * &noise],
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn thread_counts_give_the_same_bits() {
    let _rng = rng();
    let before = tch::get_num_threads();
    let x = Tensor::randn([(1 << 21) + 3], (Kind::Float, CPU));
    let xd = Tensor::randn([(1 << 20) + 11], (Kind::Double, CPU));
    let xt = Tensor::randn([1025, 1031], (Kind::Float, CPU)).tr();
    let mut all = vec![];
    for threads in [1, 2, 4] {
        tch::set_num_threads(threads);
        for (what, x) in [("f32", &x), ("f64", &xd), ("t", &xt)] {
            let plain = outcome(x, 0.4, false, &id, &ok, false);
            let compact = outcome(x, 0.4, true, &id, &ok, false);
            same_result(&format!("{what} threads {threads}"), &plain, &compact);
            all.push((what, compact.unwrap()));
        }
    }
    tch::set_num_threads(before);
    for (what, r) in &all[3..] {
        let first = &all.iter().find(|(w, _)| w == what).unwrap().1;
        same_bits(&format!("{what} across thread counts"), first, r);
    }
}

/// Guards dropped in the reverse order of their creation leave the setting off; dropped
/// out of order, the last one dropped restores what it found (documented on
/// `compact_dropout_guard`, as tch's grad-mode guards).
#[test]
fn guards_restore_what_they_found() {
    let _rng = rng();
    let x = Tensor::randn([64], (Kind::Float, CPU));
    let plain_bytes = 2 * 4 * 64;
    let compact_bytes = 4 * 64 + 8;
    {
        let g1 = ckpt::compact_dropout_guard();
        let g2 = ckpt::compact_dropout_guard();
        drop(g2);
        assert_eq!(
            kept_by(&x, |x| x.dropout(0.1, true)),
            compact_bytes,
            "outer still on"
        );
        drop(g1);
    }
    assert_eq!(
        kept_by(&x, |x| x.dropout(0.1, true)),
        plain_bytes,
        "in order: off"
    );
    {
        let g1 = ckpt::compact_dropout_guard();
        let g2 = ckpt::compact_dropout_guard();
        drop(g1);
        drop(g2);
    }
    let after = kept_by(&x, |x| x.dropout(0.1, true));
    // The setting is this test thread's, which ends here.
    assert_eq!(
        after, compact_bytes,
        "out of order: the inner guard's 'on' restored last"
    );
}

#[test]
fn modules_and_func() {
    let _rng = rng();
    tch::manual_seed(12);
    let vs = nn::VarStore::new(CPU);
    let seq = nn::seq_t()
        .add(nn::linear(vs.root() / "a", 20, 30, Default::default()))
        .add_fn_t(|x, train| x.dropout(0.3, train))
        .add_fn(|x| x.gelu("none"))
        .add(nn::linear(vs.root() / "b", 30, 20, Default::default()))
        .add_fn_t(|x, train| x.dropout(0.1, train));
    let f = nn::func(|x| x.dropout(0.6, true));
    let x0 = Tensor::randn([7, 20], (Kind::Float, CPU));
    let run = |compact: bool| {
        tch::manual_seed(13);
        let x = x0.detach().set_requires_grad(true);
        let fwd = || f.forward(&seq.forward_t(&x, true));
        let y = if compact {
            ckpt::compact_dropout(fwd)
        } else {
            fwd()
        };
        let mut wrt = common::params(&vs);
        wrt.push(x.shallow_clone());
        let mut out = Tensor::run_backward(&[(&y * &y).sum(Kind::Float)], &wrt, false, false);
        out.push(y.detach());
        out.push(Tensor::rand([3], (Kind::Float, CPU)));
        out
    };
    same_bits("seq_t + func", &run(false), &run(true));
}

#[test]
fn autocast_bfloat16() {
    let _rng = rng();
    tch::manual_seed(14);
    let vs = nn::VarStore::new(CPU);
    let l1 = nn::linear(vs.root() / "a", 24, 40, Default::default());
    let l2 = nn::linear(vs.root() / "b", 40, 24, Default::default());
    let x0 = Tensor::randn([9, 24], (Kind::Float, CPU));
    let run = |compact: bool| {
        tch::manual_seed(15);
        let x = x0.detach().set_requires_grad(true);
        let fwd = || {
            ckpt::amp::autocast(CPU, Kind::BFloat16, || {
                let h = l1.forward(&x).dropout(0.3, true);
                l2.forward(&h.tr().contiguous().tr()).dropout(0.2, true)
            })
        };
        let y = if compact {
            ckpt::compact_dropout(fwd)
        } else {
            fwd()
        };
        let mut wrt = common::params(&vs);
        wrt.push(x.shallow_clone());
        let mut out = Tensor::run_backward(&[(&y * &y).sum(Kind::Float)], &wrt, false, false);
        out.push(y.detach());
        out
    };
    same_bits("autocast bf16", &run(false), &run(true));
}

// ----------------------------------------------------------------------------------
// Policies

fn block(w1: &Tensor, w2: &Tensor, x: &Tensor, p: f64) -> Tensor {
    // linear + relu + dropout, a transposed dropout, a dropout in f64 and back.
    let h = x.linear(w1, None::<&Tensor>).relu().dropout(p, true);
    let h = h.tr().dropout(p / 2.0, true).tr();
    let h = h
        .to_kind(Kind::Double)
        .dropout(0.5, true)
        .to_kind(Kind::Float);
    h.linear(w2, None::<&Tensor>).dropout(p, true)
}

#[derive(Clone, Copy, Debug)]
enum Where {
    Plain,
    Outside,
    Inside,
    ForwardInside,
    BackwardInside,
}

/// One run of the policy matrix; each argument is one of its axes.
#[allow(clippy::too_many_arguments)]
fn policy_run(
    w1: &Tensor,
    w2: &Tensor,
    x0: &Tensor,
    p: f64,
    policy: Option<Policy>,
    place: Where,
    nested: bool,
    twice: bool,
) -> Vec<Tensor> {
    tch::manual_seed(21);
    let x = x0.detach().set_requires_grad(true);
    let wrt = [w1.shallow_clone(), w2.shallow_clone(), x.shallow_clone()];
    let fwd = || -> Tensor {
        match policy {
            None => block(w1, w2, &x, p),
            Some(policy) => {
                let opts = CheckpointOptions::new().policy(policy).parameters([w1, w2]);
                let (a, b) = (w1.shallow_clone(), w2.shallow_clone());
                if nested {
                    ckpt::checkpoint_with(
                        &opts,
                        move |x: Tensor| {
                            let inner =
                                CheckpointOptions::new().policy(policy).parameters([&a, &b]);
                            let (a2, b2) = (a.shallow_clone(), b.shallow_clone());
                            let h: Tensor = ckpt::checkpoint_with(
                                &inner,
                                move |x: Tensor| block(&a2, &b2, &x, p),
                                x.dropout(0.15, true),
                            );
                            block(&a, &b, &h.dropout(0.2, true), p)
                        },
                        x.shallow_clone(),
                    )
                } else {
                    ckpt::checkpoint_with(
                        &opts,
                        move |x: Tensor| block(&a, &b, &x, p),
                        x.shallow_clone(),
                    )
                }
            }
        }
    };
    let fwd = || -> Tensor {
        if policy.is_none() && nested {
            let h = block(w1, w2, &x.dropout(0.15, true), p);
            block(w1, w2, &h.dropout(0.2, true), p)
        } else {
            fwd()
        }
    };
    let y = match place {
        Where::Inside | Where::ForwardInside => ckpt::compact_dropout(fwd),
        _ => fwd(),
    };
    let loss = (&y * &y).sum(Kind::Float);
    let back = |keep: bool| Tensor::run_backward(&[&loss], &wrt, keep, false);
    let mut out = match place {
        Where::Inside | Where::BackwardInside => ckpt::compact_dropout(|| {
            let mut o = vec![];
            if twice {
                o.extend(back(true));
            }
            o.extend(back(false));
            o
        }),
        _ => {
            let mut o = vec![];
            if twice {
                o.extend(back(true));
            }
            o.extend(back(false));
            o
        }
    };
    out.push(y.detach());
    out.push(Tensor::rand([4], (Kind::Float, CPU)));
    out
}

#[test]
fn policies_equal_plain_everywhere() {
    let _rng = rng();
    tch::manual_seed(20);
    let w1 = (Tensor::randn([48, 24], (Kind::Float, CPU)) * 0.2).set_requires_grad(true);
    let w2 = (Tensor::randn([24, 48], (Kind::Float, CPU)) * 0.2).set_requires_grad(true);
    for (rows, p) in [(9_i64, 0.3), (1, 0.5), (301, 0.999), (7, 1e-9)] {
        let x0 = Tensor::randn([rows, 24], (Kind::Float, CPU));
        for nested in [false, true] {
            for twice in [false, true] {
                let plain = policy_run(&w1, &w2, &x0, p, None, Where::Plain, nested, twice);
                for policy in [
                    Policy::RECOMPUTE_ALL,
                    Policy::masks(),
                    Policy::narrowing(),
                    Policy::selective(),
                ] {
                    for place in [
                        Where::Outside,
                        Where::Inside,
                        Where::ForwardInside,
                        Where::BackwardInside,
                    ] {
                        let got = policy_run(&w1, &w2, &x0, p, Some(policy), place, nested, twice);
                        same_bits(
                            &format!(
                                "rows {rows} p {p} nested {nested} twice {twice} {policy:?} {place:?}"
                            ),
                            &plain,
                            &got,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn policy_dropout_dtypes_and_layouts() {
    let _rng = rng();
    tch::manual_seed(22);
    for kind in KINDS {
        let w = (Tensor::randn([16, 16], (kind, CPU)) * 0.3).set_requires_grad(true);
        let x0 = Tensor::randn([5, 16], (kind, CPU));
        let f = |w: &Tensor, x: &Tensor| -> Tensor {
            let h = x.matmul(w).dropout(0.4, true);
            let h = h.tr().dropout(0.3, true).tr().matmul(w);
            h.unsqueeze(0).expand([3, 5, 16], false).dropout(0.25, true)
        };
        let run = |policy: Option<Policy>, compact: bool| {
            tch::manual_seed(23);
            let x = x0.detach().set_requires_grad(true);
            let fwd = || match policy {
                None => f(&w, &x),
                Some(policy) => {
                    let opts = CheckpointOptions::new().policy(policy).parameters([&w]);
                    let w2 = w.shallow_clone();
                    ckpt::checkpoint_with(&opts, move |x: Tensor| f(&w2, &x), x.shallow_clone())
                }
            };
            let y: Tensor = if compact {
                ckpt::compact_dropout(fwd)
            } else {
                fwd()
            };
            let wrt = [w.shallow_clone(), x.shallow_clone()];
            let go = || Tensor::run_backward(&[(&y * &y).sum(kind)], &wrt, false, false);
            let mut out = if compact {
                ckpt::compact_dropout(go)
            } else {
                go()
            };
            out.push(y.detach());
            out.push(Tensor::rand([4], (Kind::Float, CPU)));
            out
        };
        let plain = run(None, false);
        every_policy_equals_plain(
            &format!("{kind:?}"),
            &plain,
            &[Policy::RECOMPUTE_ALL, Policy::masks(), Policy::selective()],
            |policy, compact| run(Some(policy), compact),
        );
    }
}

#[test]
fn masks_without_preserve_rng_state_equal_plain() {
    let _rng = rng();
    tch::manual_seed(24);
    let w = (Tensor::randn([32, 32], (Kind::Float, CPU)) * 0.2).set_requires_grad(true);
    let x0 = Tensor::randn([11, 32], (Kind::Float, CPU));
    let f = |w: &Tensor, x: &Tensor| {
        x.matmul(w)
            .relu()
            .dropout(0.3, true)
            .matmul(w)
            .dropout(0.1, true)
    };
    let run = |opts: Option<CheckpointOptions>, compact: bool| {
        tch::manual_seed(25);
        let x = x0.detach().set_requires_grad(true);
        let y: Tensor = match &opts {
            None => f(&w, &x),
            Some(o) => {
                let w2 = w.shallow_clone();
                let o = o.clone().parameters([&w]);
                ckpt::checkpoint_with(&o, move |x: Tensor| f(&w2, &x), x.shallow_clone())
            }
        };
        let wrt = [w.shallow_clone(), x.shallow_clone()];
        let go = || Tensor::run_backward(&[(&y * &y).sum(Kind::Float)], &wrt, false, false);
        let mut out = if compact {
            ckpt::compact_dropout(go)
        } else {
            go()
        };
        out.push(y.detach());
        out.push(Tensor::rand([4], (Kind::Float, CPU)));
        out
    };
    let plain = run(None, false);
    every_policy_equals_plain(
        "without preserve_rng_state",
        &plain,
        &[Policy::masks(), Policy::selective()],
        |policy, compact| {
            let o = CheckpointOptions::new()
                .policy(policy)
                .preserve_rng_state(false);
            run(Some(o), compact)
        },
    );
}

#[test]
fn float8_inputs_behave_as_plain() {
    let _rng = rng();
    for kind in [Kind::Float8e5m2, Kind::Float8e4m3fn] {
        let x0 = Tensor::randn([33], (Kind::Float, CPU)).to_kind(kind);
        let run = |compact: bool| -> Result<Vec<Tensor>, String> {
            let x = x0
                .detach()
                .f_set_requires_grad(true)
                .map_err(|e| e.to_string())?;
            tch::manual_seed(31);
            let y = if compact {
                ckpt::compact_dropout(|| x.f_dropout(0.5, true))
            } else {
                x.f_dropout(0.5, true)
            }
            .map_err(|e| e.to_string())?;
            let y32 = y.f_to_kind(Kind::Float).map_err(|e| e.to_string())?;
            let g = Tensor::f_run_backward(&[&y32.sum(Kind::Float)], &[&x], false, false)
                .map_err(|e| e.to_string())?;
            Ok(vec![y32.detach(), g[0].to_kind(Kind::Float)])
        };
        let (a, b) = (run(false), run(true));
        eprintln!(
            "{kind:?}: plain {:?} compact {:?}",
            a.as_ref().err(),
            b.as_ref().err()
        );
        same_result(&format!("{kind:?}"), &a, &b);
    }
}

/// Second and third order, with the upstream weight requiring grad too.
#[test]
fn higher_order_through_the_upstream_gradient() {
    let _rng = rng();
    for kind in [Kind::Float, Kind::Double, Kind::BFloat16] {
        tch::manual_seed(32);
        let x0 = Tensor::randn([7, 19], (kind, CPU));
        let w0 = Tensor::randn([19, 7], (kind, CPU));
        let run = |compact: bool| {
            let x = x0.detach().set_requires_grad(true);
            let w = w0.detach().set_requires_grad(true);
            tch::manual_seed(33);
            let y = if compact {
                ckpt::compact_dropout(|| x.dropout(0.45, true))
            } else {
                x.dropout(0.45, true)
            };
            let z = (&y * &w.tr()).sum(kind) + (&y * &y * &y).sum(kind);
            let g = Tensor::run_backward(&[&z], &[&x, &w], true, true);
            let h = Tensor::run_backward(&[(&g[0] * &g[0]).sum(kind)], &[&x, &w], true, true);
            let k = Tensor::run_backward(
                &[(&h[0] * &h[0] * &h[1].tr()).sum(kind)],
                &[&x, &w],
                false,
                false,
            );
            vec![
                g[0].detach(),
                g[1].detach(),
                h[0].detach(),
                h[1].detach(),
                k[0].shallow_clone(),
                k[1].shallow_clone(),
            ]
        };
        same_bits(&format!("{kind:?}"), &run(false), &run(true));
    }
}

#[test]
fn policy_outputs_changed_in_place_and_autocast() {
    let _rng = rng();
    tch::manual_seed(34);
    let w = (Tensor::randn([24, 24], (Kind::Float, CPU)) * 0.2).set_requires_grad(true);
    let b = Tensor::zeros([24], (Kind::Float, CPU)).set_requires_grad(true);
    let x0 = Tensor::randn([6, 24], (Kind::Float, CPU));
    let f = |w: &Tensor, b: &Tensor, x: &Tensor| x.linear(w, Some(b)).dropout(0.3, true);
    for amp in [false, true] {
        let run = |policy: Option<Policy>, compact: bool| {
            tch::manual_seed(35);
            let x = x0.detach().set_requires_grad(true);
            let fwd = || {
                let inner = || match policy {
                    None => f(&w, &b, &x),
                    Some(policy) => {
                        let opts = CheckpointOptions::new().policy(policy).parameters([&w, &b]);
                        let (w2, b2) = (w.shallow_clone(), b.shallow_clone());
                        ckpt::checkpoint_with(
                            &opts,
                            move |x: Tensor| f(&w2, &b2, &x),
                            x.shallow_clone(),
                        )
                    }
                };
                if amp {
                    ckpt::amp::autocast(CPU, Kind::BFloat16, inner)
                } else {
                    inner()
                }
            };
            let y: Tensor = if compact {
                ckpt::compact_dropout(fwd)
            } else {
                fwd()
            };
            let y = y.to_kind(Kind::Float);
            let mut y2 = y.shallow_clone();
            let _ = y2.f_mul_scalar_(3.0).unwrap();
            let _ = y2.relu_();
            let wrt = [w.shallow_clone(), b.shallow_clone(), x.shallow_clone()];
            let go = || Tensor::run_backward(&[(&y2 * &y2).sum(Kind::Float)], &wrt, false, false);
            let mut out = if compact {
                ckpt::compact_dropout(go)
            } else {
                go()
            };
            out.push(y2.detach());
            out.push(Tensor::rand([4], (Kind::Float, CPU)));
            out
        };
        let plain = run(None, false);
        every_policy_equals_plain(
            &format!("amp {amp}"),
            &plain,
            &[
                Policy::RECOMPUTE_ALL,
                Policy::masks(),
                Policy::narrowing(),
                Policy::selective(),
            ],
            |policy, compact| run(Some(policy), compact),
        );
    }
}

/// Incoming gradients in other layouts than the output's (transposed, expanded, from an
/// index or a strided view).
#[test]
fn incoming_gradients_in_odd_layouts() {
    let _rng = rng();
    tch::manual_seed(40);
    let posts: Vec<(&str, FallibleOp)> = vec![
        (
            "tr matmul",
            Box::new(|y: &Tensor| {
                let m = Tensor::ones([y.size()[0], 3], (y.kind(), CPU));
                y.tr().f_matmul(&m)
            }),
        ),
        (
            "expand",
            Box::new(|y: &Tensor| {
                Ok(y.unsqueeze(0)
                    .expand([4, y.size()[0], y.size()[1]], false)
                    .sum_dim_intlist([0_i64].as_slice(), false, y.kind()))
            }),
        ),
        (
            "index_select",
            Box::new(|y: &Tensor| y.f_index_select(1, &Tensor::from_slice(&[0_i64, 2, 2, 5]))),
        ),
        (
            "as_strided",
            Box::new(|y: &Tensor| y.f_as_strided([3, 4], [2, 3], None::<i64>)),
        ),
        (
            "permute back",
            Box::new(|y: &Tensor| Ok(y.tr().contiguous().tr())),
        ),
        ("sum", Box::new(|y: &Tensor| Ok(y.sum(y.kind())))),
    ];
    for kind in KINDS {
        let x = Tensor::randn([9, 13], (kind, CPU));
        for (what, post) in &posts {
            compare(
                &format!("{kind:?} {what}"),
                &x,
                0.35,
                &id,
                post.as_ref(),
                true,
            );
            compare(
                &format!("{kind:?} t {what}"),
                &x.tr(),
                0.35,
                &id,
                post.as_ref(),
                true,
            );
        }
    }
}

/// First order: a transposed dropout input and an expanded incoming gradient (`y.sum()`),
/// then ops upstream whose backward reduces (a broadcast bias, a matmul). Plain's
/// gradient for the input is laid out as its noise (transposed); compact's as
/// `empty_like` of the expanded gradient (contiguous), so the reductions upstream may
/// add in another order.
#[test]
fn first_order_upstream_of_a_transposed_dropout_with_an_expanded_gradient() {
    let _rng = rng();
    tch::manual_seed(41);
    let (m, k, n) = (37_i64, 53_i64, 29_i64);
    let a0 = Tensor::randn([m, k], (Kind::Float, CPU));
    let w0 = Tensor::randn([k, n], (Kind::Float, CPU));
    let b0 = Tensor::randn([n], (Kind::Float, CPU));
    let s0 = Tensor::randn([n, m], (Kind::Float, CPU));
    let run = |compact: bool| {
        let a = a0.detach().set_requires_grad(true);
        let w = w0.detach().set_requires_grad(true);
        let b = b0.detach().set_requires_grad(true);
        let s = s0.detach().set_requires_grad(true);
        tch::manual_seed(42);
        let h = a.mm(&w) + &b;
        let x = h.tr() * &s;
        let y = if compact {
            ckpt::compact_dropout(|| x.dropout(0.3, true))
        } else {
            x.dropout(0.3, true)
        };
        let mut out = Tensor::run_backward(&[y.sum(Kind::Float)], &[&a, &w, &b, &s], false, false);
        out.push(y.detach());
        out
    };
    same_bits("grads of a, w, b, s; output", &run(false), &run(true));
}

/// The gradient a dropout passes back has the layout plain's `grad * noise` has.
#[test]
fn gradient_layout_equals_plain() {
    let _rng = rng();
    let x0 = Tensor::randn([5, 8], (Kind::Float, CPU)).tr();
    let run = |compact: bool| {
        let x = x0.detach().set_requires_grad(true);
        tch::manual_seed(43);
        let y = if compact {
            ckpt::compact_dropout(|| x.dropout(0.3, true))
        } else {
            x.dropout(0.3, true)
        };
        let g = Tensor::run_backward(&[y.sum(Kind::Float)], &[&x], false, false);
        (g[0].stride(), g[0].shallow_clone())
    };
    let (ps, pg) = run(false);
    let (cs, cg) = run(true);
    same_bits("values", &[pg], &[cg]);
    assert_eq!(ps, cs, "strides of the gradient (plain vs compact)");
}

/// The same under `Policy::masks()`: the recompute's replayed dropout passes back a
/// gradient laid out otherwise than plain's and full recompute's.
#[test]
fn masks_policy_upstream_of_a_transposed_dropout_with_an_expanded_gradient() {
    let _rng = rng();
    tch::manual_seed(44);
    let (m, k, n) = (37_i64, 53_i64, 29_i64);
    let a0 = Tensor::randn([m, k], (Kind::Float, CPU));
    let w = Tensor::randn([k, n], (Kind::Float, CPU)).set_requires_grad(true);
    let b = Tensor::randn([n], (Kind::Float, CPU)).set_requires_grad(true);
    let f = |w: &Tensor, b: &Tensor, a: &Tensor| (a.mm(w) + b).tr().dropout(0.3, true);
    let run = |policy: Option<Policy>| {
        let a = a0.detach().set_requires_grad(true);
        tch::manual_seed(45);
        let y: Tensor = match policy {
            None => f(&w, &b, &a),
            Some(policy) => {
                let opts = CheckpointOptions::new().policy(policy).parameters([&w, &b]);
                let (w2, b2) = (w.shallow_clone(), b.shallow_clone());
                ckpt::checkpoint_with(&opts, move |a: Tensor| f(&w2, &b2, &a), a.shallow_clone())
            }
        };
        let mut out = Tensor::run_backward(&[y.sum(Kind::Float)], &[&a, &w, &b], false, false);
        out.push(y.detach());
        out
    };
    let plain = run(None);
    same_bits("full recompute", &plain, &run(Some(Policy::RECOMPUTE_ALL)));
    for policy in [Policy::masks(), Policy::narrowing(), Policy::selective()] {
        same_bits(&format!("{policy:?}"), &plain, &run(Some(policy)));
    }
}

/// Forward outputs and gradients (incoming `rand_like`, then `sum`) laid out as plain's.
#[test]
fn output_and_gradient_strides_over_layouts() {
    let _rng = rng();
    tch::manual_seed(46);
    let base = Tensor::randn([6, 10, 12], (Kind::Float, CPU));
    let leaves: Vec<(&str, Tensor)> = vec![
        ("contiguous", base.copy()),
        ("transposed", base.transpose(0, 2)),
        ("permuted", base.permute([1, 2, 0])),
        ("step slice", base.slice(2, 1, 12, 3)),
        (
            "expanded",
            base.select(0, 0).narrow(0, 0, 1).expand([9, 10, 12], false),
        ),
        (
            "channels last",
            base.view([2, 3, 10, 12])
                .permute([0, 2, 3, 1])
                .contiguous()
                .permute([0, 3, 1, 2]),
        ),
    ];
    let mut bad = vec![];
    for (what, leaf) in &leaves {
        for loss_kind in ["rand_like", "sum"] {
            let run = |compact: bool| {
                let x = leaf.detach().set_requires_grad(true);
                tch::manual_seed(47);
                let y = if compact {
                    ckpt::compact_dropout(|| x.dropout(0.3, true))
                } else {
                    x.dropout(0.3, true)
                };
                let loss = if loss_kind == "sum" {
                    y.sum(Kind::Float)
                } else {
                    (&y * y.rand_like()).sum(Kind::Float)
                };
                let g = Tensor::run_backward(&[&loss], &[&x], false, false);
                (y.stride(), g[0].stride())
            };
            let (p, c) = (run(false), run(true));
            if p != c {
                bad.push(format!("{what} / {loss_kind}: plain {p:?} compact {c:?}"));
            }
        }
    }
    assert!(bad.is_empty(), "strides differ:\n{}", bad.join("\n"));
}
