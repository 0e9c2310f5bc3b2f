//! Adversarial use of the C boundary (issue 13 item 5): panics and errors of user code in
//! every place the runtime calls it, odd panic payloads and messages, nesting, threads,
//! and graph lifetimes. Each case ends in a `CkptError` (or a panic) that carries the
//! message, never an abort or a hang, and no segment leaks.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ckpt::{CheckpointOptions, CkptError};
use tch::{Device, Kind, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn x() -> Tensor {
    Tensor::from_slice(&[0.5f32, -1.0, 2.0, 3.0, -0.25, 1.5])
        .view([2, 3])
        .set_requires_grad(true)
}

/// The gradient of `sum(sin(x))` with respect to `x`, without checkpointing.
fn plain_grad() -> Tensor {
    let x = x();
    x.sin().sum(Kind::Float).backward();
    x.grad()
}

/// Calls counted from 0.
fn counter() -> (Arc<AtomicUsize>, impl Fn() -> usize + Send + Sync + 'static) {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    (n, move || m.fetch_add(1, Ordering::SeqCst))
}

fn panicked_in_forward(r: Result<Tensor, CkptError>) -> (String, String) {
    match r {
        Err(CkptError::ClosurePanicked {
            segment,
            recompute: false,
            message,
        }) => (segment, message),
        other => panic!("expected ClosurePanicked in forward, got {other:?}"),
    }
}

/// A closure that runs `sin` in forward and panics with `payload()` in the recompute.
fn panics_on_recompute<P: std::any::Any + Send + 'static>(
    payload: impl Fn() -> P + Send + 'static,
) -> impl Fn(Tensor) -> Tensor + Send + 'static {
    move |x: Tensor| {
        if ckpt::is_recomputing() {
            std::panic::panic_any(payload())
        }
        x.sin()
    }
}

fn backward_error(y: &Tensor) -> String {
    y.sum(Kind::Float).f_backward().unwrap_err().to_string()
}

