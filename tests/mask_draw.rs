//! The dropout masks' draw (`csrc/bernoulli.cpp`): compact dropout and the policies that
//! keep masks draw libtorch's `bernoulli_(1 - p)` stream themselves, straight into bits.
//! Every case here compares a compact dropout against libtorch's own dropout from the
//! same generator position: the outputs bit for bit, and the 1,500 draws after it (more
//! than the 624 words of the MT19937 engine, so the whole engine state after the draw is
//! compared). Lengths end inside, at and across the engine's 624-output blocks and the
//! kernel's 2,048-draw chunks; generator positions are odd and even; probabilities reach
//! both ends of the comparison; both the AVX2 and the portable loop run (where the CPU
//! has AVX2). The global generator is shared by the test threads, so the tests take a
//! lock, as in `tests/compact_dropout.rs`.

mod common;

use std::sync::{Mutex, MutexGuard};

use common::assert_all_equal;
use tch::{Device, Kind, Tensor};

static RNG: Mutex<()> = Mutex::new(());

fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// The draws after a dropout: 1,500 32-bit outputs (float `rand` takes one an element)
/// and 7 64-bit ones (double `rand` takes two).
fn after() -> Vec<Tensor> {
    vec![
        Tensor::rand([1500], (Kind::Float, Device::Cpu)),
        Tensor::rand([7], (Kind::Double, Device::Cpu)),
    ]
}

/// `x.dropout(p, true)` from seed `seed` after `skip` 32-bit draws, compact or not, with
/// or without grad: the output and the draws after it.
fn run(x: &Tensor, p: f64, seed: i64, skip: i64, compact: bool, grad: bool) -> Vec<Tensor> {
    tch::manual_seed(seed);
    if skip > 0 {
        let _ = Tensor::rand([skip], (Kind::Float, Device::Cpu));
    }
    let x = x.detach().set_requires_grad(grad);
    let drop = || {
        if grad {
            x.dropout(p, true)
        } else {
            tch::no_grad(|| x.dropout(p, true))
        }
    };
    let y = if compact {
        ckpt::compact_dropout(drop)
    } else {
        drop()
    };
    let mut out = vec![y.detach()];
    out.extend(after());
    out
}

/// Restores the kernel choice when a test ends, also when it fails.
struct Portable(bool);

impl Portable {
    fn set(on: bool) -> Portable {
        Portable(ckpt::force_portable_draw(on))
    }
}

impl Drop for Portable {
    fn drop(&mut self) {
        ckpt::force_portable_draw(self.0);
    }
}

