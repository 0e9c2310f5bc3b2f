//! Train a transformer encoder classifier with and without activation checkpointing and
//! compare peak memory, time and numbers: `ckpt`'s main program.
//!
//! ```text
//! cargo run --release --example train_classifier              # ListOps, plain vs 3 segments
//! cargo run --release --example train_classifier -- --quick   # the same, 4 steps (< 90 s on 2 cores)
//! cargo run --release --example train_classifier -- --sweep --quick     # segments 1..=layers, PNG + CSV
//! cargo run --release --example train_classifier -- --data aclImdb      # IMDB-layout corpus
//! cargo run --release --example train_classifier -- --device cuda --json out.json
//! cargo run --release --example train_classifier -- --nproc 2  # data-parallel, 2 processes
//! torchrun --no-python --nproc-per-node 2 target/release/examples/train_classifier
//! ```
//!
//! Both runs start from the same seed: same weights, same batches, same dropout masks
//! (the checkpointed segments replay dropout with the saved RNG state), so on CPU with
//! the same thread count their gradients and losses are bit-identical and the table
//! shows only what checkpointing changes: peak tensor memory (exact bytes from
//! `ckpt::memory`) and time. The runs take turns step by step (`--sequential` to train
//! one after the other), so load from other processes slows both alike.
//!
//! Data-parallel (`--nproc N`, or under torchrun): every run trains on N processes
//! (Gloo on CPU, `ckpt::dist::DistributedDataParallel`), each rank on its
//! `DistributedSampler` share of every global batch of `--batch-size` rows; rank 0 then
//! trains each run again as one process on the same global batches and reports the
//! largest parameter difference, beside each rank's peak memory, step time and samples
//! per second.
//!
//! The network and the data come from `ckpt-models` (`classifier`, `data`, `listops`,
//! `text`, shared with the tests and the benchmarks); [`train`] runs and measures,
//! [`report`] writes the outputs.

mod cli;
mod report;
mod shard;
mod train;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use indicatif::{MultiProgress, ProgressDrawTarget};
use tch::Device;

use crate::cli::{Args, Cuts, DeviceArg, Mode, Sizes, device_name};
use crate::report::{ConfigJson, Report, RunJson};
use crate::shard::Sharding;
use crate::train::{RunResult, RunSpec, Schedule, TrainConfig};
use ckpt::plan::{Budget, Objective};
use ckpt_models::classifier::{self as model, ModelConfig, Strategy};
use ckpt_models::data;
use ckpt_models::listops::ListOpsConfig;
use ckpt_models::text::VocabConfig;

