//! `ckpt::compact_dropout`: CPU dropout that keeps its mask for backward as bits. Every
//! test compares against libtorch's own dropout run on the same seed: outputs, gradients
//! (first and second order) and the next random draw bit for bit, and the bytes held for
//! backward exactly. The global generator is shared by the test threads, so the tests
//! take a lock (as in `tests/dropout.rs`).

mod common;

use std::sync::{Mutex, MutexGuard};

use ckpt::{CheckpointOptions, Policy, ShallowClone};
use common::{assert_all_equal, kept_by, params};
use tch::{Device, Kind, Tensor, nn};

static RNG: Mutex<()> = Mutex::new(());

fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Output, gradient of `sum(y * w)` with respect to `x`, and the next draw, with `f`
/// run from seed 11 (compact or not).
fn outcome(x: &Tensor, compact: bool, f: impl Fn(&Tensor) -> Tensor) -> Vec<Tensor> {
    let x = x.detach().set_requires_grad(true);
    tch::manual_seed(11);
    let y = if compact {
        ckpt::compact_dropout(|| f(&x))
    } else {
        f(&x)
    };
    let w = y.rand_like();
    let g = Tensor::run_backward(&[(&y * &w).sum(y.kind())], &[&x], false, false);
    let next = Tensor::rand([4], (Kind::Float, Device::Cpu));
    vec![y.detach(), g[0].shallow_clone(), next]
}

#[test]
fn values_gradients_and_the_random_stream_equal_plain_dropout() {
    let _rng = rng();
    tch::manual_seed(0);
    let cases: Vec<(&str, Tensor)> = vec![
        (
            "float32",
            Tensor::randn([8, 33], (Kind::Float, Device::Cpu)),
        ),
        (
            "float64",
            Tensor::randn([5, 7, 9], (Kind::Double, Device::Cpu)),
        ),
        (
            "float32, transposed",
            Tensor::randn([16, 24], (Kind::Float, Device::Cpu)).transpose(0, 1),
        ),
        (
            "bfloat16",
            Tensor::randn([67], (Kind::BFloat16, Device::Cpu)),
        ),
        (
            "one element",
            Tensor::randn([1], (Kind::Float, Device::Cpu)),
        ),
        (
            "1 Mi elements",
            Tensor::randn([1 << 20], (Kind::Float, Device::Cpu)),
        ),
    ];
    for (what, x) in cases {
        for p in [0.1, 0.5, 0.9] {
            let drop = |x: &Tensor| x.dropout(p, true);
            let plain = outcome(&x, false, drop);
            let compact = outcome(&x, true, drop);
            assert_all_equal(&format!("{what}, p = {p}"), &plain, &compact);
        }
    }
}

#[test]
fn the_mask_is_held_as_bits() {
    let _rng = rng();
    let n = 4096_i64;
    let x = Tensor::randn([n], (Kind::Float, Device::Cpu));
    let plain = kept_by(&x, |x| x.dropout(0.1, true));
    let compact = kept_by(&x, |x| ckpt::compact_dropout(|| x.dropout(0.1, true)));
    // Plain: the output and the float noise MulBackward0 holds; compact: the output and
    // the bits.
    assert_eq!(plain, 2 * 4 * n);
    assert_eq!(compact, 4 * n + n / 8);
    // A length that is not a multiple of 8 takes a last partial byte.
    let x = Tensor::randn([13], (Kind::Double, Device::Cpu));
    assert_eq!(
        kept_by(&x, |x| ckpt::compact_dropout(|| x.dropout(0.5, true))),
        8 * 13 + 2
    );
}

#[test]
fn calls_it_leaves_alone_hold_what_plain_dropout_holds() {
    let _rng = rng();
    let x = Tensor::randn([256], (Kind::Float, Device::Cpu));
    let same = |what: &str, f: &dyn Fn(&Tensor) -> Tensor| {
        assert_eq!(
            kept_by(&x, |x| ckpt::compact_dropout(|| f(x))),
            kept_by(&x, |x| f(x)),
            "{what}"
        );
    };
    same("eval mode", &|x| x.dropout(0.1, false));
    same("p = 0", &|x| x.dropout(0.0, true));
    same("p = 1", &|x| x.dropout(1.0, true));
    same("no grad", &|x| tch::no_grad(|| x.dropout(0.1, true)));
    same("input without grad", &|x| x.detach().dropout(0.1, true));
    // Outside the scope, and on another thread while it is on here.
    let _on = ckpt::compact_dropout_guard();
    drop(_on);
    assert_eq!(
        kept_by(&x, |x| x.dropout(0.1, true)),
        2 * 4 * 256,
        "after the guard"
    );
    let _on = ckpt::compact_dropout_guard();
    let xs = x.copy();
    let other = std::thread::spawn(move || kept_by(&xs, |x| x.dropout(0.1, true)))
        .join()
        .unwrap();
    assert_eq!(other, 2 * 4 * 256, "another thread is not compact");
    assert_eq!(kept_by(&x, |x| x.dropout(0.1, true)), 4 * 256 + 32);
}

#[test]
fn the_setting_is_restored_after_a_panic_and_nests() {
    let _rng = rng();
    let x = Tensor::randn([64], (Kind::Float, Device::Cpu));
    let r = std::panic::catch_unwind(|| ckpt::compact_dropout(|| panic!("inside")));
    assert!(r.is_err());
    assert_eq!(kept_by(&x, |x| x.dropout(0.1, true)), 2 * 4 * 64);
    ckpt::compact_dropout(|| {
        ckpt::compact_dropout(|| ());
        assert_eq!(kept_by(&x, |x| x.dropout(0.1, true)), 4 * 64 + 8);
    });
}

