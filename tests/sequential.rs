//! `ckpt::checkpoint_sequential`: PyTorch's grouping, any `segments >= 1`, gradients
//! equal to the plain chain bit for bit.

mod common;

use ckpt::{CkptError, ShallowClone};
use common::{assert_all_equal, grads_of, input, params};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

/// A block with its own non-linearity, so a chain of them is a deep MLP.
#[derive(Debug)]
struct Block(nn::Linear);

impl ShallowClone for Block {
    fn shallow_clone(&self) -> Self {
        Block(self.0.shallow_clone())
    }
}

impl Module for Block {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + self.0.forward(xs).tanh()
    }
}

#[test]
fn every_layer_count_against_every_segment_count() {
    for layers in 1..=9usize {
        let vs = nn::VarStore::new(Device::Cpu);
        tch::manual_seed(layers as i64);
        let blocks: Vec<Block> = (0..layers)
            .map(|i| Block(nn::linear(vs.root() / i, 12, 12, Default::default())))
            .collect();
        let x = input(&[3, 12]);
        let mut ps = params(&vs);
        ps.push(x.shallow_clone());
        let plain = blocks
            .iter()
            .fold(x.shallow_clone(), |h, b| b.forward(&h))
            .sum(Kind::Float);
        let want = grads_of(&plain, &ps);
        for segments in 1..=12usize {
            let y = ckpt::checkpoint_sequential(&blocks, segments, &x);
            let loss = y.sum(Kind::Float);
            assert!(
                loss.equal(&plain),
                "{layers} layers, {segments} segments: forward differs"
            );
            let got = grads_of(&loss, &ps);
            assert_all_equal(
                &format!("{layers} layers, {segments} segments"),
                &got,
                &want,
            );
        }
    }
}

#[test]
fn grouping_follows_pytorch() {
    let s = ckpt::sequential_segments;
    assert_eq!(s(6, 3).unwrap(), vec![0..2, 2..4, 4..6]);
    assert_eq!(s(6, 1).unwrap(), vec![0..6]);
    assert_eq!(
        s(7, 3).unwrap(),
        vec![0..2, 2..4, 4..7],
        "the remainder joins the last group"
    );
    assert_eq!(s(9, 4).unwrap(), vec![0..2, 2..4, 4..6, 6..9]);
    assert_eq!(
        s(3, 12).unwrap(),
        vec![0..1, 1..2, 2..3],
        "clamped to the module count"
    );
    assert_eq!(s(0, 2).unwrap(), vec![0..0]);
}

#[test]
fn zero_segments_is_an_error() {
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = vec![Block(nn::linear(vs.root() / "a", 2, 2, Default::default()))];
    let x = input(&[1, 2]);
    let err = ckpt::f_checkpoint_sequential(&blocks, 0, &x).unwrap_err();
    assert!(matches!(err, CkptError::InvalidArgument(_)));
    assert!(err.to_string().contains("segments = 0"), "{err}");
    let err = ckpt::sequential_segments(4, 0).unwrap_err();
    assert!(err.to_string().contains("at least one segment"), "{err}");
    let panic =
        std::panic::catch_unwind(|| ckpt::checkpoint_sequential(&blocks, 0, &x)).unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    assert!(msg.contains("segments = 0"), "{msg}");
}