#[test]
fn a_non_string_payload_in_forward_and_in_recompute_is_named_as_such() {
    let _g = serial();
    let base = ckpt::live_segments();
    let r = ckpt::f_checkpoint(|_: Tensor| -> Tensor { std::panic::panic_any(42u32) }, x());
    let (_, message) = panicked_in_forward(r);
    assert_eq!(message, "panic payload is not a string");

    let opts = CheckpointOptions::new().name("odd-payload");
    let y: Tensor = ckpt::checkpoint_with(&opts, panics_on_recompute(|| vec![1u8, 2]), x());
    let err = backward_error(&y);
    assert!(
        err.contains(
            "checkpoint `odd-payload`: the closure panicked during recompute: \
             panic payload is not a string"
        ),
        "{err}"
    );
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_very_long_panic_message_arrives_whole() {
    let _g = serial();
    let long: String = (0..200_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let l = long.clone();
    let r = ckpt::f_checkpoint(move |_: Tensor| -> Tensor { panic!("{l}") }, x());
    let (_, message) = panicked_in_forward(r);
    assert_eq!(message, long);

    let l = long.clone();
    let opts = CheckpointOptions::new().name("long");
    let y: Tensor = ckpt::checkpoint_with(&opts, panics_on_recompute(move || l.clone()), x());
    let err = backward_error(&y);
    assert!(
        err.contains(&format!("during recompute: {long}")),
        "{}",
        err.len()
    );
}

#[test]
fn non_ascii_and_control_characters_in_messages_and_names_survive() {
    let _g = serial();
    let odd = "π ≠ 3 — 🦀 \u{FFFD} tab\there\nnewline \u{7f} end";
    let r = ckpt::f_checkpoint(move |_: Tensor| -> Tensor { panic!("{odd}") }, x());
    let (_, message) = panicked_in_forward(r);
    assert_eq!(message, odd);

    let opts = CheckpointOptions::new().name("séгмент 🦀");
    let y: Tensor = ckpt::checkpoint_with(&opts, panics_on_recompute(move || odd.to_owned()), x());
    let err = backward_error(&y);
    assert!(
        err.contains(&format!(
            "checkpoint `séгмент 🦀`: the closure panicked during recompute: {odd}"
        )),
        "{err}"
    );
}

#[test]
fn a_nul_byte_in_a_recompute_panic_message_does_not_cut_it() {
    let _g = serial();
    let y: Tensor = ckpt::checkpoint(panics_on_recompute(|| "before\0after".to_owned()), x());
    let err = backward_error(&y);
    assert!(err.contains("before"), "{err:?}");
    assert!(err.contains("after"), "{err:?}");
}

#[test]
fn a_nul_byte_in_a_segment_name_does_not_cut_it() {
    let _g = serial();
    let opts = CheckpointOptions::new().name("front\0back");
    let y: Tensor = ckpt::checkpoint_with(&opts, panics_on_recompute(|| "boom"), x());
    let err = backward_error(&y);
    // The NUL crosses C++ written as `\0` (C strings would end there).
    assert!(err.contains("front\\0back"), "{err:?}");
    assert!(err.contains("boom"), "{err:?}");
}

#[test]
fn a_forward_that_returns_an_undefined_tensor_is_an_error() {
    let _g = serial();
    let base = ckpt::live_segments();
    let r: Result<Tensor, CkptError> = ckpt::f_checkpoint(|_: Tensor| Tensor::new(), x());
    let err = r.expect_err("an undefined output").to_string();
    assert!(err.contains("undefined"), "{err}");
    assert_eq!(ckpt::live_segments(), base);
}

struct Bomb(Arc<AtomicUsize>);

impl Drop for Bomb {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("dropping the capture panics");
    }
}

#[test]
fn a_panicking_drop_of_a_capture_freed_by_the_graph_neither_aborts_nor_leaks() {
    let _g = serial();
    let base = ckpt::live_segments();
    let dropped = Arc::new(AtomicUsize::new(0));
    let b = Bomb(dropped.clone());
    let xs = x();
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| {
            let _keep = &b;
            x.sin()
        },
        xs.shallow_clone(),
    );
    y.sum(Kind::Float).backward();
    assert!(xs.grad().equal(&plain_grad()));
    // The graph frees the closure (here or at `drop(y)`); its panic is dropped, since
    // nobody is there to receive it.
    drop(y);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_panicking_drop_of_a_capture_after_a_failed_forward_is_not_the_error() {
    let _g = serial();
    let base = ckpt::live_segments();
    let dropped = Arc::new(AtomicUsize::new(0));
    let b = Bomb(dropped.clone());
    let r = ckpt::f_checkpoint(
        move |_: Tensor| -> Tensor {
            let _keep = &b;
            panic!("forward fails")
        },
        x(),
    );
    let (_, message) = panicked_in_forward(r);
    assert_eq!(message, "forward fails");
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_panicking_drop_of_a_capture_under_no_grad_is_f_checkpoints_error() {
    let _g = serial();
    let dropped = Arc::new(AtomicUsize::new(0));
    let b = Bomb(dropped.clone());
    let r = catch_unwind(AssertUnwindSafe(|| {
        tch::no_grad(|| {
            ckpt::f_checkpoint(
                move |x: Tensor| {
                    let _keep = &b;
                    x.sin()
                },
                x(),
            )
        })
    }));
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    let r = r.expect("f_checkpoint returns, it does not unwind");
    let (_, message) = panicked_in_forward(r);
    assert_eq!(message, "dropping the capture panics");
}

#[test]
fn a_nested_checkpoint_that_panics_in_forward_is_the_outer_error_with_both_names() {
    let _g = serial();
    let base = ckpt::live_segments();
    let outer = CheckpointOptions::new().name("outer");
    let r = ckpt::f_checkpoint_with(
        &outer,
        |x: Tensor| {
            let inner = CheckpointOptions::new().name("inner");
            ckpt::checkpoint_with(&inner, |_: Tensor| -> Tensor { panic!("deep") }, x)
        },
        x(),
    );
    let (segment, message) = panicked_in_forward(r);
    assert_eq!(segment, "outer");
    assert!(message.contains("checkpoint `inner`"), "{message}");
    assert!(message.contains("deep"), "{message}");
    assert_eq!(ckpt::live_segments(), base);
    assert!(!ckpt::is_recomputing());
}

#[test]
fn a_nested_checkpoint_that_panics_in_its_recompute_names_the_inner_segment() {
    let _g = serial();
    let base = ckpt::live_segments();
    let outer = CheckpointOptions::new().name("outer");
    let y: Tensor = ckpt::checkpoint_with(
        &outer,
        |x: Tensor| {
            let inner = CheckpointOptions::new().name("inner");
            ckpt::checkpoint_with(&inner, panics_on_recompute(|| "inner recompute"), x)
        },
        x(),
    );
    // `is_recomputing()` is true in the inner forward that the outer recompute runs, so
    // the panic comes from there: an inner forward error inside the outer recompute.
    let err = backward_error(&y);
    assert!(
        err.contains(
            "checkpoint `outer`: the closure panicked during recompute: \
             checkpoint `inner`: the closure panicked: inner recompute"
        ),
        "{err}"
    );
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
    assert!(!ckpt::is_recomputing());

    // The inner closure's calls: 0 outer forward, 1 outer recompute, 2 its own recompute.
    let (_, call) = counter();
    let call = Arc::new(call);
    let y: Tensor = ckpt::checkpoint_with(
        &outer,
        move |x: Tensor| {
            let inner = CheckpointOptions::new().name("inner");
            let call = call.clone();
            ckpt::checkpoint_with(
                &inner,
                move |x: Tensor| {
                    if call() == 2 {
                        panic!("inner's own recompute");
                    }
                    x.sin()
                },
                x,
            )
        },
        x(),
    );
    let err = backward_error(&y);
    assert!(
        err.contains(
            "checkpoint `inner`: the closure panicked during recompute: inner's own recompute"
        ),
        "{err}"
    );
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
    assert!(!ckpt::is_recomputing());
}

#[test]
fn a_panic_in_the_nested_forward_run_by_the_outer_recompute_is_an_error() {
    let _g = serial();
    let base = ckpt::live_segments();
    let outer = CheckpointOptions::new().name("outer");
    let y: Tensor = ckpt::checkpoint_with(
        &outer,
        |x: Tensor| {
            // The inner forward runs again in the outer recompute; panic there.
            let recomputing = ckpt::is_recomputing();
            ckpt::checkpoint(
                move |x: Tensor| {
                    assert!(!recomputing, "inner forward during outer recompute");
                    x.sin()
                },
                x,
            )
        },
        x(),
    );
    let err = backward_error(&y);
    assert!(
        err.contains("inner forward during outer recompute"),
        "{err}"
    );
    assert!(err.contains("`outer`"), "{err}");
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
    assert!(!ckpt::is_recomputing());
}

#[test]
fn checkpoint_inside_catch_unwind_panics_with_the_message_and_leaves_state_clean() {
    let _g = serial();
    let base = ckpt::live_segments();
    let payload = catch_unwind(AssertUnwindSafe(|| {
        let opts = CheckpointOptions::new().name("caught");
        let _: Tensor = ckpt::checkpoint_with(&opts, |_: Tensor| -> Tensor { panic!("boom") }, x());
    }))
    .expect_err("checkpoint re-raises the panic");
    let message = payload
        .downcast_ref::<String>()
        .expect("a String payload")
        .clone();
    assert!(
        message.contains("checkpoint `caught`: the closure panicked: boom"),
        "{message}"
    );
    // f_checkpoint inside catch_unwind: returns, does not unwind.
    let r = catch_unwind(AssertUnwindSafe(|| {
        ckpt::f_checkpoint(|_: Tensor| -> Tensor { panic!("boom") }, x())
    }));
    assert!(
        matches!(r, Ok(Err(CkptError::ClosurePanicked { .. }))),
        "{r:?}"
    );
    // Grad mode and the recompute flag are as before; a following checkpoint is exact.
    assert!(!ckpt::is_recomputing());
    let xs = x();
    let y: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), xs.shallow_clone());
    assert!(y.requires_grad());
    y.sum(Kind::Float).backward();
    assert!(xs.grad().equal(&plain_grad()));
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_backward_retried_after_a_failed_recompute_with_the_graph_kept_is_exact() {
    let _g = serial();
    let base = ckpt::live_segments();
    let (_, call) = counter();
    let xs = x();
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| {
            // Forward is call 0, the first recompute call 1: it panics; later ones work.
            if call() == 1 {
                panic!("only once");
            }
            x.sin()
        },
        xs.shallow_clone(),
    );
    let loss = y.sum(Kind::Float);
    let first = Tensor::f_run_backward(&[&loss], &[&xs], true, false);
    assert!(
        first.as_ref().is_err_and(|e| e
            .to_string()
            .contains("panicked during recompute: only once")),
        "{first:?}"
    );
    let retry = Tensor::f_run_backward(&[&loss], &[&xs], false, false).expect("the retry");
    assert!(retry[0].equal(&plain_grad()), "{}", retry[0]);
    drop((loss, y));
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn two_backwards_with_keep_graph_give_the_same_gradient() {
    let _g = serial();
    let base = ckpt::live_segments();
    let xs = x();
    let y: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), xs.shallow_clone());
    let loss = y.sum(Kind::Float);
    let g1 = Tensor::run_backward(&[&loss], &[&xs], true, false);
    let g2 = Tensor::run_backward(&[&loss], &[&xs], false, false);
    let expected = plain_grad();
    assert!(g1[0].equal(&expected), "{} vs {}", g1[0], expected);
    assert!(g2[0].equal(&expected), "{} vs {}", g2[0], expected);
    // The third is libtorch's error, naming the segment.
    let err = loss.f_backward().unwrap_err().to_string();
    assert!(
        err.contains("backward through the graph a second time"),
        "{err}"
    );
    drop((loss, y));
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn dropping_the_input_before_backward_and_the_graph_without_backward() {
    let _g = serial();
    let base = ckpt::live_segments();
    // The caller keeps no handle on the input (moved in, the only one); the stash keeps
    // it, and the captured weight's gradient is exact.
    let w = x();
    let wc = w.shallow_clone();
    let y: Tensor = ckpt::checkpoint(move |x: Tensor| (x * &wc).sin(), x().detach());
    y.sum(Kind::Float).backward();
    let w2 = x();
    (x().detach() * &w2).sin().sum(Kind::Float).backward();
    assert!(w.grad().equal(&w2.grad()));
    drop(y);

    let ys: Vec<Tensor> = (0..8)
        .map(|_| ckpt::checkpoint(|x: Tensor| x.sin(), x()))
        .collect();
    assert_eq!(ckpt::live_segments(), base + 8);
    drop(ys);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn failures_on_one_thread_do_not_disturb_a_checkpoint_on_another() {
    let _g = serial();
    let base = ckpt::live_segments();
    let expected = plain_grad();
    let good = std::thread::spawn(move || {
        for _ in 0..200 {
            let xs = x();
            let y: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), xs.shallow_clone());
            y.sum(Kind::Float).backward();
            assert!(xs.grad().equal(&expected));
            assert!(!ckpt::is_recomputing());
        }
    });
    let bad = std::thread::spawn(|| {
        for i in 0..200 {
            let name = format!("bad-{i}");
            let opts = CheckpointOptions::new().name(name.clone());
            if i % 2 == 0 {
                let r =
                    ckpt::f_checkpoint_with(&opts, |_: Tensor| -> Tensor { panic!("fwd") }, x());
                let (segment, message) = panicked_in_forward(r);
                assert_eq!((segment.as_str(), message.as_str()), (name.as_str(), "fwd"));
            } else {
                let y: Tensor = ckpt::checkpoint_with(&opts, panics_on_recompute(|| "rec"), x());
                let err = backward_error(&y);
                assert!(
                    err.contains(&format!("`{name}`")) && err.contains("rec"),
                    "{err}"
                );
            }
        }
    });
    good.join().expect("the good thread");
    bad.join().expect("the bad thread");
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_libtorch_error_only_in_the_recompute_is_clear_and_has_no_cpp_backtrace() {
    let _g = serial();
    let opts = CheckpointOptions::new().name("mm");
    let y: Tensor = ckpt::checkpoint_with(
        &opts,
        |x: Tensor| {
            if ckpt::is_recomputing() {
                x.matmul(&x)
            } else {
                x.sin()
            }
        },
        x(),
    );
    let err = backward_error(&y);
    assert!(err.contains("checkpoint `mm`"), "{err}");
    assert!(!err.contains("frame #"), "{err}");
}

