//! Bad input and failures: each becomes a clear error (never an abort), and no segment
//! closure leaks, whatever happened. The tests take a lock because they read the global
//! count of live segments.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ckpt::{CheckpointOptions, CkptError};
use tch::{Device, Kind, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn x() -> Tensor {
    Tensor::randn([2, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true)
}

/// A closure whose `k`-th call (counting from 0) behaves differently.
fn counter() -> (Arc<AtomicUsize>, impl Fn() -> usize + Send + Sync + 'static) {
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    (n, move || m.fetch_add(1, Ordering::SeqCst))
}

#[test]
fn output_shape_that_changes_on_recompute_is_an_error_naming_the_segment() {
    let _g = serial();
    let base = ckpt::live_segments();
    let (_, call) = counter();
    let opts = CheckpointOptions::new().name("shape-shifter");
    let y: Tensor = ckpt::checkpoint_with(
        &opts,
        move |x: Tensor| {
            if call() == 0 {
                x.sin()
            } else {
                x.sin().narrow(1, 0, 2)
            }
        },
        x(),
    );
    let err = y.sum(Kind::Float).f_backward().unwrap_err().to_string();
    assert!(err.contains("checkpoint `shape-shifter`"), "{err}");
    assert!(
        err.contains(
            "recomputed output 0 is [2, 2] Float on cpu but forward produced [2, 3] Float on cpu"
        ),
        "{err}"
    );
    drop(y);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn output_count_that_changes_on_recompute_is_an_error() {
    let _g = serial();
    let (_, call) = counter();
    let opts = CheckpointOptions::new().name("two-then-one");
    let y: Vec<Tensor> = ckpt::checkpoint_with(
        &opts,
        move |x: Tensor| {
            if call() == 0 {
                vec![x.sin(), x.cos()]
            } else {
                vec![x.sin()]
            }
        },
        x(),
    );
    let err = (&y[0] + &y[1])
        .sum(Kind::Float)
        .f_backward()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("checkpoint `two-then-one`: recompute returned 1 tensors, forward returned 2"),
        "{err}"
    );
}

/// A segment whose recompute changes its output's shape; the error names it.
fn shape_shifter() -> impl Fn(Tensor) -> Tensor + Send + 'static {
    let (_, call) = counter();
    move |x: Tensor| {
        if call() == 0 {
            x.sin()
        } else {
            x.sum(Kind::Float)
        }
    }
}

fn recompute_error(y: Tensor) -> String {
    y.sum(Kind::Float).f_backward().unwrap_err().to_string()
}

#[test]
fn the_default_name_is_the_call_site() {
    let _g = serial();
    let none = CheckpointOptions::new();
    let at = |line: u32| format!("checkpoint `tests/errors.rs:{line}:");
    let (y, line) = (ckpt::checkpoint(shape_shifter(), x()), line!());
    let err = recompute_error(y);
    assert!(err.contains(&at(line)), "{err}");
    let (y, line) = (ckpt::f_checkpoint(shape_shifter(), x()).unwrap(), line!());
    let err = recompute_error(y);
    assert!(err.contains(&at(line)), "{err}");
    let (y, line) = (ckpt::checkpoint_with(&none, shape_shifter(), x()), line!());
    let err = recompute_error(y);
    assert!(err.contains(&at(line)), "{err}");
    let (y, line) = (
        ckpt::f_checkpoint_with(&none, shape_shifter(), x()).unwrap(),
        line!(),
    );
    let err = recompute_error(y);
    assert!(err.contains(&at(line - 1)), "{err}");
}

#[test]
fn a_panic_during_recompute_is_an_error_and_the_process_lives_on() {
    let _g = serial();
    let base = ckpt::live_segments();
    let (_, call) = counter();
    let opts = CheckpointOptions::new().name("fragile");
    let y: Tensor = ckpt::checkpoint_with(
        &opts,
        move |x: Tensor| {
            if call() == 1 {
                panic!("the recompute found a broken invariant");
            }
            x.exp()
        },
        x(),
    );
    let err = y.sum(Kind::Float).f_backward().unwrap_err().to_string();
    assert!(
        err.contains("checkpoint `fragile`: the closure panicked during recompute: the recompute found a broken invariant"),
        "{err}"
    );
    assert!(
        !err.contains("Exception raised from"),
        "no C++ backtrace in the message: {err}"
    );
    drop(y);
    // The plain `backward` panics (tch's convention) with the same message.
    let (_, call) = counter();
    let y: Tensor = ckpt::checkpoint_with(
        &opts,
        move |x: Tensor| {
            if call() == 1 {
                panic!("again")
            } else {
                x.exp()
            }
        },
        x(),
    );
    let loss = y.sum(Kind::Float);
    let msg =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loss.backward())).unwrap_err();
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("panicked during recompute: again"), "{msg}");
    drop((y, loss));
    // Still usable afterwards.
    let z: Tensor = ckpt::checkpoint(|x: Tensor| x * 3.0, x());
    z.sum(Kind::Float).backward();
    drop(z);
    assert_eq!(ckpt::live_segments(), base);
}