#[test]
fn double_backward_equals_plain() {
    let _rng = rng();
    tch::manual_seed(1);
    let x0 = Tensor::randn([6, 40], (Kind::Double, Device::Cpu));
    let run = |compact: bool| {
        let x = x0.detach().set_requires_grad(true);
        tch::manual_seed(3);
        let y = if compact {
            ckpt::compact_dropout(|| x.dropout(0.3, true))
        } else {
            x.dropout(0.3, true)
        };
        let z = (&y * &y * &x).sum(Kind::Double);
        let g = Tensor::run_backward(&[&z], &[&x], true, true);
        let gg = Tensor::run_backward(&[&(&g[0] * &g[0]).sum(Kind::Double)], &[&x], false, false);
        vec![g[0].detach(), gg[0].shallow_clone()]
    };
    assert_all_equal("first and second order", &run(false), &run(true));
}

#[test]
fn a_second_backward_is_an_error_unless_the_graph_is_kept() {
    let _rng = rng();
    let x = Tensor::randn([32], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    tch::manual_seed(2);
    let y = ckpt::compact_dropout(|| x.dropout(0.2, true));
    let loss = (&y * 3.0).sum(Kind::Float);
    let first = Tensor::run_backward(&[&loss], &[&x], true, false);
    let second = Tensor::run_backward(&[&loss], &[&x], false, false);
    assert_all_equal("kept graph", &first, &second);
    let third = Tensor::f_run_backward(&[&loss], &[&x], false, false);
    let err = third.expect_err("the mask was freed").to_string();
    assert!(err.contains("second time"), "{err}");
}

/// The seed transformer's block (ckpt-models): a training step's gradients are bit-equal,
/// and what its forward holds shrinks by exactly the four dropouts' noise less their bits.
#[test]
fn an_encoder_block_trains_bit_equal_and_holds_less() {
    let _rng = rng();
    use ckpt_models::classifier::{Block, ModelConfig};
    let (b, s, d, ff, h) = (2_i64, 48_i64, 32_i64, 64_i64, 4_i64);
    let cfg = ModelConfig {
        vocab_size: 10,
        n_classes: 2,
        seq_len: s,
        layers: 1,
        heads: h,
        d_model: d,
        ff,
        dropout: 0.1,
    };
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let block = Block::new(vs.root() / "b", &cfg);
    let bias = Tensor::zeros([b * h, 1, s], (Kind::Float, Device::Cpu));
    let x = Tensor::randn([b, s, d], (Kind::Float, Device::Cpu));
    let step = |compact: bool| {
        tch::manual_seed(9);
        let x = x.detach().set_requires_grad(true);
        let y = if compact {
            ckpt::compact_dropout(|| block.forward(&x, &bias, true))
        } else {
            block.forward(&x, &bias, true)
        };
        let mut wrt = params(&vs);
        wrt.push(x.shallow_clone());
        let mut out = Tensor::run_backward(&[(&y * &y).sum(Kind::Float)], &wrt, false, false);
        out.push(y.detach());
        out
    };
    assert_all_equal("gradients and output", &step(false), &step(true));
    tch::manual_seed(9);
    let plain = kept_by(&x, |x| block.forward(x, &bias, true));
    tch::manual_seed(9);
    let compact = kept_by(&x, |x| {
        ckpt::compact_dropout(|| block.forward(x, &bias, true))
    });
    let saved = |n: i64| 4 * n - (n + 7) / 8;
    // The attention weights, the attention branch, the hidden layer, the feed-forward branch.
    let expected = saved(b * h * s * s) + saved(b * s * d) + saved(b * s * ff) + saved(b * s * d);
    assert_eq!(plain - compact, expected);
}

/// Around a checkpointed segment whose backward runs inside the scope: its recompute's
/// dropout is compact (full recompute) or keeps the policy's masks, and the gradients
/// equal the plain run's either way.
#[test]
fn checkpointed_segments_inside_the_scope_equal_plain() {
    let _rng = rng();
    tch::manual_seed(6);
    let vs = nn::VarStore::new(Device::Cpu);
    let lin = nn::linear(vs.root() / "l", 16, 16, Default::default());
    let x0 = Tensor::randn([8, 16], (Kind::Float, Device::Cpu));
    fn f(lin: &nn::Linear, x: &Tensor) -> Tensor {
        x.apply(lin).relu().dropout(0.25, true).apply(lin)
    }
    let run = |policy: Option<Policy>| {
        tch::manual_seed(7);
        let x = x0.detach().set_requires_grad(true);
        let mut wrt = params(&vs);
        wrt.push(x.shallow_clone());
        match policy {
            None => {
                let y = f(&lin, &x);
                Tensor::run_backward(&[(&y * &y).sum(Kind::Float)], &wrt, false, false)
            }
            Some(policy) => ckpt::compact_dropout(|| {
                let opts = CheckpointOptions::new()
                    .policy(policy)
                    .parameters(&params(&vs));
                let l = lin.shallow_clone();
                let y: Tensor =
                    ckpt::checkpoint_with(&opts, move |x: Tensor| f(&l, &x), x.shallow_clone());
                Tensor::run_backward(&[(&y * &y).sum(Kind::Float)], &wrt, false, false)
            }),
        }
    };
    let plain = run(None);
    for policy in [Policy::RECOMPUTE_ALL, Policy::masks(), Policy::selective()] {
        assert_all_equal(&format!("{policy:?}"), &plain, &run(Some(policy)));
    }
}
