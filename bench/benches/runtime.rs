//! Runtime benchmarks (criterion): what one checkpointed segment costs on tiny tensors,
//! and a training step of the 16-layer MLP chain of `tests/memory.rs`, plain and with
//! 4 segments. Run with `cargo bench -p ckpt-bench --bench runtime`; criterion prints medians.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tch::nn::Module;
use tch::{Device, Kind, Tensor};

/// Forward + backward of `x * 2 + 1` on a 4-element tensor, unchecked and as a
/// checkpointed segment: the difference is the node's per-call overhead.
fn segment_overhead(c: &mut Criterion) {
    tch::set_num_threads(1);
    let x = Tensor::randn([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let mut g = c.benchmark_group("segment_overhead");
    g.bench_function("plain", |b| {
        b.iter(|| {
            let y = &x * 2.0 + 1.0;
            y.sum(Kind::Float).backward();
        })
    });
    g.bench_function("checkpointed", |b| {
        b.iter(|| {
            let y: Tensor = ckpt::checkpoint(|x: Tensor| x * 2.0 + 1.0, x.shallow_clone());
            y.sum(Kind::Float).backward();
        })
    });
    g.finish();
}

/// One training step (forward + backward) of 16 Linear+GELU layers, [512, 256] floats.
fn mlp16_step(c: &mut Criterion) {
    tch::set_num_threads(2);
    let (_vs, layers) = ckpt_models::mlp::gelu_chain(16, 256);
    let x = Tensor::randn([512, 256], (Kind::Float, Device::Cpu));
    let mut g = c.benchmark_group("mlp16_step");
    g.sample_size(30);
    for segments in [0usize, 4] {
        g.bench_with_input(
            BenchmarkId::from_parameter(if segments == 0 {
                "plain".to_owned()
            } else {
                format!("{segments}_segments")
            }),
            &segments,
            |b, &s| {
                b.iter(|| {
                    let y = if s == 0 {
                        layers.iter().fold(x.shallow_clone(), |h, l| l.forward(&h))
                    } else {
                        ckpt::checkpoint_sequential(&layers, s, &x)
                    };
                    y.sum(Kind::Float).backward();
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, segment_overhead, mlp16_step);
criterion_main!(benches);
