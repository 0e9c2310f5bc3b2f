//! What two of issue 11's fixes cost: keeping batch norm's running statistics right
//! (item 1) and keeping generator snapshots only for segments that draw random numbers
//! (item 6); and what a ResNet-18 training step costs plain and with its layer groups
//! checkpointed.
//!
//! 1. Per call: `Tensor::batch_norm` in training mode (the path of `nn::BatchNorm`: the
//!    `aten::batch_norm` entry, ckpt's kernel at the autograd key, the composite kernel,
//!    then `native_batch_norm`) against `Tensor::native_batch_norm` called directly on
//!    the same tensors. The difference is an upper bound of ckpt's kernel (one
//!    thread-local read and a call), since it includes the composite layers that were
//!    there before; it is reported for a small and a ResNet-sized input.
//! 2. Per step: the ResNet-18 of `ckpt-models` (tch's `vision::resnet`, blocks
//!    built from closures), batch 8, 3×64×64: wall time and peak tensor bytes of a
//!    forward and backward, plain and checkpointed per layer group. The running
//!    statistics add no bytes (nothing is copied or saved).
//!
//! 3. Per segment: a one-element segment's forward and backward with
//!    `preserve_rng_state` on and off, drawing a random number or not, and the tensor
//!    bytes its forward keeps: the generators are copied and compared in every forward
//!    (on), and a snapshot is kept only when the segment drew.
//!
//! 4. Per step (item 7): what making captured parameters inputs of the checkpoint node
//!    costs (the forward run watches its ops for the listed parameters; the recompute
//!    redirects their accumulators): a training step with each segment's parameters
//!    listed (`CheckpointOptions::parameters_of` / `parameters`) against the same step
//!    with them unlisted, in alternating rounds, on the seed transformer (6 layers, 4
//!    heads, d_model 256, ff 1024, dropout 0.1, seq 256, batch 16, one segment per layer)
//!    and the ResNet-18 of item 2: median step time of each side with its spread, the
//!    median of the per-round ratios, and each side's peak tensor bytes.
//!
//! `cargo run --release --example correctness_costs` (timings vary by machine; bytes are
//! exact). `-- --listing` runs only part 4.

use std::time::Instant;

use ckpt::ShallowClone;
use ckpt_models::resnet::ResNet18;
use tch::nn;
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