#[test]
fn a_panic_in_forward_is_an_error_from_f_checkpoint() {
    let _g = serial();
    let base = ckpt::live_segments();
    let r: Result<Tensor, CkptError> =
        ckpt::f_checkpoint(|_: Tensor| -> Tensor { panic!("bad shape {}", 7) }, x());
    let err = r.unwrap_err();
    assert!(
        matches!(&err, CkptError::ClosurePanicked { recompute: false, message, .. } if message == "bad shape 7"),
        "{err:?}"
    );
    let panic = std::panic::catch_unwind(|| -> Tensor {
        ckpt::checkpoint(|_: Tensor| -> Tensor { panic!("boom") }, x())
    });
    let msg = panic
        .unwrap_err()
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(msg.contains("the closure panicked: boom"), "{msg}");
    assert_eq!(ckpt::live_segments(), base, "the closure was freed");
}

#[test]
fn a_libtorch_error_in_forward_is_an_error_from_f_checkpoint() {
    let _g = serial();
    let r: Result<Tensor, CkptError> = ckpt::f_checkpoint(
        |x: Tensor| x.matmul(&Tensor::ones([7, 7], (Kind::Float, Device::Cpu))),
        x(),
    );
    match r.unwrap_err() {
        CkptError::ClosurePanicked {
            message,
            recompute: false,
            ..
        } => {
            assert!(
                message.contains("mat1 and mat2 shapes cannot be multiplied"),
                "{message}"
            );
            assert!(
                !message.contains("Exception raised from"),
                "libtorch's C++ backtrace is trimmed: {message}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_undefined_input_tensor_is_an_error() {
    let _g = serial();
    let base = ckpt::live_segments();
    let r: Result<Tensor, CkptError> = ckpt::f_checkpoint(|x: Tensor| x, Tensor::new());
    let err = r.unwrap_err();
    assert!(matches!(err, CkptError::Torch(_)), "{err:?}");
    assert!(
        err.to_string().contains("input 0 is an undefined tensor"),
        "{err}"
    );
    assert_eq!(ckpt::live_segments(), base);
}

/// The cause is libtorch's (the graph was freed), with the fix; not the in-place error
/// that a freed stash used to be reported as.
#[test]
fn a_second_backward_through_the_same_graph_is_libtorchs_error() {
    let _g = serial();
    let opts = CheckpointOptions::new().name("twice");
    let y: Tensor = ckpt::checkpoint_with(&opts, |x: Tensor| x.sin(), x());
    let loss = y.sum(Kind::Float);
    loss.backward();
    let err = loss.f_backward().unwrap_err().to_string();
    assert!(
        err.contains("checkpoint `twice`: trying to backward through the graph a second time"),
        "{err}"
    );
    assert!(err.contains("keep_graph = true"), "the fix: {err}");
    assert!(err.contains("retain_graph=True"), "PyTorch's name: {err}");
    assert!(!err.contains("modified in place"), "{err}");

    // With the graph kept, a second backward works and doubles the gradient, as plain.
    let xs = x();
    let y: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), xs.shallow_clone());
    let loss = y.sum(Kind::Float);
    let g1 = Tensor::run_backward(&[&loss], &[&xs], true, false).remove(0);
    let g2 = Tensor::run_backward(&[&loss], &[&xs], false, false).remove(0);
    assert!(g1.equal(&xs.cos()) && g2.equal(&g1));
}

/// A panicking module in a chain, for the `f_` functions over modules.
#[derive(Debug)]
struct Boom(bool);

impl ckpt::ShallowClone for Boom {
    fn shallow_clone(&self) -> Self {
        Boom(self.0)
    }
}

impl tch::nn::Module for Boom {
    fn forward(&self, xs: &Tensor) -> Tensor {
        assert!(!self.0, "module says no");
        xs * 2.0
    }
}

fn closure_panicked(r: Result<Tensor, CkptError>, segment_has: &str) {
    match r {
        Err(CkptError::ClosurePanicked {
            segment,
            recompute: false,
            message,
        }) => {
            assert!(message.contains("module says no"), "{message}");
            assert!(segment.contains(segment_has), "{segment}");
        }
        other => panic!("expected ClosurePanicked, got {other:?}"),
    }
}

/// Every `f_` entry point returns `ClosurePanicked` for a panicking closure or module,
/// under `no_grad` (where it runs user code plainly) as with grad, and in the part of a
/// chain that is not checkpointed; grad mode is as it was afterwards.
#[test]
fn f_functions_return_closure_panicked_with_or_without_grad() {
    let _g = serial();
    let base = ckpt::live_segments();
    let opts = CheckpointOptions::new().name("quiet");
    let r = tch::no_grad(|| {
        ckpt::f_checkpoint_with(
            &opts,
            |_: Tensor| -> Tensor { panic!("module says no") },
            x(),
        )
    });
    closure_panicked(r, "quiet");
    let r = tch::no_grad(|| {
        ckpt::f_checkpoint(|_: Tensor| -> Tensor { panic!("module says no") }, x())
    });
    closure_panicked(r, "errors.rs");

    let xs = x();
    for grad in [true, false] {
        let run = |f: &dyn Fn() -> Result<Tensor, CkptError>| {
            if grad { f() } else { tch::no_grad(f) }
        };
        // The panicking module in a checkpointed group, then in the last (plain) group.
        let first = [Boom(true), Boom(false), Boom(false), Boom(false)];
        let last = [Boom(false), Boom(false), Boom(false), Boom(true)];
        closure_panicked(
            run(&|| ckpt::f_checkpoint_sequential(&first, 2, &xs)),
            "checkpoint_sequential segment 1 of 2: stages 0..2, `modules[0]` to `modules[1]` (tests/errors.rs:",
        );
        closure_panicked(
            run(&|| ckpt::f_checkpoint_sequential(&last, 2, &xs)),
            "checkpoint_sequential segment 2 of 2: stages 2..4, `modules[2]` to `modules[3]` (tests/errors.rs:",
        );
        closure_panicked(
            run(&|| ckpt::plan::f_checkpoint_sequential_binomial(&last, 1, &xs)),
            "checkpoint_sequential_binomial segment 2 of 2: stages 3..4, `modules[3]` to `modules[3]` (tests/errors.rs:",
        );
        closure_panicked(
            run(&|| ckpt::plan::f_checkpoint_sequential_binomial(&first, 1, &xs)),
            "checkpoint_sequential_binomial segment 1 of 2: stages 0..3, `modules[0]` to `modules[2]` (tests/errors.rs:",
        );
        let plan = ckpt::plan::ChainCost::new(vec![Default::default(); 4], 0)
            .evaluate(&[2])
            .unwrap();
        closure_panicked(
            run(&|| ckpt::f_checkpoint_sequential_plan(&last, &plan, &xs)),
            "checkpoint_sequential segment 2 of 2: stages 2..4, `modules[2]` to `modules[3]` (tests/errors.rs:",
        );
        let probe = Tensor::ones([1], (Kind::Float, Device::Cpu)).set_requires_grad(true) * 2.0;
        assert!(probe.requires_grad(), "grad mode is on again");
    }
    // The planner: under no_grad it runs the chain plainly; with grad it profiles first.
    let mut planner = ckpt::plan::SequentialPlanner::new(ckpt::plan::Objective::MinPeak);
    let last = [Boom(false), Boom(true)];
    closure_panicked(tch::no_grad(|| planner.f_forward(&last, &xs)), "no grad");
    closure_panicked(planner.f_forward(&last, &xs), "profiling, stage 1");
    closure_panicked(
        ckpt::plan::f_profile_sequential(&last, &xs).map(|_| Tensor::new()),
        "profiling, stage 1",
    );
    assert!(
        (Tensor::ones([1], (Kind::Float, Device::Cpu)).set_requires_grad(true) * 2.0)
            .requires_grad(),
        "grad mode is on again after a panic in a profiling run"
    );
    assert_eq!(ckpt::live_segments(), base);
}

/// An output that is a view of a tensor made inside the segment, written in place after
/// it (as a YOLO detection head writes into slices of its output): values and gradients
/// as without checkpointing.
#[test]
fn an_in_place_op_on_an_output_view_works_as_in_the_plain_function() {
    let _g = serial();
    let head = |x: &Tensor| (x * 2.0).view([2, 3]);
    let write = |a: &Tensor| {
        let src = a.narrow(1, 1, 1).sigmoid();
        a.narrow(1, 0, 1).copy_(&src);
        let _ = a.narrow(1, 2, 1).g_mul_scalar_(3.0);
    };
    let x = Tensor::randn([6], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let w = Tensor::randn([2, 3], (Kind::Float, Device::Cpu));
    let a = head(&x);
    write(&a);
    (&a * &w).sum(Kind::Float).backward();
    let (want, want_grad) = (a.detach().copy(), x.grad().copy());
    let _ = x.grad().zero_();

    let a: Tensor = ckpt::checkpoint(move |x: Tensor| head(&x), x.shallow_clone());
    write(&a);
    (&a * &w).sum(Kind::Float).backward();
    assert!(a.detach().equal(&want), "values");
    assert!(x.grad().equal(&want_grad), "gradients");

    // Several outputs, views of distinct tensors made inside.
    let _ = x.grad().zero_();
    let (a, b): (Tensor, Tensor) = ckpt::checkpoint(
        move |x: Tensor| (head(&x), x.exp().view([3, 2]).transpose(0, 1)),
        x.shallow_clone(),
    );
    write(&a);
    let _ = b.narrow(1, 0, 1).zero_();
    (&a * &w + &b).sum(Kind::Float).backward();
    let plain_b = {
        let b = x.detach().exp().view([3, 2]).transpose(0, 1);
        let _ = b.narrow(1, 0, 1).zero_();
        b
    };
    assert!(a.detach().equal(&want) && b.detach().equal(&plain_b));
    let mask = Tensor::ones([3, 2], (Kind::Float, Device::Cpu));
    let _ = mask.narrow(0, 0, 1).zero_();
    let want_b_grad = x.detach().exp() * mask.view([6]);
    assert!(x.grad().equal(&(want_grad + want_b_grad)), "both paths");
}

/// A view of an input shares the stash's storage: writing into it changes what the
/// recompute would read, which backward reports naming the segment and the fix.
#[test]
fn an_in_place_op_on_an_output_view_of_an_input_is_an_error_naming_the_segment() {
    let _g = serial();
    let x = Tensor::randn([6], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let h = &x * 1.0;
    let opts = CheckpointOptions::new().name("reshaper");
    let a: Tensor = ckpt::checkpoint_with(&opts, |h: Tensor| h.view([2, 3]), h);
    let _ = a.narrow(1, 0, 1).fill_(0.0);
    let err = a.sum(Kind::Float).f_backward().unwrap_err().to_string();
    assert!(
        err.contains("checkpoint `reshaper`: an input of the segment was modified in place"),
        "{err}"
    );
    assert!(
        err.contains("apply the in-place op to a copy"),
        "the fix: {err}"
    );
}

#[test]
fn no_closure_leaks() {
    let _g = serial();
    let base = ckpt::live_segments();
    {
        // After backward, once the outputs are gone.
        let y: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), x());
        let z: Tensor = ckpt::checkpoint(|x: Tensor| x.cos(), y);
        assert_eq!(ckpt::live_segments(), base + 2);
        z.sum(Kind::Float).backward();
    }
    assert_eq!(ckpt::live_segments(), base);
    {
        // An output that never saw backward.
        let y: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), x());
        assert_eq!(ckpt::live_segments(), base + 1);
        drop(y);
    }
    assert_eq!(ckpt::live_segments(), base);
    {
        // The closure's captures are freed with it.
        let captured = Arc::new(());
        let c = captured.clone();
        let y: Tensor = ckpt::checkpoint(
            move |x: Tensor| {
                let _keep = &c;
                x.sin()
            },
            x(),
        );
        assert_eq!(Arc::strong_count(&captured), 2);
        drop(y);
        assert_eq!(Arc::strong_count(&captured), 1);
    }
    {
        // Under no_grad nothing is created.
        let _y: Tensor = tch::no_grad(|| ckpt::checkpoint(|x: Tensor| x.sin(), x()));
        assert_eq!(ckpt::live_segments(), base);
    }
}