#[test]
fn an_option_output_that_disappears_on_recompute_is_a_count_error() {
    let _g = serial();
    let base = ckpt::live_segments();
    let opts = CheckpointOptions::new().name("vanishing");
    let y: Option<Tensor> = ckpt::checkpoint_with(
        &opts,
        |x: Tensor| (!ckpt::is_recomputing()).then(|| x.sin()),
        x(),
    );
    let y = y.expect("forward returns Some");
    let err = backward_error(&y);
    assert!(err.contains("checkpoint `vanishing`"), "{err}");
    assert!(
        err.contains("recompute returned 0 tensors, forward returned 1"),
        "{err}"
    );
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_recompute_run_under_no_grad_by_the_closure_is_an_error_not_a_missing_gradient() {
    let _g = serial();
    let base = ckpt::live_segments();
    let xs = x();
    let opts = CheckpointOptions::new().name("gradless");
    let y: Tensor = ckpt::checkpoint_with(
        &opts,
        |x: Tensor| {
            if ckpt::is_recomputing() {
                tch::no_grad(|| x.sin())
            } else {
                x.sin()
            }
        },
        xs.shallow_clone(),
    );
    let err = y
        .sum(Kind::Float)
        .f_backward()
        .expect_err("a recompute without a graph must not pass for a gradient")
        .to_string();
    assert!(
        err.contains("checkpoint `gradless`: output 0 receives a gradient"),
        "{err}"
    );
    assert!(
        err.contains("but its recompute does not require grad"),
        "{err}"
    );
    assert!(
        err.contains("ran aten::sin with grad mode off on a tensor that requires grad"),
        "{err}"
    );
    assert!(err.contains("use detach()"), "{err}");
    assert!(!xs.grad().defined());
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

/// `loss(f(x), x)` differentiated with `f` plain and with `f` checkpointed: the two
/// gradients of `x()` (undefined where none reaches it).
fn plain_and_checkpointed<O: ckpt::Stash>(
    f: impl Fn(Tensor) -> O + Clone + Send + 'static,
    loss: impl Fn(&O, &Tensor) -> Tensor,
) -> (Tensor, Tensor) {
    let plain = x();
    loss(&f(plain.shallow_clone()), &plain).backward();
    let checkpointed = x();
    let out = ckpt::checkpoint(f, checkpointed.shallow_clone());
    loss(&out, &checkpointed)
        .f_backward()
        .expect("a legitimate segment's backward succeeds");
    (plain.grad(), checkpointed.grad())
}

#[test]
fn a_segment_whose_output_is_a_constant_still_lets_the_other_paths_differentiate() {
    let _g = serial();
    let base = ckpt::live_segments();
    // A constant made with grad on, and one made under no_grad from nothing that
    // requires grad: neither is the closure turning grad off on what it differentiates.
    let constant = |_: Tensor| Tensor::ones([2, 3], (Kind::Float, Device::Cpu)) * 2.0;
    let made_under_no_grad =
        |_: Tensor| tch::no_grad(|| Tensor::arange(6, (Kind::Float, Device::Cpu)));
    let with_other_path = |y: &Tensor, x: &Tensor| y.sum(Kind::Float) + x.sin().sum(Kind::Float);
    for (plain, checkpointed) in [
        plain_and_checkpointed(constant, with_other_path),
        plain_and_checkpointed(made_under_no_grad, with_other_path),
    ] {
        assert!(checkpointed.equal(&plain_grad()), "{checkpointed}");
        assert!(checkpointed.equal(&plain), "{checkpointed} vs {plain}");
    }
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn integer_and_carried_outputs_computed_under_no_grad_are_not_the_error() {
    let _g = serial();
    let base = ckpt::live_segments();
    // The integer output reads `x`, which requires grad, under no_grad in both runs: it
    // has no gradient to lose (non-differentiable), and the float output keeps its graph.
    let f = |x: Tensor| {
        let index = tch::no_grad(|| x.argmax(1, false));
        (x.sin(), index, ckpt::Carry(x.size()[0]))
    };
    let loss = |o: &(Tensor, Tensor, ckpt::Carry<i64>), _: &Tensor| {
        assert_eq!(o.1.kind(), Kind::Int64);
        assert_eq!(o.2.0, 2);
        o.0.sum(Kind::Float)
    };
    let (plain, checkpointed) = plain_and_checkpointed(f, loss);
    assert!(checkpointed.equal(&plain_grad()), "{checkpointed}");
    assert!(checkpointed.equal(&plain));
    // The only tensor output is an integer one made under no_grad; the loss comes by
    // another path.
    let only_integer = |x: Tensor| tch::no_grad(|| x.argmax(1, false));
    let loss = |i: &Tensor, x: &Tensor| x.sin().sum(Kind::Float) + i.sum(Kind::Float);
    let (plain, checkpointed) = plain_and_checkpointed(only_integer, loss);
    assert!(checkpointed.equal(&plain_grad()), "{checkpointed}");
    assert!(checkpointed.equal(&plain));
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn an_output_made_under_no_grad_beside_one_with_a_graph_is_as_in_the_plain_function() {
    let _g = serial();
    let base = ckpt::live_segments();
    // Both outputs receive a gradient; the second was made under no_grad in both runs, so
    // as in the plain function only the first carries one back to `x`.
    let f = |x: Tensor| (x.sin(), tch::no_grad(|| x.cos()));
    let loss = |o: &(Tensor, Tensor), _: &Tensor| (&o.0 * &o.1).sum(Kind::Float);
    let (plain, checkpointed) = plain_and_checkpointed(f, loss);
    let xs = x();
    assert!(plain.equal(&(xs.cos() * xs.cos())), "{plain}");
    assert!(checkpointed.equal(&plain), "{checkpointed} vs {plain}");
    // The same with the second output turned off only in the recompute: the rule
    // refuses a recompute in which no output receiving a gradient has a graph, and this
    // one has one, so the difference goes unseen (as in PyTorch's checkpoint, which
    // checks the same).
    let f = |x: Tensor| {
        let second = if ckpt::is_recomputing() {
            tch::no_grad(|| x.cos())
        } else {
            x.cos()
        };
        (x.sin(), second)
    };
    let loss = |o: &(Tensor, Tensor), _: &Tensor| o.0.sum(Kind::Float) + o.1.sum(Kind::Float);
    let (_, checkpointed) = plain_and_checkpointed(f, loss);
    assert!(checkpointed.equal(&plain_grad()), "{checkpointed}");
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_nested_checkpoint_in_a_recompute_is_not_the_closure_turning_grad_off() {
    let _g = serial();
    let base = ckpt::live_segments();
    // The inner segment's forward runs under no_grad on the outer recompute's input,
    // which requires grad; the outer output is a constant besides.
    let f = |x: Tensor| {
        let inner: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), x);
        (inner, Tensor::ones([1], (Kind::Float, Device::Cpu)))
    };
    let (plain, checkpointed) = plain_and_checkpointed(f, |o: &(Tensor, Tensor), _: &Tensor| {
        o.0.sum(Kind::Float) + o.1.sum(Kind::Float)
    });
    assert!(checkpointed.equal(&plain_grad()), "{checkpointed}");
    assert!(checkpointed.equal(&plain));
    let f = |x: Tensor| {
        let _unused: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), x);
        Tensor::ones([1], (Kind::Float, Device::Cpu))
    };
    let (plain, checkpointed) = plain_and_checkpointed(f, |o: &Tensor, x: &Tensor| {
        o.sum(Kind::Float) + x.sin().sum(Kind::Float)
    });
    assert!(checkpointed.equal(&plain_grad()), "{checkpointed}");
    assert!(checkpointed.equal(&plain));
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_backward_under_with_grad_inside_the_closure_works_in_forward_and_in_recompute() {
    let _g = serial();
    let base = ckpt::live_segments();
    let xs = x();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| {
            // An unrelated graph, differentiated inside the segment (re-entrant backward
            // when this is the recompute). The forward runs under no_grad, as PyTorch's
            // reentrant checkpoint's does, so the closure turns grad on for it.
            let w = Tensor::from_slice(&[3.0f32]).set_requires_grad(true);
            tch::with_grad(|| (&w * &w).sum(Kind::Float).backward());
            s.lock().unwrap().push(w.grad().double_value(&[0]));
            x.sin()
        },
        xs.shallow_clone(),
    );
    y.sum(Kind::Float).backward();
    assert!(xs.grad().equal(&plain_grad()));
    assert_eq!(*seen.lock().unwrap(), vec![6.0, 6.0]);
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[derive(Debug)]
struct Sine(bool);

impl ckpt::ShallowClone for Sine {
    fn shallow_clone(&self) -> Self {
        Sine(self.0)
    }
}

impl tch::nn::Module for Sine {
    fn forward(&self, xs: &Tensor) -> Tensor {
        assert!(
            !(self.0 && ckpt::is_recomputing()),
            "module fails in recompute"
        );
        xs.sin()
    }
}

#[test]
fn checkpoint_sequential_with_a_module_failing_in_recompute_names_its_segment() {
    let _g = serial();
    let base = ckpt::live_segments();
    let modules = [Sine(false), Sine(true), Sine(false), Sine(false)];
    let xs = x();
    let y = ckpt::checkpoint_sequential(&modules, 2, &xs);
    let err = backward_error(&y);
    assert!(
        err.contains("checkpoint `checkpoint_sequential segment 1 of 2"),
        "{err}"
    );
    assert!(
        err.contains("the closure panicked during recompute: module fails in recompute"),
        "{err}"
    );
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[ckpt::checkpointed]
fn two_parts(xs: &Tensor) -> Tensor {
    let h = xs.sin();
    ckpt::cut!();
    let g = h.cos();
    g.exp()
}

#[test]
fn a_checkpointed_function_whose_input_changes_in_place_fails_backward_clearly() {
    let _g = serial();
    let base = ckpt::live_segments();
    let xs = x();
    let xd = xs.detach();
    let y = two_parts(&xs.shallow_clone());
    let _ = xd
        .shallow_clone()
        .g_add_(&Tensor::ones([2, 3], (Kind::Float, Device::Cpu)));
    let err = backward_error(&y);
    assert!(err.contains("two_parts segment"), "{err}");
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_user_message_that_mentions_exception_raised_from_is_kept_whole() {
    let _g = serial();
    let text = "config: Exception raised from the parser at line 3, key `lr`";
    let r = ckpt::f_checkpoint(move |_: Tensor| -> Tensor { panic!("{text}") }, x());
    let (_, message) = panicked_in_forward(r);
    assert_eq!(message, text);
}

#[test]
fn a_segment_without_input_tensors_differentiates_its_captures() {
    let _g = serial();
    let base = ckpt::live_segments();
    let w = x();
    let wc = w.shallow_clone();
    let y: Tensor = ckpt::checkpoint(
        move |c: ckpt::Carry<f64>| (&wc * c.0).sin(),
        ckpt::Carry(2.0),
    );
    y.sum(Kind::Float).backward();
    let w2 = x();
    (&w2 * 2.0).sin().sum(Kind::Float).backward();
    assert!(w.grad().equal(&w2.grad()), "{} vs {}", w.grad(), w2.grad());
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_segment_without_output_tensors_returns_its_values() {
    let _g = serial();
    let base = ckpt::live_segments();
    let r: Result<ckpt::Carry<i32>, CkptError> =
        ckpt::f_checkpoint(|x: Tensor| ckpt::Carry(x.size()[1] as i32), x());
    assert_eq!(r.expect("no tensors out").0, 3);
    let r: Result<Vec<Tensor>, CkptError> =
        ckpt::f_checkpoint(|_: Vec<Tensor>| Vec::new(), Vec::new());
    assert!(r.expect("nothing in, nothing out").is_empty());
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_recompute_panic_during_backward_on_another_thread_is_that_threads_error() {
    let _g = serial();
    let base = ckpt::live_segments();
    let opts = CheckpointOptions::new().name("elsewhere");
    let y: Tensor = ckpt::checkpoint_with(&opts, panics_on_recompute(|| "far away"), x());
    let err = std::thread::spawn(move || backward_error(&y))
        .join()
        .expect("the thread returns the error");
    assert!(
        err.contains("checkpoint `elsewhere`: the closure panicked during recompute: far away"),
        "{err}"
    );
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_recompute_panic_in_double_backward_is_an_error() {
    let _g = serial();
    let base = ckpt::live_segments();
    let xs = x();
    let opts = CheckpointOptions::new().name("second-order");
    let y: Tensor = ckpt::checkpoint_with(
        &opts,
        panics_on_recompute(|| "no hessian"),
        xs.shallow_clone(),
    );
    let r = Tensor::f_run_backward(&[&y.sum(Kind::Float)], &[&xs], true, true);
    let err = r.expect_err("the recompute panics").to_string();
    assert!(
        err.contains(
            "checkpoint `second-order`: the closure panicked during recompute: no hessian"
        ),
        "{err}"
    );
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn every_path_frees_the_closure_and_its_captures_exactly_once() {
    let _g = serial();
    let base = ckpt::live_segments();
    let held = Arc::new(0u8);
    // Forward panics.
    let h = held.clone();
    let r = ckpt::f_checkpoint(
        move |_: Tensor| -> Tensor {
            let _keep = &h;
            panic!("no")
        },
        x(),
    );
    assert!(r.is_err());
    assert_eq!(Arc::strong_count(&held), 1, "after a failed forward");
    // Recompute panics; the graph is freed by the failed backward or by the drop.
    let h = held.clone();
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| {
            let _keep = &h;
            assert!(!ckpt::is_recomputing(), "no");
            x.sin()
        },
        x(),
    );
    let _ = backward_error(&y);
    drop(y);
    assert_eq!(Arc::strong_count(&held), 1, "after a failed recompute");
    // No backward at all; under no_grad.
    let h = held.clone();
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| {
            let _keep = &h;
            x.sin()
        },
        x(),
    );
    drop(y);
    let h = held.clone();
    let y: Tensor = tch::no_grad(|| {
        ckpt::checkpoint(
            move |x: Tensor| {
                let _keep = &h;
                x.sin()
            },
            x(),
        )
    });
    drop(y);
    assert_eq!(Arc::strong_count(&held), 1, "without backward");
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_panic_payload_is_freed() {
    let _g = serial();
    let held = Arc::new(vec![0u8; 1 << 20]);
    let h = held.clone();
    let r = ckpt::f_checkpoint(
        move |_: Tensor| -> Tensor { std::panic::panic_any(h.clone()) },
        x(),
    );
    assert!(r.is_err());
    assert_eq!(
        Arc::strong_count(&held),
        1,
        "the forward's payload is leaked"
    );
}