fn resnet_step(checkpointed: bool) {
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = ResNet18::new(&vs.root(), 10);
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

fn segment_cost(preserve_rng_state: bool, draws: bool) {
    let opts = ckpt::CheckpointOptions::new().preserve_rng_state(preserve_rng_state);
    let x = Tensor::zeros([1], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let f = move |x: Tensor| {
        if draws {
            x.dropout(0.5, true)
        } else {
            &x + 1.0
        }
    };
    let calls = 5_000;
    let micros = per_call_micros(calls, || {
        let y: Tensor = ckpt::checkpoint_with(&opts, f, x.shallow_clone());
        y.backward();
    });
    let (y, kept) = ckpt::memory::measure(Device::Cpu, || {
        ckpt::checkpoint_with(&opts, f, x.shallow_clone())
    });
    let y: Tensor = y;
    drop(y);
    println!(
        "segment of 1 element, preserve_rng_state {preserve_rng_state}, draws {draws}: \
         {micros:.1} us forward + backward, forward keeps {} B (4 B are the output)",
        kept.retained_bytes
    );
}

/// A post-norm transformer encoder layer of the seed model.
#[derive(Debug, ShallowClone)]
struct EncoderLayer {
    qkv: nn::Linear,
    out: nn::Linear,
    ff1: nn::Linear,
    ff2: nn::Linear,
    ln1: nn::LayerNorm,
    ln2: nn::LayerNorm,
    heads: i64,
}

impl EncoderLayer {
    fn new(p: &nn::Path, d: i64, heads: i64, ff: i64) -> Self {
        let lin = |name: &str, i, o| nn::linear(p / name, i, o, Default::default());
        EncoderLayer {
            qkv: lin("qkv", d, 3 * d),
            out: lin("out", d, d),
            ff1: lin("ff1", d, ff),
            ff2: lin("ff2", ff, d),
            ln1: nn::layer_norm(p / "ln1", vec![d], Default::default()),
            ln2: nn::layer_norm(p / "ln2", vec![d], Default::default()),
            heads,
        }
    }

    /// `[batch, seq, d]` to `[batch, seq, d]`, dropout 0.1 in training mode.
    fn forward(&self, xs: &Tensor) -> Tensor {
        use tch::nn::Module;
        let (b, t, d) = xs.size3().unwrap();
        let h = self.heads;
        let split = |x: Tensor| x.view([b, t, h, d / h]).transpose(1, 2);
        let qkv = self.qkv.forward(xs).chunk(3, -1);
        let (q, k, v) = (
            split(qkv[0].shallow_clone()),
            split(qkv[1].shallow_clone()),
            split(qkv[2].shallow_clone()),
        );
        let att = (q.matmul(&k.transpose(-2, -1)) / ((d / h) as f64).sqrt())
            .softmax(-1, Kind::Float)
            .dropout(0.1, true);
        let ctx = att.matmul(&v).transpose(1, 2).contiguous().view([b, t, d]);
        let xs = self
            .ln1
            .forward(&(xs + self.out.forward(&ctx).dropout(0.1, true)));
        let ff = self
            .ff2
            .forward(&self.ff1.forward(&xs).gelu("none"))
            .dropout(0.1, true);
        self.ln2.forward(&(xs + ff))
    }
}

/// Median, first and third quartile of `v`.
fn quartiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

/// Alternating rounds of `step(listed)` (unlisted first in odd rounds, listed first in
/// even ones): step times and peaks of each side, and the per-round ratios.
fn listing_rounds(what: &str, rounds: usize, step: impl Fn(bool) -> i64) {
    step(false); // .grad tensors, lazy initialisation
    step(true);
    let (mut times, mut peaks) = ([Vec::new(), Vec::new()], [0, 0]);
    for r in 0..rounds {
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for listed in order {
            let start = Instant::now();
            peaks[listed as usize] = step(listed);
            times[listed as usize].push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let ratios: Vec<f64> = times[1].iter().zip(&times[0]).map(|(l, u)| l / u).collect();
    let [(u, u1, u3), (l, l1, l3)] = [quartiles(times[0].clone()), quartiles(times[1].clone())];
    let (ratio, r1, r3) = quartiles(ratios);
    println!(
        "{what}, {rounds} alternating rounds: unlisted {u:.1} ms (IQR {u1:.1}-{u3:.1}), \
         peak {} B; listed {l:.1} ms (IQR {l1:.1}-{l3:.1}), peak {} B; \
         listed / unlisted per round {ratio:.3} (IQR {r1:.3}-{r3:.3})",
        peaks[0], peaks[1]
    );
}

fn listing_cost() {
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let layers: Vec<EncoderLayer> = (0..6)
        .map(|i| EncoderLayer::new(&(vs.root() / i), 256, 4, 1024))
        .collect();
    let x = Tensor::randn([16, 256, 256], (Kind::Float, Device::Cpu));
    listing_rounds("seed transformer [16, 256, 256], 6 segments", 7, |listed| {
        let ((), report) = ckpt::memory::measure(Device::Cpu, || {
            let mut h = x.shallow_clone();
            for layer in &layers {
                let opts = ckpt::CheckpointOptions::new();
                let opts = if listed {
                    opts.parameters_of(layer)
                } else {
                    opts
                };
                let layer = layer.shallow_clone();
                h = ckpt::checkpoint_with(&opts, move |x: Tensor| layer.forward(&x), h);
            }
            h.square().mean(Kind::Float).backward();
        });
        report.peak_above_baseline_bytes
    });

    let vs = nn::VarStore::new(Device::Cpu);
    let net = ResNet18::new(&vs.root(), 10);
    let params = vs.trainable_variables();
    let x = Tensor::randn([8, 3, 64, 64], (Kind::Float, Device::Cpu));
    listing_rounds("ResNet-18 [8, 3, 64, 64], 4 layer groups", 7, |listed| {
        let ((), report) = ckpt::memory::measure(Device::Cpu, || {
            let params: &[Tensor] = if listed { &params } else { &[] };
            net.forward_listing(&x, true, true, params)
                .square()
                .mean(Kind::Float)
                .backward();
        });
        report.peak_above_baseline_bytes
    });
}

fn main() {
    tch::set_num_threads(1);
    if std::env::args().any(|a| a == "--listing") {
        listing_cost();
        return;
    }
    batch_norm_entry(&[2, 4, 2, 2], 20_000);
    batch_norm_entry(&[8, 64, 16, 16], 2_000);
    resnet_step(false);
    resnet_step(true);
    for (preserve, draws) in [(false, false), (true, false), (false, true), (true, true)] {
        segment_cost(preserve, draws);
    }
    listing_cost();
}