/// Joins the process group of a data-parallel run (the launcher's variables) and picks
/// the rank's device: CPU ranks reduce with Gloo; CUDA ranks (`--device cuda`, or `auto`
/// where NCCL can run) with NCCL, rank `LOCAL_RANK` on `cuda:LOCAL_RANK`, which needs
/// ckpt's `nccl` feature.
fn join_group(arg: DeviceArg) -> Result<(ckpt::dist::ProcessGroup, Device)> {
    use ckpt::dist::Backend;
    let mut opts = ckpt::dist::InitOptions::from_env()?;
    let cuda = match arg {
        DeviceArg::Cpu => false,
        DeviceArg::Auto => Backend::Nccl.is_available(),
        DeviceArg::Cuda(_) => true,
    };
    if cuda {
        opts.backend = Backend::Nccl;
    }
    let pg = ckpt::dist::f_init(&opts).context(if cuda {
        "joining the process group (NCCL: data-parallel runs on CUDA need ckpt's `nccl` \
         feature, `--features nccl`; --device cpu trains with Gloo)"
    } else {
        "joining the process group"
    })?;
    let device = if cuda {
        Device::Cuda(opts.local_rank)
    } else {
        Device::Cpu
    };
    Ok((pg, device))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let sizes = args.sizes();
    args.check(&sizes)?;
    ensure!(args.nproc >= 1, "--nproc must be at least 1");
    ensure!(
        sizes.batch_size.is_multiple_of(args.nproc),
        "--batch-size {} (the global batch) is not a multiple of --nproc {}",
        sizes.batch_size,
        args.nproc
    );
    if let Some(result) = ckpt::dist::relaunch_self_from_args(args.nproc)? {
        ensure!(
            result.success(),
            "a worker failed (exit status by rank: {:?})",
            result.status
        );
        return Ok(());
    }
    // A rank of a data-parallel run when a launcher (ours or torchrun) set RANK.
    let (pg, ddp_device) = match std::env::var_os("RANK") {
        Some(_) => {
            let (pg, device) = join_group(args.device)?;
            (Some(pg), Some(device))
        }
        None => (None, None),
    };
    let (rank, world) = pg.as_ref().map_or((0, 1), |p| (p.rank(), p.world_size()));
    let lead = rank == 0;
    if pg.is_some() {
        ensure!(
            !args.sweep,
            "--sweep runs in one process (no --nproc, no torchrun)"
        );
        ensure!(
            sizes.batch_size.is_multiple_of(world),
            "--batch-size {} (the global batch) is not a multiple of the {world} ranks",
            sizes.batch_size
        );
    }
    // Count every tensor allocation from here on (parameters and optimizer state too).
    ckpt::memory::enable();
    if let Some(n) = args.threads {
        tch::set_num_threads(n);
    }
    let device = match ddp_device {
        Some(d) => d,
        None => args.device.resolve()?,
    };

    let task = load_task(&args, &sizes)?;
    ensure!(
        task.train.len() >= sizes.batch_size,
        "{} training examples, fewer than --batch-size {}",
        task.train.len(),
        sizes.batch_size
    );

    let model_cfg = ModelConfig {
        vocab_size: task.vocab_size as i64,
        n_classes: task.classes.len() as i64,
        seq_len: sizes.seq_len as i64,
        layers: args.layers,
        heads: args.heads,
        d_model: args.d_model,
        ff: args.ff,
        dropout: args.dropout,
    };
    let steps = task.train.len() / sizes.batch_size * sizes.epochs;
    let train_cfg = TrainConfig {
        epochs: sizes.epochs,
        batch_size: sizes.batch_size,
        lr: args.lr,
        warmup: args.warmup_steps.unwrap_or(steps.div_ceil(8)),
        weight_decay: args.weight_decay,
        seed: args.seed,
        device,
        compact_dropout: args.compact_dropout,
    };

    if lead {
        println!("task:   {}", task.description);
        println!(
            "data:   {} train / {} test examples, {} classes, seq {} ({:.0}% real tokens), batch {}, \
             {} epoch(s) = {steps} steps a run",
            task.train.len(),
            task.test.len(),
            task.classes.len(),
            sizes.seq_len,
            task.train.fill() * 100.0,
            sizes.batch_size,
            sizes.epochs,
        );
        println!(
            "model:  {} layers, {} heads, d_model {}, ff {}, dropout {}, pre-LN, learned positions, \
             mean pooling; AdamW lr {} wd {}, {} warm-up steps",
            args.layers,
            args.heads,
            args.d_model,
            args.ff,
            args.dropout,
            args.lr,
            args.weight_decay,
            train_cfg.warmup
        );
        println!(
            "device: {} ({} threads), seed {}",
            device_name(device),
            tch::get_num_threads(),
            args.seed
        );
        if world > 1 {
            println!(
                "data-parallel: {world} processes (Gloo), {} rows a rank a step",
                sizes.batch_size / world
            );
        }
    }

    let policies: Vec<Option<ckpt::Policy>> = args.policy.iter().map(|p| p.policy()).collect();
    // The planner's runs plan before training, so that a fixed policy no plan of the
    // budget fits is an error here, not a panic in the first step.
    // A plain-only run makes no planner's run: a budget it never uses is no error.
    let auto_runs =
        !args.sweep && args.mode != Mode::Plain && matches!(args.cuts(), Cuts::Planner(_));
    let sharding = pg.as_ref().map_or(Sharding::Single, Sharding::Ddp);
    let mut cuts = args.cuts();
    if let Cuts::Planner(Objective::Budget(budget @ Budget::FractionOfPlain(_))) = cuts
        && args.compact_dropout
        && (auto_runs || args.explain)
    {
        let bytes = budget_of_plain(&task.train, &model_cfg, &train_cfg, sharding, budget)?;
        if lead {
            println!(
                "--compact-dropout: --budget {budget} is {} (the planner profiles compact \
                 stages, whose plain run holds less)",
                Budget::Bytes(bytes)
            );
        }
        cuts = Cuts::Planner(Objective::Budget(Budget::Bytes(bytes)));
    }
    if (args.explain && lead) || auto_runs {
        let objective = match cuts {
            Cuts::Planner(objective) => objective,
            Cuts::Count(_) => Objective::MinPeak,
        };
        let explain = args.explain && lead;
        let plans = auto_plans(
            &task.train,
            &model_cfg,
            &train_cfg,
            sharding,
            objective,
            &policies,
            explain,
        )?;
        if explain {
            for (what, plan) in plans {
                println!("\n{what}:\n{}", plan.explain());
            }
            println!();
        }
    }
    ensure!(
        !args.sweep || policies.len() == 1,
        "--sweep takes one --policy"
    );
    let plan = run_specs(&args, cuts, &policies);

    let schedule = if args.sequential {
        Schedule::Sequential
    } else {
        Schedule::Interleaved
    };
    let bars = if lead {
        MultiProgress::new()
    } else {
        MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
    };
    let mut runs = train::train(
        &plan, &task, &model_cfg, &train_cfg, schedule, &bars, sharding,
    )?;
    if !lead {
        return Ok(());
    }
    if pg.is_some() && !args.skip_reference {
        // The reference: one process on the same global batches, the same masks.
        let reference = train::train(
            &plan,
            &task,
            &model_cfg,
            &train_cfg,
            schedule,
            &bars,
            Sharding::Reference(world),
        )
        .context("the single-process reference")?;
        for (run, single) in runs.iter_mut().zip(&reference) {
            run.ddp_max_param_diff = Some(train::max_abs_diff(
                &run.final_params,
                &single.final_params,
            )?);
        }
    }

    println!();
    println!(
        "peak MiB: highest tensor memory of a training step (forward, backward, AdamW) above \
         the bytes live before it, from ckpt::memory (exact); step s: median wall time"
    );
    print!("{}", report::table(&runs));
    print!("{}", report::plan_lines(&runs));
    let schedule_name = match schedule {
        Schedule::Interleaved => "interleaved",
        Schedule::Sequential => "sequential",
    };
    print!("{}", report::ratio_lines(&runs, schedule_name));
    let ddp_diff = runs
        .iter()
        .filter_map(|r| r.ddp_max_param_diff)
        .reduce(f64::max);
    if pg.is_some() {
        println!();
        println!(
            "data-parallel, {world} ranks: peak MiB, step s and samples/s of each rank; \
             max param diff: largest |parameter difference| after training against one \
             process trained on the same global batches"
        );
        print!("{}", report::rank_table(&runs));
        if let Some(d) = ddp_diff {
            println!("largest |parameter difference| against one process: {d:e}");
        }
    }

    let (grad_diff, loss_diff) = compare_runs(&runs, steps)?;

    if args.sweep {
        std::fs::create_dir_all(&args.out_dir)
            .with_context(|| format!("{}: cannot create", args.out_dir.display()))?;
        let csv = args.out_dir.join("sweep.csv");
        let png = args.out_dir.join("sweep.png");
        report::write_csv(&csv, &runs)?;
        let title = format!(
            "checkpoint_sequential over {} blocks: seq {}, batch {}, {}",
            args.layers,
            sizes.seq_len,
            sizes.batch_size,
            device_name(device)
        );
        report::write_plot(&png, &runs, &title)?;
        println!("sweep: {} and {}", csv.display(), png.display());
    }

    if let Some(path) = &args.json {
        let reference = report::reference(&runs).context("no runs to report")?;
        let doc = Report {
            task: task.name.to_owned(),
            device: device_name(device),
            config: ConfigJson {
                layers: args.layers,
                heads: args.heads,
                d_model: args.d_model,
                seq_len: sizes.seq_len,
                batch_size: sizes.batch_size,
                steps,
                ff: args.ff,
                dropout: args.dropout,
                epochs: sizes.epochs,
                train_size: task.train.len(),
                test_size: task.test.len(),
                vocab_size: task.vocab_size,
                classes: task.classes.len(),
                lr: args.lr,
                weight_decay: args.weight_decay,
                warmup_steps: train_cfg.warmup,
                seed: args.seed,
            },
            runs: runs.iter().map(|r| RunJson::new(r, reference)).collect(),
            grad_max_abs_diff: grad_diff,
            loss_max_abs_diff: loss_diff,
            threads: tch::get_num_threads(),
            reference_run: reference.name.clone(),
            schedule: schedule_name.to_owned(),
            world_size: world,
            ddp_max_param_diff: ddp_diff,
        };
        report::write_json(path, &doc)?;
        println!("json:  {}", path.display());
    }
    Ok(())
}

