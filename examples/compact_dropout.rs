//! One seed-encoder block (`ckpt_models::classifier::Block`: 4 heads, d_model 256,
//! feed-forward 1024, dropout 0.1), trained forward and backward with libtorch's dropout
//! and inside `ckpt::compact_dropout`, the two taking turns step by step (the order
//! alternating): the bytes the forward holds for backward (exact, from `ckpt::memory`)
//! and the step times, with the median and range of the per-pair ratios.
//!
//! ```sh
//! cargo run --release --example compact_dropout -- --batch 16 --seq 256
//! cargo run --release --example compact_dropout -- --batch 4 --seq 1024
//! ```

use std::time::Instant;

use anyhow::Result;
use ckpt_models::classifier::{Block, ModelConfig};
use clap::Parser;
use tch::{Device, Kind, Tensor, nn};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 16)]
    batch: i64,
    #[arg(long, default_value_t = 256)]
    seq: i64,
    /// Measured pairs (after 4 unmeasured ones).
    #[arg(long, default_value_t = 12)]
    pairs: usize,
    #[arg(long, default_value_t = 2)]
    threads: i32,
}

fn main() -> Result<()> {
    let a = Args::parse();
    tch::set_num_threads(a.threads);
    let cfg = ModelConfig {
        vocab_size: 100,
        n_classes: 10,
        seq_len: a.seq,
        layers: 1,
        heads: 4,
        d_model: 256,
        ff: 1024,
        dropout: 0.1,
    };
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let block = Block::new(vs.root() / "block", &cfg);
    let bias = Tensor::zeros([a.batch * cfg.heads, 1, a.seq], (Kind::Float, Device::Cpu));
    let x = Tensor::randn([a.batch, a.seq, cfg.d_model], (Kind::Float, Device::Cpu))
        .set_requires_grad(true);
    let weight = Tensor::randn([a.batch, a.seq, cfg.d_model], (Kind::Float, Device::Cpu));
    let mut held = [0_i64; 2];
    let mut secs = [Vec::new(), Vec::new()];
    let mut ratios = Vec::new();
    for pair in 0..a.pairs + 4 {
        let mut t = [0.0; 2];
        let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let start = Instant::now();
            let before = ckpt::memory::current_bytes(Device::Cpu);
            let forward = || block.forward(&x, &bias, true);
            let y = if side == 1 {
                ckpt::compact_dropout(forward)
            } else {
                forward()
            };
            held[side] = ckpt::memory::current_bytes(Device::Cpu) - before;
            let loss = (&y * &weight).sum(Kind::Float);
            drop(y);
            let _grads = Tensor::run_backward(&[loss], &[&x], false, false);
            t[side] = start.elapsed().as_secs_f64();
        }
        if pair >= 4 {
            secs[0].push(t[0]);
            secs[1].push(t[1]);
            ratios.push(t[1] / t[0]);
        }
    }
    let spread = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let mib = |b: i64| b as f64 / (1 << 20) as f64;
    let (p, pmin, pmax) = spread(&mut secs[0]);
    let (c, cmin, cmax) = spread(&mut secs[1]);
    let (r, rmin, rmax) = spread(&mut ratios);
    println!(
        "block, batch {}, seq {}: held for backward: plain {:.2} MiB, compact {:.2} MiB ({:+.1} %)",
        a.batch,
        a.seq,
        mib(held[0]),
        mib(held[1]),
        100.0 * (held[1] - held[0]) as f64 / held[0] as f64
    );
    println!(
        "step (forward + backward), {} pairs: plain {p:.4} s ({pmin:.4}..{pmax:.4}), compact {c:.4} s ({cmin:.4}..{cmax:.4}); compact / plain per pair {r:.3} ({rmin:.3}..{rmax:.3})",
        a.pairs
    );
    Ok(())
}
