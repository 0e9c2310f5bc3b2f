//! All-reduce bandwidth of `ckpt::dist` (c10d's Gloo from libtorch) over loopback, the
//! counterpart of `bench/dist_allreduce_torch.py` (PyTorch's `torch.distributed`, same
//! libtorch, launched by torchrun).
//!
//! ```sh
//! cargo run --release --example dist_allreduce -- --nproc 2
//! ```
//!
//! `--nproc N` starts N workers on this machine with the variables torchrun sets
//! (`ckpt::dist::relaunch_self`); the program also runs under
//! `torchrun --no-python --nproc-per-node N`. Rank 0 prints one JSON line: the median
//! seconds of a sum all-reduce of `--numel` float32 values, the algorithm bandwidth
//! (bytes / second) and the bus bandwidth (algorithm bandwidth x 2 (n - 1) / n, the
//! bytes each rank sends and receives in a ring, as nccl-tests reports it).

use std::ffi::OsString;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use tch::{Device, Kind, Tensor};

#[derive(Parser, Debug)]
struct Args {
    /// Start this many workers on this machine (0: run as a worker of an outer launcher).
    #[arg(long, default_value_t = 0)]
    nproc: usize,
    /// Float32 values all-reduced.
    #[arg(long, default_value_t = 10_000_000)]
    numel: i64,
    /// Timed all-reduces (after 3 untimed ones).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Intra-op threads of each worker.
    #[arg(long, default_value_t = 1)]
    threads: i32,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // Relaunch as `--nproc` workers, passing the other arguments on.
    let rest: Vec<OsString> = vec![
        "--numel".into(),
        args.numel.to_string().into(),
        "--iters".into(),
        args.iters.to_string().into(),
        "--threads".into(),
        args.threads.to_string().into(),
    ];
    if let Some(result) = ckpt::dist::relaunch_self(args.nproc, rest)? {
        if !result.success() {
            bail!("a worker failed: {:?}", result.status);
        }
        return Ok(());
    }
    tch::set_num_threads(args.threads);
    let pg = ckpt::dist::f_init_from_env().context("join the process group")?;
    let t = Tensor::ones([args.numel], (Kind::Float, Device::Cpu));
    for _ in 0..3 {
        pg.f_all_reduce(&t, ckpt::dist::ReduceOp::Sum)?;
    }
    let mut secs = Vec::with_capacity(args.iters);
    for _ in 0..args.iters {
        pg.f_barrier()?;
        let start = Instant::now();
        pg.f_all_reduce(&t, ckpt::dist::ReduceOp::Sum)?;
        secs.push(start.elapsed().as_secs_f64());
    }
    secs.sort_by(f64::total_cmp);
    let median = secs[secs.len() / 2];
    if pg.rank() == 0 {
        let n = pg.world_size() as f64;
        let bytes = args.numel as f64 * 4.0;
        let algbw = bytes / median;
        println!(
            "{}",
            serde_json::json!({
                "side": "ckpt",
                "world_size": pg.world_size(),
                "numel": args.numel,
                "threads": args.threads,
                "median_seconds": median,
                "algbw_bytes_per_second": algbw,
                "busbw_bytes_per_second": algbw * 2.0 * (n - 1.0) / n,
            })
        );
    }
    Ok(())
}