/// The task of `--data` (a text corpus) or, without it, ListOps generated from `--seed`.
fn load_task(args: &Args, sizes: &Sizes) -> Result<data::Task> {
    Ok(match &args.data {
        None => {
            let cfg = ListOpsConfig {
                max_depth: args.listops_max_depth,
                max_args: args.listops_max_args,
                min_length: args.listops_min_length.unwrap_or(sizes.seq_len / 4),
                max_length: args.listops_max_length.unwrap_or(sizes.seq_len + 1),
            };
            data::listops_task(
                &cfg,
                sizes.train_size,
                sizes.test_size,
                sizes.seq_len,
                args.seed,
            )?
        }
        Some(dir) => data::text_task(
            dir,
            &VocabConfig {
                min_freq: args.min_freq,
                max_size: args.max_vocab,
            },
            sizes.train_size,
            sizes.test_size,
            sizes.seq_len,
            args.seed,
        )?,
    })
}

/// The runs to make: `--sweep`'s `segments = 1..=layers`, or plain and/or the
/// checkpointed run of `--segments` with each `--policy` (`--mode`).
fn run_specs(args: &Args, cuts: Cuts, policies: &[Option<ckpt::Policy>]) -> Vec<RunSpec> {
    if args.sweep {
        (1..=args.layers)
            .map(|k| {
                (
                    format!("segments={k}"),
                    Strategy::Checkpointed(k),
                    policies[0],
                )
            })
            .collect()
    } else {
        let plain = (
            "plain".to_owned(),
            Strategy::Plain,
            Some(ckpt::Policy::RECOMPUTE_ALL),
        );
        let (name, strategy) = match cuts {
            // The planner's cuts (the segments column shows `-`).
            Cuts::Planner(objective @ Objective::Budget(_)) => {
                ("budget".to_owned(), Strategy::Auto(objective))
            }
            Cuts::Planner(objective) => ("auto".to_owned(), Strategy::Auto(objective)),
            // More segments than blocks means one block a segment (as
            // `ckpt::sequential_segments` clamps); the table shows the count used.
            Cuts::Count(n) => (
                "checkpointed".to_owned(),
                Strategy::Checkpointed(n.min(args.layers)),
            ),
        };
        let ckpt = policies.iter().map(|&p| (name.clone(), strategy, p));
        match args.mode {
            Mode::Both => std::iter::once(plain).chain(ckpt).collect(),
            Mode::Plain => vec![plain],
            Mode::Checkpointed => ckpt.collect(),
        }
    }
}

