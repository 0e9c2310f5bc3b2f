//! Randomness: dropout inside checkpointed segments. The global generator is shared by
//! every thread of a test binary, so these tests live in their own binary and take a
//! lock: another test drawing random numbers between `manual_seed` and the run would
//! change the masks.

mod common;

use std::sync::{Mutex, MutexGuard};

use ckpt::{CheckpointOptions, ShallowClone};
use common::{assert_all_equal, grads_of, input, params};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

static RNG: Mutex<()> = Mutex::new(());

fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// A linear layer, ReLU, then dropout with probability `p` (honouring the train flag).
#[derive(Debug, ckpt::ShallowClone)]
struct LinearDropout {
    lin: nn::Linear,
    p: f64,
}

impl ModuleT for LinearDropout {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        self.lin.forward(xs).relu().dropout(self.p, train)
    }
}

/// Dropout inside a segment: with `preserve_rng_state` the recompute draws the same mask.
#[test]
fn dropout_inside_a_segment_matches_plain() {
    let _rng = rng();
    let vs = nn::VarStore::new(Device::Cpu);
    tch::manual_seed(5);
    let l1 = nn::linear(vs.root() / "l1", 32, 64, Default::default());
    let l2 = nn::linear(vs.root() / "l2", 64, 32, Default::default());
    let x = input(&[8, 32]);
    let ps = params(&vs);
    let f = |l1: &nn::Linear, l2: &nn::Linear, x: &Tensor| {
        l2.forward(&l1.forward(x).relu().dropout(0.5, true))
            .dropout(0.3, true)
    };

    tch::manual_seed(99);
    let plain = f(&l1, &l2, &x).sum(Kind::Float);
    let want = grads_of(&plain, &ps);
    let after_plain = Tensor::rand([4], (Kind::Float, Device::Cpu));

    tch::manual_seed(99);
    let (a, b) = (l1.shallow_clone(), l2.shallow_clone());
    let y: Tensor = ckpt::checkpoint(move |x: Tensor| f(&a, &b, &x), x.shallow_clone());
    let loss = y.sum(Kind::Float);
    assert!(loss.equal(&plain), "same seed, same masks, same forward");
    assert_all_equal("grads", &grads_of(&loss, &ps), &want);
    // Fork semantics: backward restored the generator to where the forward left it.
    let after_ckpt = Tensor::rand([4], (Kind::Float, Device::Cpu));
    assert!(
        after_ckpt.equal(&after_plain),
        "the RNG stream after backward is unchanged"
    );
}

/// Without `preserve_rng_state` the recompute draws fresh masks: gradients differ from
/// the plain run (which shows the option does something).
#[test]
fn dropout_without_preserved_rng_state_differs() {
    let _rng = rng();
    let vs = nn::VarStore::new(Device::Cpu);
    tch::manual_seed(6);
    let l = nn::linear(vs.root() / "l", 64, 64, Default::default());
    let x = input(&[16, 64]);
    let ps = params(&vs);
    tch::manual_seed(7);
    let plain = l.forward(&x).dropout(0.5, true).sum(Kind::Float);
    let want = grads_of(&plain, &ps);
    tch::manual_seed(7);
    let lc = l.shallow_clone();
    let opts = CheckpointOptions::new().preserve_rng_state(false);
    let y: Tensor = ckpt::checkpoint_with(
        &opts,
        move |x: Tensor| lc.forward(&x).dropout(0.5, true),
        x.shallow_clone(),
    );
    let got = grads_of(&y.sum(Kind::Float), &ps);
    assert!(
        !got[0].equal(&want[0]),
        "fresh masks in recompute give different gradients"
    );
}

/// `ModuleT` chains get the train flag: dropout masks match the plain run (same seed).
#[test]
fn module_t_chain_with_dropout() {
    let _rng = rng();
    let vs = nn::VarStore::new(Device::Cpu);
    tch::manual_seed(20);
    let blocks: Vec<LinearDropout> = (0..6)
        .map(|i| LinearDropout {
            lin: nn::linear(vs.root() / i, 16, 16, Default::default()),
            p: 0.25,
        })
        .collect();
    let x = input(&[8, 16]);
    let ps = params(&vs);
    for train in [true, false] {
        tch::manual_seed(21);
        let plain = blocks
            .iter()
            .fold(x.shallow_clone(), |h, b| b.forward_t(&h, train))
            .sum(Kind::Float);
        let want = grads_of(&plain, &ps);
        tch::manual_seed(21);
        let loss = ckpt::checkpoint_sequential_t(&blocks, 3, &x, train).sum(Kind::Float);
        assert!(loss.equal(&plain), "train = {train}");
        assert_all_equal(&format!("train = {train}"), &grads_of(&loss, &ps), &want);
    }
}

/// Profiling for `segments = auto` runs dropout stages again, but it saves and restores
/// the generators' states: the random stream after it is the stream before it, so a
/// seeded first step draws the masks an unprofiled one would.
#[test]
fn profiling_leaves_the_random_stream_alone() {
    let _rng = rng();
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks: Vec<LinearDropout> = (0..4)
        .map(|i| LinearDropout {
            lin: nn::linear(vs.root() / i, 8, 8, Default::default()),
            p: 0.5,
        })
        .collect();
    let x = input(&[4, 8]);
    tch::manual_seed(30);
    let want = Tensor::rand([6], (Kind::Float, Device::Cpu));
    tch::manual_seed(30);
    let cost = ckpt::plan::profile_sequential_t(&blocks, &x, true);
    assert_eq!(cost.len(), 4);
    let got = Tensor::rand([6], (Kind::Float, Device::Cpu));
    assert!(got.equal(&want), "profiling moved the random stream");
}
