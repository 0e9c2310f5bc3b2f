//! `ckpt-frontier`: the memory/time frontier of checkpointing policies on the seed
//! transformer, ckpt against PyTorch's selective activation checkpointing, measured in
//! interleaved rounds. `bench/frontier.sh` builds it and the byte meter and passes the
//! paths; it writes `FRONTIER.md`, `frontier.json` and `frontier.png` into `--out`.
//!
//! Method: for each configuration, each round runs one ckpt process and one PyTorch
//! process (`frontier_torch.py`), in alternating order (ckpt first in odd rounds); inside
//! a process every point of the configuration trains side by side, the points taking
//! turns step by step. A point's time in a round is the median of its measured steps; the
//! report gives the median over rounds, the spread (min..max), and the median of the
//! per-round ratios (ckpt / PyTorch for the same point, and each point / plain of the
//! same process). Peak bytes come from one counter on both sides (`ckpt::memory`'s
//! counting allocator; the PyTorch process loads it from `libckpt_bench.so`) and must be
//! equal in every round.

mod report;
mod side;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use ckpt_bench::util::last_json_line;
use clap::{Parser, Subcommand};
use serde_json::json;

use side::{Point, PointResult, Shape};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Runs every configuration in interleaved rounds and writes the report.
    Run(RunArgs),
    /// One ckpt process of a round (run by `run`; prints JSON on its last line).
    #[command(hide = true)]
    Side {
        /// The configuration's shape, as JSON.
        #[arg(long)]
        shape: String,
        /// The points, as JSON.
        #[arg(long)]
        points: String,
        #[arg(long)]
        threads: i32,
    },
}

#[derive(Debug, Clone, clap::Args)]
struct RunArgs {
    /// Rounds per configuration (each runs both sides once, alternating which is first).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Only the seq-256 configuration, 2 rounds, 1 + 2 steps: a smoke run.
    #[arg(long)]
    quick: bool,
    /// Unmeasured steps a process before the heap reserve (the first profiles the budget
    /// points' plans; the heap grows over several more: `side::HEAP_RESERVE_BYTES`).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Measured steps a process (a point's time in a round is their median).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// The PyTorch side's script.
    #[arg(long, default_value = "bench/frontier_torch.py")]
    script: PathBuf,
    /// Directory for FRONTIER.md, frontier.json and frontier.png.
    #[arg(long, default_value = "bench")]
    out: PathBuf,
    /// What both programs take: threads, the PyTorch side, the report's header.
    #[command(flatten)]
    common: ckpt_bench::util::CommonArgs,
    /// Read a configuration's rounds from `<out>/frontier_raw/` when all of them are
    /// there (an earlier run's), measuring only the others; the report says which.
    #[arg(long)]
    reuse_raw: bool,
    /// Only the configuration of this name (`seq256-batch16` or `seq1024-batch4`).
    #[arg(long)]
    only: Option<String>,
    /// The `GLIBC_TUNABLES` both sides' processes run with, for the report's header
    /// (`bench/frontier.sh` sets and passes it); empty: glibc's defaults.
    #[arg(long, default_value = "")]
    malloc: String,
}

/// One configuration: a name, a shape, and its points.
#[derive(Debug, Clone)]
struct Config {
    name: String,
    shape: Shape,
    points: Vec<Point>,
    /// Its rounds were read from an earlier run's raw results (`--reuse-raw`).
    reused: bool,
}

fn configs(quick: bool, warmup: usize, steps: usize) -> Vec<Config> {
    let points = |segments: &[usize]| {
        let mut p = vec![Point::Plain];
        p.extend(segments.iter().map(|&segments| Point::Full { segments }));
        p.extend([
            Point::Selective { segments: 3 },
            Point::Masks { segments: 3 },
            Point::Narrowing { segments: 3 },
            Point::SelectiveMasks { segments: 3 },
        ]);
        // 30, 50 and 70 % as the issue asks; 40 % lands near 60 % less than plain, where
        // the time goal sits.
        p.extend([0.3, 0.4, 0.5, 0.7].map(|fraction| Point::Budget { fraction }));
        // Compact dropout holds a block's masks as bits: a compact plain run needs about
        // 70 % of plain's bytes, so 55 % of it lands near 60 % less than plain.
        p.extend([Point::Compact, Point::CompactBudget { fraction: 0.55 }]);
        p
    };
    let (warmup, steps) = if quick {
        (1, 2)
    } else {
        (warmup.max(1), steps.max(1))
    };
    let shape = |seq, batch| Shape {
        seq,
        batch,
        warmup,
        steps,
    };
    let mut all = vec![Config {
        name: "seq256-batch16".into(),
        shape: shape(256, 16),
        points: points(&[3, 6]),
        reused: false,
    }];
    if !quick {
        all.push(Config {
            name: "seq1024-batch4".into(),
            shape: shape(1024, 4),
            points: points(&[3, 6]),
            reused: false,
        });
    }
    all
}

