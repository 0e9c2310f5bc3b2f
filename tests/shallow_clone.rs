//! `ShallowClone` for tch's layers: the clone computes exactly what the original does,
//! gradients through it land in the original's variables, and state it updates (batch
//! norm's running statistics) is the original's.

use ckpt::{ShallowClone, Shared};
use tch::nn::{self, Module, ModuleT, RNN};
use tch::{Device, Kind, Tensor};

/// Forward through `layer` and through its shallow clone give equal outputs, and the
/// clone's backward fills the `.grad` of the original's variables.
fn check<M: Module + ShallowClone>(what: &str, vs: &nn::VarStore, layer: &M, x: &Tensor) {
    let want = layer.forward(x);
    let clone = layer.shallow_clone();
    let got = clone.forward(x);
    assert!(got.equal(&want), "{what}: clone computes something else");
    drop(clone);
    got.square().sum(Kind::Float).backward();
    for (name, v) in vs.variables() {
        if v.requires_grad() {
            assert!(v.grad().defined(), "{what}: no gradient reached `{name}`");
            assert!(
                v.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0,
                "{what}: zero gradient at `{name}`"
            );
        }
    }
}

fn randn(dims: &[i64]) -> Tensor {
    Tensor::randn(dims, (Kind::Float, Device::Cpu))
}

#[test]
fn linear() {
    let vs = nn::VarStore::new(Device::Cpu);
    check(
        "linear",
        &vs,
        &nn::linear(vs.root(), 4, 3, Default::default()),
        &randn(&[2, 4]),
    );
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = nn::LinearConfig {
        bias: false,
        ..Default::default()
    };
    check(
        "linear without bias",
        &vs,
        &nn::linear(vs.root(), 4, 3, cfg),
        &randn(&[2, 4]),
    );
}

#[test]
fn convolutions_with_every_padding_mode() {
    for mode in [
        nn::PaddingMode::Zeros,
        nn::PaddingMode::Reflect,
        nn::PaddingMode::Replicate,
        nn::PaddingMode::Circular,
    ] {
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = nn::ConvConfig {
            stride: 2,
            padding: 1,
            dilation: 1,
            groups: 2,
            padding_mode: mode,
            ..Default::default()
        };
        check(
            &format!("conv2d {mode:?}"),
            &vs,
            &nn::conv2d(vs.root(), 4, 6, 3, cfg),
            &randn(&[1, 4, 9, 9]),
        );
    }
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = nn::ConvConfig {
        padding: 2,
        dilation: 2,
        bias: false,
        ..Default::default()
    };
    check(
        "conv1d",
        &vs,
        &nn::conv1d(vs.root(), 3, 5, 3, cfg),
        &randn(&[2, 3, 11]),
    );
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = nn::ConvConfigND {
        stride: [1, 2, 1],
        padding: [0, 1, 1],
        dilation: [1, 1, 1],
        groups: 1,
        bias: true,
        ws_init: nn::Init::Randn {
            mean: 0.,
            stdev: 0.1,
        },
        bs_init: nn::Init::Const(0.1),
        padding_mode: nn::PaddingMode::Zeros,
    };
    check(
        "conv3d",
        &vs,
        &nn::conv(vs.root(), 2, 3, [2, 3, 3], cfg),
        &randn(&[1, 2, 4, 6, 5]),
    );
}

#[test]
fn transposed_convolutions() {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = nn::ConvTransposeConfig {
        stride: 2,
        padding: 1,
        output_padding: 1,
        ..Default::default()
    };
    check(
        "conv_transpose2d",
        &vs,
        &nn::conv_transpose2d(vs.root(), 3, 4, 3, cfg),
        &randn(&[1, 3, 5, 5]),
    );
    let vs = nn::VarStore::new(Device::Cpu);
    check(
        "conv_transpose1d",
        &vs,
        &nn::conv_transpose1d(vs.root(), 3, 2, 4, Default::default()),
        &randn(&[2, 3, 7]),
    );
}