/// A panic payload whose own `Drop` panics, and an output value whose `Drop` panics
/// during the recompute: errors, not an abort.
#[test]
fn panics_while_dropping_do_not_abort() {
    let _g = serial();
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("dropping the payload panics too");
        }
    }
    let r: Result<Tensor, CkptError> =
        ckpt::f_checkpoint(|_: Tensor| -> Tensor { std::panic::panic_any(Bomb) }, x());
    assert!(
        matches!(r, Err(CkptError::ClosurePanicked { ref message, .. }) if message == "panic payload is not a string"),
        "{r:?}"
    );

    #[derive(Clone)]
    struct Fragile(Arc<AtomicUsize>);
    impl Drop for Fragile {
        fn drop(&mut self) {
            // The forward's copy is dropped quietly; the recompute's panics.
            if self.0.fetch_add(1, Ordering::SeqCst) == 1 {
                panic!("dropping the recompute's output panics");
            }
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let (y, carried): (Tensor, ckpt::Carry<Fragile>) = ckpt::checkpoint(
        move |x: Tensor| (x.sin(), ckpt::Carry(Fragile(d.clone()))),
        x(),
    );
    std::mem::forget(carried);
    let err = y.sum(Kind::Float).f_backward().unwrap_err().to_string();
    assert!(
        err.contains("panicked during recompute: dropping the recompute's output panics"),
        "the drop's own message: {err}"
    );
}

#[test]
fn a_recompute_that_returns_an_undefined_tensor_is_an_error_naming_the_segment() {
    let _g = serial();
    for check in [true, false] {
        let (_, call) = counter();
        let opts = CheckpointOptions::new()
            .name("vanishing")
            .determinism_check(check);
        let xs = x();
        let y: Tensor = ckpt::checkpoint_with(
            &opts,
            move |x: Tensor| if call() == 0 { x.sin() } else { Tensor::new() },
            xs.shallow_clone(),
        );
        let err = y.sum(Kind::Float).f_backward().unwrap_err().to_string();
        assert!(
            err.contains("checkpoint `vanishing`: recomputed output 0 is an undefined tensor"),
            "determinism_check {check}: {err}"
        );
        assert!(!xs.grad().defined());
    }
}