/// One process of one side: its points' results.
fn one_side(args: &RunArgs, cfg: &Config, ckpt_side: bool) -> Result<Vec<PointResult>> {
    let shape = serde_json::to_string(&cfg.shape)?;
    let value = if ckpt_side {
        let points = serde_json::to_string(&cfg.points)?;
        last_json_line(
            Command::new(std::env::current_exe().context("cannot find this program")?)
                .args(["side", "--shape", &shape, "--points", &points])
                .arg("--threads")
                .arg(args.common.threads.to_string()),
        )?
    } else {
        let points: Vec<Point> = cfg
            .points
            .iter()
            .copied()
            .filter(Point::on_both_sides)
            .collect();
        args.common
            .run_torch_side(&args.script, &json!({"shape": cfg.shape, "points": points}))?
    };
    Ok(serde_json::from_value(value["points"].clone())?)
}

fn run(args: &RunArgs) -> Result<()> {
    ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let rounds = if args.quick { 2 } else { args.rounds };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut measured = Vec::new();
    let raw = args.out.join("frontier_raw");
    let mut chosen = configs(args.quick, args.warmup, args.steps);
    if let Some(name) = &args.only {
        chosen.retain(|c| &c.name == name);
        anyhow::ensure!(
            !chosen.is_empty(),
            "--only {name}: no such configuration (seq256-batch16, seq1024-batch4)"
        );
    }
    for mut cfg in chosen {
        let raw_file = |round: usize| raw_file(&raw, &cfg.name, round);
        let per_round = if args.reuse_raw && (1..=rounds).all(|round| raw_file(round).is_file()) {
            cfg.reused = true;
            let per_round = (1..=rounds)
                .map(|round| read_round(&raw_file(round)))
                .collect::<Result<Vec<_>>>()?;
            eprintln!(
                "frontier: {}: {rounds} rounds read from {}",
                cfg.name,
                raw.display()
            );
            per_round
        } else {
            measure_rounds(args, &cfg, rounds, &raw)?
        };
        measured.push((cfg, per_round));
        // Written after each configuration, reused or measured, so a long run that stops
        // keeps what it measured and the last configuration is always in the report.
        let mut report = report::Report::new(
            &args.common.machine,
            &args.common.date,
            args.common.threads,
            rounds,
            measured.clone(),
        )?;
        report.malloc = args.malloc.clone();
        report.write(&args.out)?;
        eprintln!("wrote {}", args.out.display());
    }
    Ok(())
}

/// Where a configuration's round goes in `raw` (`frontier_raw/<config>_<round>.json`).
fn raw_file(raw: &std::path::Path, config: &str, round: usize) -> std::path::PathBuf {
    raw.join(format!("{config}_{round}.json"))
}

/// One round's raw results, as `measure_rounds` wrote them.
fn read_round(path: &std::path::Path) -> Result<report::Round> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    Ok(report::Round {
        ckpt: serde_json::from_value(value["ckpt"].clone())?,
        torch: serde_json::from_value(value["torch"].clone())?,
    })
}

/// Measures `rounds` interleaved rounds of one configuration, writing each round's raw
/// results to `raw/<config>_<round>.json` as it comes.
fn measure_rounds(
    args: &RunArgs,
    cfg: &Config,
    rounds: usize,
    raw: &std::path::Path,
) -> Result<Vec<report::Round>> {
    let mut per_round = Vec::new();
    for round in 1..=rounds {
        let ckpt_first = round % 2 == 1;
        let mut ours = None;
        let mut theirs = None;
        for ckpt_side in [ckpt_first, !ckpt_first] {
            let r = one_side(args, cfg, ckpt_side)?;
            if ckpt_side {
                ours = Some(r)
            } else {
                theirs = Some(r)
            }
        }
        eprintln!("frontier: {} round {round} of {rounds} done", cfg.name);
        let done = report::Round {
            ckpt: ours.expect("ran"),
            torch: theirs.expect("ran"),
        };
        // Each round's raw results, as they come (frontier_raw/<config>_<round>.json).
        std::fs::create_dir_all(raw)?;
        std::fs::write(
            raw_file(raw, &cfg.name, round),
            serde_json::to_string(&json!({"ckpt": done.ckpt, "torch": done.torch}))?,
        )?;
        per_round.push(done);
    }
    Ok(per_round)
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Run(args) => run(&args),
        Cmd::Side {
            shape,
            points,
            threads,
        } => {
            tch::set_num_threads(threads);
            let shape: Shape = serde_json::from_str(&shape)?;
            let points: Vec<Point> = serde_json::from_str(&points)?;
            let results = side::run(&shape, &points)?;
            println!("{}", json!({ "points": results }));
            Ok(())
        }
    }
}
