//! Smoke test: a checkpointed two-layer MLP gives the plain gradients.

use ckpt::ShallowClone;
use tch::{Device, Kind, Tensor, nn, nn::Module};

#[test]
fn mlp_grads_match() {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let l1 = nn::linear(vs.root() / "l1", 8, 16, Default::default());
    let l2 = nn::linear(vs.root() / "l2", 16, 4, Default::default());
    let x = Tensor::randn([5, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);

    let plain = l2.forward(&l1.forward(&x).relu()).sum(Kind::Float);
    plain.backward();
    let g_plain: Vec<Tensor> = vs
        .trainable_variables()
        .iter()
        .map(|v| v.grad().copy())
        .collect();
    let gx_plain = x.grad().copy();
    vs.trainable_variables().iter().for_each(|v| {
        let mut g = v.grad();
        let _ = g.zero_();
    });
    let mut gx = x.grad();
    let _ = gx.zero_();

    let (a, b) = (l1.shallow_clone(), l2.shallow_clone());
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| b.forward(&a.forward(&x).relu()),
        x.shallow_clone(),
    );
    let loss = y.sum(Kind::Float);
    assert_eq!(ckpt::live_segments(), 1);
    loss.backward();
    for (v, g) in vs.trainable_variables().iter().zip(&g_plain) {
        assert!(v.grad().equal(g));
    }
    assert!(x.grad().equal(&gx_plain));
    drop(loss);
    drop(y);
    assert_eq!(ckpt::live_segments(), 0);
}
