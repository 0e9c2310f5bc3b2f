//! The byte counter is on from program start: a tensor allocated before any call into
//! `ckpt` is counted (this binary has one test, so nothing else ran before it).

use tch::{Device, Kind, Tensor};

#[test]
fn tensors_allocated_before_any_ckpt_call_are_counted() {
    let t = Tensor::zeros([1 << 18], (Kind::Float, Device::Cpu)); // 1 MiB
    let counted = ckpt::memory::current_bytes(Device::Cpu);
    assert!(counted >= 1 << 20, "only {counted} bytes counted");
    let before = counted;
    drop(t);
    assert_eq!(before - ckpt::memory::current_bytes(Device::Cpu), 1 << 20);
}