/// The kernels this test runs: the AVX2 one where the CPU has it, and the portable one.
/// Asserts that each is the one drawing (libtorch 2.13.0 draws as `csrc/bernoulli.cpp`
/// expects, so neither falls back to `bernoulli_`).
fn kernels() -> Vec<bool> {
    let _k = Portable::set(true);
    assert_eq!(ckpt::mask_draw_kernel(), "portable");
    let _k = Portable::set(false);
    let avx2 = cpu_has_avx2();
    assert_eq!(
        ckpt::mask_draw_kernel(),
        if avx2 { "avx2" } else { "portable" }
    );
    if avx2 { vec![false, true] } else { vec![true] }
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_avx2() -> bool {
    false
}

const LENGTHS: [i64; 24] = [
    1, 2, 7, 8, 9, 15, 311, 312, 313, 623, 624, 625, 1247, 1248, 1249, 2047, 2048, 2049, 4095,
    4096, 4097, 6143, 6144, 100_003,
];

#[test]
fn the_draw_equals_bernoulli_at_every_length_and_generator_position() {
    let _rng = rng();
    for portable in kernels() {
        let _k = Portable::set(portable);
        for (i, &n) in LENGTHS.iter().enumerate() {
            let x = Tensor::randn([n], (Kind::Float, Device::Cpu));
            // After a seed (the engine twists at its first output), and 1, 311 and 624
            // outputs in (odd and even positions, one at a block's end).
            for skip in [0, 1, 311, 624] {
                let seed = 100 + i as i64;
                let what = format!("n = {n}, skip = {skip}, portable = {portable}");
                let plain = run(&x, 0.1, seed, skip, false, true);
                let compact = run(&x, 0.1, seed, skip, true, true);
                assert_all_equal(&what, &plain, &compact);
            }
        }
    }
}

#[test]
fn the_draw_equals_bernoulli_at_every_probability() {
    let _rng = rng();
    let x = Tensor::randn([3001], (Kind::Float, Device::Cpu));
    // 1 - p rounds to 1 (every element kept), down to 2^-53 and below (almost none).
    let ps = [
        1e-300,
        1e-17,
        1e-9,
        0.1,
        0.25,
        0.5,
        0.75,
        0.9,
        0.999_999,
        1.0 - 1e-15,
        1.0 - 2f64.powi(-53),
    ];
    for portable in kernels() {
        let _k = Portable::set(portable);
        for (i, &p) in ps.iter().enumerate() {
            let what = format!("p = {p:e}, portable = {portable}");
            let plain = run(&x, p, 7 + i as i64, 3, false, true);
            let compact = run(&x, p, 7 + i as i64, 3, true, true);
            assert_all_equal(&what, &plain, &compact);
        }
    }
}

#[test]
fn without_grad_a_compact_dropout_draws_the_same_and_holds_nothing() {
    let _rng = rng();
    let cases = [
        Tensor::randn([4, 3, 129], (Kind::Float, Device::Cpu)),
        Tensor::randn([1000], (Kind::Double, Device::Cpu)),
        Tensor::randn([77], (Kind::BFloat16, Device::Cpu)),
        Tensor::randn([33], (Kind::Half, Device::Cpu)),
        // Not contiguous: `bernoulli_`'s own draw.
        Tensor::randn([40, 24], (Kind::Float, Device::Cpu)).transpose(0, 1),
    ];
    for (i, x) in cases.iter().enumerate() {
        for grad in [false, true] {
            let what = format!("case {i}, grad = {grad}");
            let plain = run(x, 0.3, 50 + i as i64, 5, false, grad);
            let compact = run(x, 0.3, 50 + i as i64, 5, true, grad);
            assert_all_equal(&what, &plain, &compact);
        }
    }
    // No graph, so nothing held: the output's bytes only.
    let x = Tensor::randn([4096], (Kind::Float, Device::Cpu));
    let held = common::kept_by(&x, |x| {
        ckpt::compact_dropout(|| tch::no_grad(|| x.dropout(0.1, true)))
    });
    assert_eq!(held, 4 * 4096);
}

#[test]
fn draws_on_several_threads_each_take_the_generator_whole() {
    // Two threads drawing compact dropouts at once from the one global generator, each
    // under the generator's lock: each takes one whole draw, so their outputs are the
    // two plain dropouts' (in either order), and the draws after them are those after
    // the two plain dropouts.
    let _rng = rng();
    let n = 50_000;
    let (first, second, plain) = {
        tch::manual_seed(3);
        let a = Tensor::randn([n], (Kind::Float, Device::Cpu));
        let first = a.dropout(0.2, true);
        let second = a.dropout(0.2, true);
        (first, second, after())
    };
    tch::manual_seed(3);
    let a = Tensor::randn([n], (Kind::Float, Device::Cpu));
    let outs: Vec<Tensor> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let a = a.shallow_clone();
                s.spawn(move || ckpt::compact_dropout(|| a.dropout(0.2, true)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let in_order = outs[0].equal(&first) && outs[1].equal(&second);
    let swapped = outs[0].equal(&second) && outs[1].equal(&first);
    assert!(
        in_order || swapped,
        "each thread's output is one plain dropout's"
    );
    assert_all_equal("after two threads", &plain, &after());
}