#[test]
fn normalisations() {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = nn::LayerNormConfig {
        eps: 1e-3,
        ..Default::default()
    };
    check(
        "layer_norm",
        &vs,
        &nn::layer_norm(vs.root(), vec![5, 6], cfg),
        &randn(&[3, 5, 6]),
    );
    let vs = nn::VarStore::new(Device::Cpu);
    check(
        "group_norm",
        &vs,
        &nn::group_norm(vs.root(), 2, 6, Default::default()),
        &randn(&[3, 6, 4]),
    );
}

#[test]
fn batch_norm_shares_running_statistics() {
    let vs = nn::VarStore::new(Device::Cpu);
    let bn = nn::batch_norm2d(
        vs.root(),
        3,
        nn::BatchNormConfig {
            momentum: 0.5,
            ..Default::default()
        },
    );
    let x = randn(&[4, 3, 2, 2]) * 3.0 + 1.0;
    let clone = bn.shallow_clone();
    let _ = clone.forward_t(&x, true);
    let mean = x.mean_dim([0i64, 2, 3].as_slice(), false, Kind::Float);
    assert!(
        bn.running_mean.allclose(&(&mean * 0.5), 1e-6, 1e-6, false),
        "the original's statistics moved"
    );
    let y_eval_orig = bn.forward_t(&x, false);
    let y_eval_clone = clone.forward_t(&x, false);
    assert!(y_eval_orig.equal(&y_eval_clone));
}

#[test]
fn embedding_keeps_its_configuration() {
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = nn::EmbeddingConfig {
        padding_idx: 0,
        ..Default::default()
    };
    let emb = nn::embedding(vs.root(), 10, 4, cfg);
    let ids = Tensor::from_slice(&[0i64, 3, 0, 9]);
    check("embedding", &vs, &emb, &ids);
    let g = emb.ws.grad();
    assert!(
        g.get(0).abs().sum(Kind::Float).double_value(&[]) == 0.0,
        "padding_idx row gets no gradient"
    );
}

#[test]
fn lstm_through_shared() {
    let vs = nn::VarStore::new(Device::Cpu);
    let lstm = Shared::new(nn::lstm(vs.root(), 4, 5, Default::default()));
    let x = randn(&[2, 3, 4]);
    let (plain, _) = lstm.lock().seq(&x);
    plain.sum(Kind::Float).backward();
    let want: Vec<Tensor> = vs
        .trainable_variables()
        .iter()
        .map(|v| v.grad().copy())
        .collect();
    for v in vs.trainable_variables() {
        let _ = v.grad().zero_();
    }
    let clone = lstm.shallow_clone();
    let y: Tensor = ckpt::checkpoint(move |x: Tensor| clone.lock().seq(&x).0, x.shallow_clone());
    // The segment's forward runs without grad, where libtorch's oneDNN LSTM takes its
    // inference path (last bits differ from grad mode on AVX2 and newer CPUs): the output
    // is the no-grad layer's, bit for bit; the gradients, from the grad-mode recompute,
    // are the plain layer's, bit for bit.
    let nograd = tch::no_grad(|| lstm.lock().seq(&x).0);
    assert!(y.equal(&nograd));
    y.sum(Kind::Float).backward();
    let got: Vec<Tensor> = vs.trainable_variables().iter().map(|v| v.grad()).collect();
    assert_eq!(got.len(), 4);
    for (g, w) in got.iter().zip(&want) {
        assert!(g.equal(w), "gradient differs from the plain layer's");
    }
}

#[test]
fn containers() {
    let a = randn(&[2]).set_requires_grad(true);
    let v = vec![Some(a.shallow_clone()), None];
    let c = v.shallow_clone();
    assert!(c[0].as_ref().unwrap().equal(&a) && c[1].is_none());
    let t = (a.shallow_clone(), 3usize, [a.shallow_clone()]);
    let u = t.shallow_clone();
    assert_eq!(u.1, 3);
    (u.0 * 2.0 + &u.2[0]).sum(Kind::Float).backward();
    assert!(
        a.grad().equal(&Tensor::from_slice(&[3.0f32, 3.0])),
        "the clones are the same autograd leaf"
    );
}
