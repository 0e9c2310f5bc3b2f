//! What keeping batch norm's running statistics right costs (issue 11, item 1), and what
//! a ResNet-18 training step costs plain and with its layer groups checkpointed.
//!
//! 1. Per call: `Tensor::batch_norm` in training mode (the path of `nn::BatchNorm`: the
//!    `aten::batch_norm` entry, ckpt's kernel at the autograd key, the composite kernel,
//!    then `native_batch_norm`) against `Tensor::native_batch_norm` called directly on
//!    the same tensors. The difference is an upper bound of ckpt's kernel (one
//!    thread-local read and a call), since it includes the composite layers that were
//!    there before; it is reported for a small and a ResNet-sized input.
//! 2. Per step: the ResNet-18 of `tests/batch_norm.rs` (tch's `vision::resnet`, blocks
//!    built from closures), batch 8, 3×64×64: wall time and peak tensor bytes of a
//!    forward and backward, plain and checkpointed per layer group. The running
//!    statistics add no bytes (nothing is copied or saved).
//!
//! `cargo run --release --example batch_norm_cost` (timings vary by machine; bytes are
//! exact).

use std::time::Instant;

use ckpt::{ShallowClone, Shared};
use tch::nn::{self, ModuleT};
use tch::{Device, Kind, Tensor};

fn per_call_micros(calls: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..calls / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..calls {
        f();
    }
    start.elapsed().as_secs_f64() * 1e6 / calls as f64
}

fn batch_norm_entry(shape: &[i64], calls: usize) {
    let x = Tensor::randn(shape, (Kind::Float, Device::Cpu));
    let c = shape[1];
    let w = Tensor::ones([c], (Kind::Float, Device::Cpu));
    let b = Tensor::zeros([c], (Kind::Float, Device::Cpu));
    let mean = Tensor::zeros([c], (Kind::Float, Device::Cpu));
    let var = Tensor::ones([c], (Kind::Float, Device::Cpu));
    let mut rounds = Vec::new();
    for _ in 0..5 {
        let entry = per_call_micros(calls, || {
            let _ = Tensor::batch_norm(
                &x,
                Some(&w),
                Some(&b),
                Some(&mean),
                Some(&var),
                true,
                0.1,
                1e-5,
                false,
            );
        });
        let kernel = per_call_micros(calls, || {
            let _ = Tensor::native_batch_norm(
                &x,
                Some(&w),
                Some(&b),
                Some(&mean),
                Some(&var),
                true,
                0.1,
                1e-5,
            );
        });
        rounds.push((entry, kernel));
    }
    // The median round by the difference.
    rounds.sort_by(|a, b| (a.0 - a.1).total_cmp(&(b.0 - b.1)));
    let (entry, kernel) = rounds[rounds.len() / 2];
    println!(
        "batch_norm {shape:?}, training: aten::batch_norm {entry:.2} us/call, \
         native_batch_norm {kernel:.2} us/call, entry layers incl. ckpt's kernel {:.2} us",
        entry - kernel
    );
}

fn conv2d(p: nn::Path, c_in: i64, c_out: i64, ksize: i64, padding: i64, stride: i64) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        bias: false,
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, ksize, cfg)
}

fn downsample(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> impl ModuleT + use<> {
    if stride != 1 || c_in != c_out {
        nn::seq_t()
            .add(conv2d(&p / "0", c_in, c_out, 1, 0, stride))
            .add(nn::batch_norm2d(&p / "1", c_out, Default::default()))
    } else {
        nn::seq_t()
    }
}

fn basic_block(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> impl ModuleT + use<> {
    let conv1 = conv2d(&p / "conv1", c_in, c_out, 3, 1, stride);
    let bn1 = nn::batch_norm2d(&p / "bn1", c_out, Default::default());
    let conv2 = conv2d(&p / "conv2", c_out, c_out, 3, 1, 1);
    let bn2 = nn::batch_norm2d(&p / "bn2", c_out, Default::default());
    let downsample = downsample(&p / "downsample", c_in, c_out, stride);
    nn::func_t(move |xs, train| {
        let ys = xs
            .apply(&conv1)
            .apply_t(&bn1, train)
            .relu()
            .apply(&conv2)
            .apply_t(&bn2, train);
        (xs.apply_t(&downsample, train) + ys).relu()
    })
}

fn basic_layer(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> nn::SequentialT {
    nn::seq_t()
        .add(basic_block(&p / "0", c_in, c_out, stride))
        .add(basic_block(&p / "1", c_out, c_out, 1))
}

struct ResNet18 {
    conv1: nn::Conv2D,
    bn1: nn::BatchNorm,
    layers: Vec<Shared<nn::SequentialT>>,
    fc: nn::Linear,
}

impl ResNet18 {
    fn new(p: &nn::Path) -> Self {
        ResNet18 {
            conv1: conv2d(p / "conv1", 3, 64, 7, 3, 2),
            bn1: nn::batch_norm2d(p / "bn1", 64, Default::default()),
            layers: vec![
                Shared::new(basic_layer(p / "layer1", 64, 64, 1)),
                Shared::new(basic_layer(p / "layer2", 64, 128, 2)),
                Shared::new(basic_layer(p / "layer3", 128, 256, 2)),
                Shared::new(basic_layer(p / "layer4", 256, 512, 2)),
            ],
            fc: nn::linear(p / "fc", 512, 10, Default::default()),
        }
    }

    fn forward_t(&self, xs: &Tensor, train: bool, checkpointed: bool) -> Tensor {
        let mut xs = xs
            .apply(&self.conv1)
            .apply_t(&self.bn1, train)
            .relu()
            .max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        for layer in &self.layers {
            xs = if checkpointed {
                let layer = layer.shallow_clone();
                ckpt::checkpoint(move |x: Tensor| layer.lock().forward_t(&x, train), xs)
            } else {
                layer.lock().forward_t(&xs, train)
            };
        }
        xs.adaptive_avg_pool2d([1, 1]).flat_view().apply(&self.fc)
    }
}

fn resnet_step(checkpointed: bool) {
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = ResNet18::new(&vs.root());
    let x = Tensor::randn([8, 3, 64, 64], (Kind::Float, Device::Cpu));
    let step = || {
        let ((), report) = ckpt::memory::measure(Device::Cpu, || {
            net.forward_t(&x, true, checkpointed)
                .square()
                .mean(Kind::Float)
                .backward();
        });
        report
    };
    step(); // .grad tensors, lazy initialisation
    let mut times = Vec::new();
    let mut peak = 0;
    for _ in 0..5 {
        let start = Instant::now();
        peak = step().peak_above_baseline_bytes;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "ResNet-18 [8, 3, 64, 64] train step, {}: {:.1} ms (median of 5), peak {peak} B",
        if checkpointed {
            "layer groups checkpointed"
        } else {
            "plain"
        },
        times[2]
    );
}

fn main() {
    tch::set_num_threads(1);
    batch_norm_entry(&[2, 4, 2, 2], 20_000);
    batch_norm_entry(&[8, 64, 16, 16], 2_000);
    resnet_step(false);
    resnet_step(true);
}