/// Prints and returns the largest gradient difference after step 1 and loss difference
/// over the run between the first run and every other (`None` with one run).
fn compare_runs(runs: &[RunResult], steps: usize) -> Result<(Option<f64>, Option<f64>)> {
    if runs.len() < 2 {
        return Ok((None, None));
    }
    let mut g = 0.0f64;
    let mut l = 0.0f64;
    for r in &runs[1..] {
        g = g.max(train::grad_max_abs_diff(&runs[0], r)?);
        l = l.max(train::loss_max_abs_diff(&runs[0], r));
    }
    let verdict = |x: f64| if x == 0.0 { " (bit-identical)" } else { "" };
    println!(
        "largest |gradient difference| after step 1, all parameters: {g:e}{}",
        verdict(g)
    );
    println!(
        "largest |loss difference| over {steps} steps: {l:e}{}",
        verdict(l)
    );
    Ok((Some(g), Some(l)))
}

/// The plans of `objective` (the least peak, or `--budget`) for the first training
/// batch of this process (in a data-parallel run its rank's share of the global batch,
/// the shape it trains on), as the planner's runs make them and `--explain` prints
/// them, each with its title: the planner choosing the policies (for `--policy auto`,
/// or `chosen_too`), then each fixed policy of `policies` (one profile, the model's
/// cache keeps it across `set_policy`).
///
/// # Errors
///
/// A policy for which no plan fits the budget, named, with the smallest feasible peak.
fn auto_plans(
    data: &data::Dataset,
    model_cfg: &ModelConfig,
    cfg: &TrainConfig,
    sharding: Sharding,
    objective: Objective,
    policies: &[Option<ckpt::Policy>],
    chosen_too: bool,
) -> Result<Vec<(String, ckpt::plan::Plan)>> {
    let (_vs, mut model, xs) = first_batch_model(data, model_cfg, cfg, sharding, objective)?;
    let what = match objective {
        Objective::MinPeak => "segments = auto".to_owned(),
        Objective::Budget(b) => format!("budget {b}"),
    };
    // Profiled as the runs profile: with `--compact-dropout`, compact stages.
    let _compact = cfg.compact_dropout.then(ckpt::compact_dropout_guard);
    let mut plans = Vec::new();
    if chosen_too || policies.contains(&None) {
        let chosen = format!("{what}, policies chosen by the planner");
        let plan = model.plan_for(&xs, true).with_context(|| {
            let asked = if policies.contains(&None) {
                "--policy auto"
            } else {
                "--explain"
            };
            format!("{chosen} ({asked})")
        })?;
        plans.push((chosen, plan));
    }
    for &policy in policies.iter().flatten() {
        model.set_policy(policy);
        let name = ckpt::plan::policy_name(policy);
        let plan = model
            .plan_for(&xs, true)
            .with_context(|| format!("{what}, --policy {name}"))?;
        plans.push((
            format!("{what}, policy {name} in every checkpointed segment"),
            plan,
        ));
    }
    Ok(plans)
}

