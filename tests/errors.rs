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

#[test]
fn a_second_backward_through_the_same_graph_is_libtorchs_error() {
    let _g = serial();
    let y: Tensor = ckpt::checkpoint(|x: Tensor| x.sin(), x());
    let loss = y.sum(Kind::Float);
    loss.backward();
    let err = loss.f_backward().unwrap_err().to_string();
    assert!(
        err.contains("Trying to backward through the graph a second time"),
        "{err}"
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
    assert!(err.contains("panicked during recompute"), "{err}");
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
