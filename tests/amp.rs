//! Autocast with a weight used more than once (issue 11, item 2).
//!
//! Under `autocast(Cpu, BFloat16)` the plain run casts a weight once (autocast's cast
//! cache) and both uses' bfloat16 gradients meet at that one cast, where they are summed
//! in bfloat16 before the cast's backward turns the sum into float32. A checkpointed
//! segment's recompute casts the weight again, so each use's gradient reaches the float32
//! `.grad` through its own cast and the two are summed in float32. The two results differ
//! at bfloat16 level; the checkpointed one is the exact sum rounded once to float32, so it
//! is at least as close as the plain one to the exact (float64) sum, element by element.
//! Making it equal would mean feeding the recompute's gradient into the forward graph's
//! cast node, from inside that graph's own backward, for a less accurate result.

use ckpt::amp::autocast;
use tch::{Device, Kind, Tensor};

const D: i64 = 64;

/// `x · w` then `relu`, then `· w` again: the weight used twice. `checkpointed` puts the
/// first use in a segment (`Some(false)`) or both uses in segments (`Some(true)`).
fn loss(x: &Tensor, w1: &Tensor, w2: &Tensor, checkpointed: Option<bool>) -> Tensor {
    autocast(Device::Cpu, Kind::BFloat16, || {
        let first = |x: &Tensor, w: &Tensor| x.matmul(w).relu();
        let second = |h: &Tensor, w: &Tensor| h.matmul(w);
        let y = match checkpointed {
            None => second(&first(x, w1), w2),
            Some(both) => {
                let w = w1.shallow_clone();
                let h: Tensor = ckpt::checkpoint(move |x: Tensor| first(&x, &w), x.shallow_clone());
                if both {
                    let w = w2.shallow_clone();
                    ckpt::checkpoint(move |h: Tensor| second(&h, &w), h)
                } else {
                    second(&h, w2)
                }
            }
        };
        assert_eq!(y.kind(), Kind::BFloat16);
        (y.to_kind(Kind::Float) * Tensor::arange(D, (Kind::Float, Device::Cpu))).sum(Kind::Float)
    })
}

fn grad(w: &Tensor, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
    let w = w.detach().set_requires_grad(true);
    f(&w).backward();
    w.grad().copy()
}

#[test]
fn a_weight_used_twice_gets_the_float32_sum_of_its_bfloat16_gradients() {
    tch::manual_seed(21);
    let x = Tensor::randn([16, D], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([D, D], (Kind::Float, Device::Cpu)) * 0.3;

    // Each use's gradient alone (the other use reads a copy that takes no gradient): the
    // bfloat16 gradient of that use, exactly, in float32.
    let g1 = grad(&w, |w| loss(&x, w, &w.detach(), None));
    let g2 = grad(&w, |w| loss(&x, &w.detach(), w, None));
    let exact = g1.to_kind(Kind::Double) + g2.to_kind(Kind::Double);
    assert!(
        g1.equal(&g1.to_kind(Kind::BFloat16).to_kind(Kind::Float)),
        "g1 is bfloat16"
    );
    assert!(
        g2.equal(&g2.to_kind(Kind::BFloat16).to_kind(Kind::Float)),
        "g2 is bfloat16"
    );

    let plain = grad(&w, |w| loss(&x, w, w, None));
    let err = |g: &Tensor| (g.to_kind(Kind::Double) - &exact).abs();
    for both in [false, true] {
        let ckpt = grad(&w, |w| loss(&x, w, w, Some(both)));
        // The checkpointed gradient is the exact sum rounded once to float32 ...
        assert!(
            ckpt.equal(&exact.to_kind(Kind::Float)),
            "both in segments: {both}"
        );
        // ... so no element is further from it than the plain gradient's.
        let worse = err(&ckpt).gt_tensor(&err(&plain)).any().int64_value(&[]);
        assert_eq!(worse, 0, "both in segments: {both}");
    }
    // The plain gradient summed in bfloat16: it does differ (the test would be vacuous
    // otherwise), at bfloat16 level.
    let diff = (&plain - exact.to_kind(Kind::Float))
        .abs()
        .max()
        .double_value(&[]);
    let scale = exact.abs().max().double_value(&[]);
    assert!(
        diff > 0.0 && diff <= scale * 2f64.powi(-7),
        "diff {diff}, scale {scale}"
    );
}