/// A fresh model (the runs' weights) cut by the planner for `objective`, and this
/// process's first training batch (its rank's share in a data-parallel run).
///
/// # Errors
///
/// When the training split has no batch, or the strategy does not apply.
fn first_batch_model(
    data: &data::Dataset,
    model_cfg: &ModelConfig,
    cfg: &TrainConfig,
    sharding: Sharding,
    objective: Objective,
) -> Result<(tch::nn::VarStore, model::Classifier, tch::Tensor)> {
    tch::manual_seed(cfg.seed as i64);
    let vs = tch::nn::VarStore::new(cfg.device);
    let mut model = model::Classifier::new(vs.root(), model_cfg);
    Strategy::Auto(objective).apply(&mut model, model_cfg.layers)?;
    let steps = shard::epoch_steps(data, cfg, sharding, 0)?;
    let (_, rows) = steps
        .first()
        .and_then(|s| s.first())
        .context("no training batch")?;
    let (xs, _) = data.batch(rows, cfg.device);
    Ok((vs, model, xs))
}

/// `budget`, a fraction of the plain run's predicted peak, in bytes, for
/// `--compact-dropout`: the planner then profiles compact stages, whose own plain run
/// holds its dropout masks as bits, so the fraction is taken here of a profile without
/// compact dropout, the plain run of the table.
///
/// # Errors
///
/// When profiling fails, or the fraction is not positive and finite.
fn budget_of_plain(
    data: &data::Dataset,
    model_cfg: &ModelConfig,
    cfg: &TrainConfig,
    sharding: Sharding,
    budget: Budget,
) -> Result<u64> {
    let (_vs, model, xs) = first_batch_model(data, model_cfg, cfg, sharding, Objective::MinPeak)?;
    let plain = model
        .plan_for(&xs, true)
        .context("profiling the plain run for --budget")?
        .plain_peak_bytes();
    Ok(budget.bytes(plain)?)
}
