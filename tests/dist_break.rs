//! Adversarial cases of `ckpt::dist` (issue 12): misused collectives, models DDP must
//! still get right (frozen parameters, a layer in three segments, a parameter one rank
//! does not use, `no_sync` from the first step, a forward without backward), parameters
//! that differ between ranks, timeouts. Same harness as `tests/dist.rs` (`tests/dist_common`): the tests run
//! the ignored `worker` test of this binary in 1 to 3 processes through `ckpt`'s local
//! launcher, on 127.0.0.1 and a free port; every wait is bounded.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ckpt::CkptError;
use ckpt::dist::{self, DdpOptions, DistributedDataParallel, InitOptions, ReduceOp};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

mod dist_common;
use dist_common::{fields, free_port, run_workers, serial};

/// Runs a scenario that must succeed on every rank; returns each rank's `key=value` pairs.
fn run_ok(scenario: &str, world: usize) -> Vec<HashMap<String, String>> {
    dist_common::run_ok(scenario, world)
        .iter()
        .map(|r| fields(r))
        .collect()
}

// ---------------------------------------------------------------------------------
// Worker side

fn note(key: &str, value: impl std::fmt::Display) {
    let out = PathBuf::from(std::env::var("CKPT_DIST_OUT").expect("CKPT_DIST_OUT"));
    let rank = std::env::var("RANK").expect("RANK");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out.join(format!("rank{rank}.txt")))
        .expect("report file");
    let v = value.to_string().replace(char::is_whitespace, "_");
    writeln!(f, "{key}={v}").expect("write report");
}

#[test]
#[ignore = "worker process of the multi-process tests, which run it"]
fn worker() {
    let scenario = std::env::var("CKPT_DIST_SCENARIO")
        .expect("CKPT_DIST_SCENARIO: this is run by the multi-process tests");
    tch::set_num_threads(1);
    match scenario.as_str() {
        "collective_args" => collective_args(),
        "all_gather_shapes_differ" => all_gather_shapes_differ(),
        "all_reduce_dtypes_differ" => all_reduce_dtypes_differ(),
        "ddp_dtypes_differ" => ddp_dtypes_differ(),
        "ddp_dims_differ" => ddp_dims_differ(),
        "ddp_buffers_differ" => ddp_buffers_differ(),
        "two_groups" => two_groups(),
        s if s.starts_with("train_") => train(s.trim_start_matches("train_")),
        other => panic!("unknown scenario {other}"),
    }
    note("done", true);
}

fn init_env(timeout: Duration) -> dist::ProcessGroup {
    let mut opts = InitOptions::from_env().expect("launcher variables");
    opts.timeout = timeout;
    dist::init(&opts)
}

fn floats(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).flatten(0, -1)).unwrap()
}

/// Collectives given arguments a user might get wrong, all on matching ranks.
fn collective_args() {
    let pg = init_env(Duration::from_secs(20));
    let r = pg.rank() as f64;
    // A column of a row-major matrix: not contiguous.
    let m = Tensor::arange(12, (Kind::Float, Device::Cpu)).view([3, 4]) + 100.0 * r;
    let col = m.narrow(1, 1, 1);
    let res = pg.f_all_reduce(&col, ReduceOp::Sum);
    note("noncontig_all_reduce_err", res.is_err());
    // Rank r's column 1 is [1, 5, 9] + 100 r: the sum over 2 ranks is [2, 10, 18] + 100.
    note(
        "noncontig_all_reduce",
        floats(&col) == vec![102.0, 110.0, 118.0],
    );
    // The rest of the matrix must be untouched.
    let others = m.narrow(1, 2, 2);
    let expect: Vec<f64> = [2.0, 3.0, 6.0, 7.0, 10.0, 11.0]
        .iter()
        .map(|v| v + 100.0 * r)
        .collect();
    note("noncontig_rest_untouched", floats(&others) == expect);
    let m = Tensor::arange(12, (Kind::Float, Device::Cpu)).view([3, 4]) + 100.0 * r;
    let col = m.narrow(1, 1, 1);
    let res = pg.f_broadcast(&col, 1);
    note("noncontig_broadcast_err", res.is_err());
    note(
        "noncontig_broadcast",
        floats(&col) == vec![101.0, 105.0, 109.0],
    );
    // A transposed (non-contiguous) tensor to all_gather.
    let t = (Tensor::arange(6, (Kind::Float, Device::Cpu)).view([2, 3]) + 10.0 * r).tr();
    match pg.f_all_gather(&t) {
        Ok(g) => note(
            "transposed_all_gather",
            g.iter().enumerate().all(|(k, gk)| {
                gk.equal(
                    &((Tensor::arange(6, (Kind::Float, Device::Cpu)).view([2, 3])
                        + 10.0 * k as f64)
                        .tr()),
                )
            }),
        ),
        Err(e) => note("transposed_all_gather", format!("err:{e}")),
    }
    // Average of an integer tensor.
    let i = Tensor::from_slice(&[3i64, 4]) + pg.rank() as i64;
    let res = pg.f_all_reduce(&i, ReduceOp::Avg);
    note(
        "int_avg_err",
        res.as_ref()
            .map_or_else(|e| format!("{e:?}"), |_| "none".into()),
    );
    note("int_avg_value", format!("{:?}", floats(&i)));
    // An empty tensor and a scalar.
    let e = Tensor::zeros([0], (Kind::Float, Device::Cpu));
    note(
        "empty_all_reduce",
        pg.f_all_reduce(&e, ReduceOp::Sum).is_ok(),
    );
    let s = Tensor::from(r + 1.0);
    let ok = pg.f_all_reduce(&s, ReduceOp::Sum).is_ok();
    note("scalar_all_reduce", ok && s.double_value(&[]) == 3.0);
    // reduce_scatter with inputs of two shapes on one rank.
    let inputs = [
        Tensor::ones([2], (Kind::Float, Device::Cpu)),
        Tensor::ones([3], (Kind::Float, Device::Cpu)),
    ];
    match pg.f_reduce_scatter(&inputs, ReduceOp::Sum) {
        Ok(t) => note("reduce_scatter_ragged", format!("ok:{:?}", floats(&t))),
        Err(e) => note("reduce_scatter_ragged", format!("err:{e:?}")),
    }
    // reduce_scatter with inputs of two dtypes on one rank.
    let inputs = [
        Tensor::ones([2], (Kind::Float, Device::Cpu)),
        Tensor::ones([2], (Kind::Double, Device::Cpu)),
    ];
    match pg.f_reduce_scatter(&inputs, ReduceOp::Sum) {
        Ok(t) => note("reduce_scatter_dtypes", format!("ok:{:?}", floats(&t))),
        Err(e) => note("reduce_scatter_dtypes", format!("err:{e:?}")),
    }
    // The group still works afterwards.
    let t = Tensor::from_slice(&[r]);
    note(
        "still_works",
        pg.f_all_reduce(&t, ReduceOp::Sum).is_ok() && floats(&t) == vec![1.0],
    );
}

/// Rank 0 gathers a [2] tensor, rank 1 a [3] one.
fn all_gather_shapes_differ() {
    let pg = init_env(Duration::from_secs(5));
    let t = Tensor::ones([2 + pg.rank() as i64], (Kind::Float, Device::Cpu));
    let start = Instant::now();
    let res = pg.f_all_gather(&t);
    note(
        "err",
        res.as_ref()
            .err()
            .map_or("none".to_string(), |e| format!("{e:?}")),
    );
    note("secs", format!("{:.1}", start.elapsed().as_secs_f64()));
}

/// Rank 0 reduces float32, rank 1 float64 (same shape).
fn all_reduce_dtypes_differ() {
    let pg = init_env(Duration::from_secs(5));
    let kind = if pg.rank() == 0 {
        Kind::Float
    } else {
        Kind::Double
    };
    let t = Tensor::ones([4], (kind, Device::Cpu));
    let start = Instant::now();
    let res = pg.f_all_reduce(&t, ReduceOp::Sum);
    note(
        "err",
        res.as_ref()
            .err()
            .map_or("none".to_string(), |e| format!("{e:?}")),
    );
    note("value", format!("{:?}", floats(&t)));
    note("secs", format!("{:.1}", start.elapsed().as_secs_f64()));
}

/// Rank 1's model is float64, rank 0's float32: same names and shapes.
fn ddp_dtypes_differ() {
    let pg = init_env(Duration::from_secs(5));
    let mut vs = nn::VarStore::new(Device::Cpu);
    let _l = nn::linear(vs.root() / "l", 4, 3, Default::default());
    if pg.rank() == 1 {
        vs.double();
    }
    let start = Instant::now();
    let res = DistributedDataParallel::f_new(&pg, &vs, DdpOptions::default());
    note(
        "err",
        res.as_ref()
            .err()
            .map_or("none".to_string(), |e| format!("{e:?}")),
    );
    note("secs", format!("{:.1}", start.elapsed().as_secs_f64()));
}

/// Same parameter count, but rank 1's first parameter is flat ([12] against [3, 4]).
fn ddp_dims_differ() {
    let pg = init_env(Duration::from_secs(5));
    let vs = nn::VarStore::new(Device::Cpu);
    let shape: &[i64] = if pg.rank() == 0 { &[3, 4] } else { &[12] };
    let _w = vs.root().randn_standard("w", shape);
    let start = Instant::now();
    let res = DistributedDataParallel::f_new(&pg, &vs, DdpOptions::default());
    note(
        "err",
        res.as_ref()
            .err()
            .map_or("none".to_string(), |e| format!("{e:?}")),
    );
    note("secs", format!("{:.1}", start.elapsed().as_secs_f64()));
}

/// Same parameters; rank 1's running mean (a buffer) has 4 entries, rank 0's 3.
fn ddp_buffers_differ() {
    let pg = init_env(Duration::from_secs(5));
    let vs = nn::VarStore::new(Device::Cpu);
    let _l = nn::linear(vs.root() / "l", 4, 3, Default::default());
    let _b = vs
        .root()
        .zeros_no_train("running_mean", &[3 + pg.rank() as i64]);
    let res = DistributedDataParallel::f_new(&pg, &vs, DdpOptions::default());
    note(
        "err",
        res.as_ref()
            .err()
            .map_or("none".to_string(), |e| format!("{e:?}")),
    );
}

/// Two process groups at once (two stores, two ports), used alternately.
fn two_groups() {
    let a = init_env(Duration::from_secs(20));
    let mut o = InitOptions::from_env().unwrap();
    o.master_port = std::env::var("CKPT_DIST_PORT2").unwrap().parse().unwrap();
    o.timeout = Duration::from_secs(20);
    let b = dist::init(&o);
    let r = a.rank() as f64;
    let mut ok = true;
    for k in 0..3 {
        let x = Tensor::from_slice(&[r + k as f64]);
        let y = Tensor::from_slice(&[10.0 * r]);
        a.all_reduce(&x, ReduceOp::Sum);
        b.all_reduce(&y, ReduceOp::Max);
        ok &= floats(&x) == vec![1.0 + 2.0 * k as f64] && floats(&y) == vec![10.0];
    }
    drop(a);
    let y = Tensor::from_slice(&[r]);
    b.all_reduce(&y, ReduceOp::Sum);
    note("two_groups", ok && floats(&y) == vec![1.0]);
}

// ---------------------------------------------------------------------------------
// Training against one process on the global batch

const D: i64 = 16;
const ROWS: i64 = 4;
const STEPS: i64 = 4;

/// Four hidden layers and a head, run in checkpointed segments as `case` says; for
/// `model_macro`, a `model!` chain instead.
struct Net {
    l: Vec<nn::Linear>,
    head: nn::Linear,
    chain: Option<Chain>,
}

ckpt::model! {
    /// `[batch, D]` → `[batch, 2]`: three layers and a head, in 2 checkpointed segments.
    #[checkpointed(segments = 2)]
    struct Chain(p) {
        c0: nn::Linear = nn::linear(p / "c0", D, D, Default::default()),
        |x| x.gelu("none"),
        c1: nn::Linear = nn::linear(p / "c1", D, D, Default::default()),
        |x| x.gelu("none"),
        c2: nn::Linear = nn::linear(p / "c2", D, D, Default::default()),
        |x| x.tanh(),
        chead: nn::Linear = nn::linear(p / "chead", D, 2, Default::default()),
    }
}

fn net(vs: &nn::VarStore, case: &str) -> Net {
    let chain = (case == "model_macro").then(|| Chain::new(vs.root()));
    Net {
        l: (0..4)
            .map(|i| nn::linear(vs.root() / format!("l{i}"), D, D, Default::default()))
            .collect(),
        head: nn::linear(vs.root() / "head", D, 2, Default::default()),
        chain,
    }
}

/// Calls of segment closures in this process (forwards and recomputes).
static SEG_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// `panic_in_recompute`: the call of a segment closure that panics (0: none).
static PANIC_AT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn seg(l: &nn::Linear, x: Tensor) -> Tensor {
    let l = ckpt::ShallowClone::shallow_clone(l);
    ckpt::checkpoint(
        move |x: Tensor| {
            use std::sync::atomic::Ordering::SeqCst;
            let n = SEG_CALLS.fetch_add(1, SeqCst) + 1;
            if n == PANIC_AT.load(SeqCst) {
                panic!("injected panic in segment call {n}");
            }
            l.forward(&x).gelu("none").dropout(0.1, true) + x
        },
        x,
    )
}

impl Net {
    /// The forward of `case` for rank `rank` at `step`.
    fn forward(&self, case: &str, x: &Tensor, step: i64, rank: i64) -> Tensor {
        if let Some(c) = &self.chain {
            return c.forward(x);
        }
        let mut h = x.shallow_clone();
        match case {
            // l[1] in three segments, captured unlisted.
            "shared3" => {
                for l in [&self.l[0], &self.l[1], &self.l[2], &self.l[1], &self.l[1]] {
                    h = seg(l, h);
                }
            }
            // l[3] is used by rank 0 only, every step.
            "unused_on_rank1" => {
                for (i, l) in self.l.iter().enumerate() {
                    if i == 3 && rank == 1 {
                        continue;
                    }
                    h = seg(l, h);
                }
            }
            // l[2] is skipped by every rank at odd steps (with find_unused_parameters).
            "skip_odd_steps" | "skip_odd_steps_listed" => {
                for (i, l) in self.l.iter().enumerate() {
                    if i == 2 && step % 2 == 1 {
                        continue;
                    }
                    h = if case == "skip_odd_steps_listed" {
                        let c = ckpt::ShallowClone::shallow_clone(l);
                        ckpt::checkpoint_with(
                            &ckpt::CheckpointOptions::new().parameters_of(l),
                            move |x: Tensor| c.forward(&x).gelu("none").dropout(0.1, true) + x,
                            h,
                        )
                    } else {
                        seg(l, h)
                    };
                }
            }
            _ => {
                for l in &self.l {
                    h = seg(l, h);
                }
            }
        }
        self.head.forward(&h)
    }
}

fn global_batch(step: i64, world: i64, micro: i64) -> (Tensor, Tensor) {
    tch::manual_seed(7000 + step);
    let n = world * micro * ROWS;
    (
        Tensor::randn([n, D], (Kind::Float, Device::Cpu)),
        Tensor::randn([n, 2], (Kind::Float, Device::Cpu)),
    )
}

fn shard(t: &Tensor, r: i64, m: i64, micro: i64) -> Tensor {
    t.narrow(0, (r * micro + m) * ROWS, ROWS)
}

/// The loss of one shard; `forward` runs the model (through DDP or not). For
/// `two_forwards`, the shard's halves go through two forwards and one backward.
fn shard_loss(
    case: &str,
    x: &Tensor,
    y: &Tensor,
    forward: &dyn Fn(&Tensor) -> Result<Tensor, CkptError>,
) -> Result<Tensor, CkptError> {
    if case == "two_forwards" {
        let h = ROWS / 2;
        let a = forward(&x.narrow(0, 0, h))?;
        let b = forward(&x.narrow(0, h, h))?;
        return Ok((mse(&a, &y.narrow(0, 0, h)) + mse(&b, &y.narrow(0, h, h))) / 2.0);
    }
    Ok(mse(&forward(x)?, y))
}

fn mse(out: &Tensor, y: &Tensor) -> Tensor {
    (out - y).square().mean(Kind::Float)
}

fn snapshot(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(k, t)| (k, t.detach().copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Freezes `l0` (both tensors), as a user fine-tuning the rest would.
fn freeze_l0(vs: &nn::VarStore) {
    for (name, t) in vs.variables() {
        if name.starts_with("l0.") {
            let _ = t.set_requires_grad(false);
        }
    }
}

fn train(case: &str) {
    let pg = init_env(Duration::from_secs(30));
    let (rank, world) = (pg.rank() as i64, pg.world_size() as i64);
    let micro = if case == "no_sync3" { 3 } else { 1 };

    tch::manual_seed(100 + rank);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let model = net(&vs, case);
    if case == "frozen" {
        freeze_l0(&vs);
    }
    if case == "float64" {
        vs.double();
    }
    let dynamic = case.starts_with("skip_odd_steps");
    let opts = DdpOptions {
        find_unused_parameters: dynamic,
        static_graph: !dynamic,
        bucket_cap_mb: if case == "tiny_buckets" { 1e-9 } else { 0.002 },
        first_bucket_cap_mb: if case == "tiny_buckets" { 1e-9 } else { 0.001 },
        ..DdpOptions::default()
    };
    let ddp = match DistributedDataParallel::f_new(&pg, &vs, opts) {
        Ok(d) => d,
        Err(e) => {
            note("new_err", format!("{e:?}"));
            return;
        }
    };
    if case == "forward_without_backward" {
        // A grad-enabled forward whose output is only looked at (a first loss logged).
        let (x, _) = global_batch(99, world, micro);
        let out = ddp.forward(|| model.forward(case, &shard(&x, rank, 0, micro), 0, rank));
        note("looked_at", out.double_value(&[0, 0]).is_finite());
    }
    let mut opt = nn::AdamW::default().build(&vs, 1e-2).unwrap();
    for step in 0..STEPS {
        let (x, y) = global_batch(step, world, micro);
        let (x, y) = if case == "float64" {
            (x.to_kind(Kind::Double), y.to_kind(Kind::Double))
        } else {
            (x, y)
        };
        opt.zero_grad();
        for m in 0..micro {
            let _guard = (m + 1 < micro).then(|| ddp.no_sync());
            tch::manual_seed(1000 * step + 10 * m + rank);
            if case == "panic_in_recompute" && rank == 1 && step == 1 {
                // Step 0 made 8 segment calls (4 forwards, 4 recomputes), step 1's
                // forward 4 more: the 13th is the first recompute of step 1.
                PANIC_AT.store(13, std::sync::atomic::Ordering::SeqCst);
            }
            let (xs, ys) = (shard(&x, rank, m, micro), shard(&y, rank, m, micro));
            let start = Instant::now();
            let loss = match shard_loss(case, &xs, &ys, &|x| {
                ddp.f_forward(|| model.forward(case, x, step, rank))
            }) {
                Ok(l) => l,
                Err(e) => {
                    note("forward_err", format!("step{step}:{e:?}"));
                    return;
                }
            };
            let backward =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loss.f_backward()));
            match backward {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    note("backward_err", format!("step{step}:{e:?}"));
                    note(
                        "backward_secs",
                        format!("{:.1}", start.elapsed().as_secs_f64()),
                    );
                    return;
                }
                Err(_) => {
                    note("backward_panicked", format!("step{step}"));
                    return;
                }
            }
        }
        opt.step();
    }
    let trained = snapshot(&vs);
    let mut same = true;
    for (_, t) in &trained {
        let g = pg.all_gather(t);
        same &= g.iter().all(|x| x.equal(&g[0]));
    }
    note("same_as_rank0", same);
    if rank == 0 {
        tch::manual_seed(100);
        let mut vs = nn::VarStore::new(Device::Cpu);
        let model = net(&vs, case);
        if case == "frozen" {
            freeze_l0(&vs);
        }
        if case == "float64" {
            vs.double();
        }
        let mut opt = nn::AdamW::default().build(&vs, 1e-2).unwrap();
        for step in 0..STEPS {
            let (x, y) = global_batch(step, world, micro);
            let (x, y) = if case == "float64" {
                (x.to_kind(Kind::Double), y.to_kind(Kind::Double))
            } else {
                (x, y)
            };
            opt.zero_grad();
            for r in 0..world {
                for m in 0..micro {
                    tch::manual_seed(1000 * step + 10 * m + r);
                    let (xs, ys) = (shard(&x, r, m, micro), shard(&y, r, m, micro));
                    let loss = shard_loss(case, &xs, &ys, &|x| Ok(model.forward(case, x, step, r)))
                        .unwrap();
                    (loss / world as f64).backward();
                }
            }
            opt.step();
        }
        let reference = snapshot(&vs);
        let diff = trained
            .iter()
            .zip(&reference)
            .map(|((ka, a), (kb, b))| {
                assert_eq!(ka, kb);
                (a - b).abs().max().double_value(&[])
            })
            .fold(0.0, f64::max);
        note("max_diff", format!("{diff:e}"));
    }
}

// ---------------------------------------------------------------------------------
// Tests

/// The tolerance of `tests/dist.rs` (float32 summation order; a wrong gradient moves a
/// parameter by about the 1e-2 learning rate).
const TOL: f64 = 1e-5;

fn check_train(case: &str, world: usize) {
    let reports = run_ok(&format!("train_{case}"), world);
    for (rank, f) in reports.iter().enumerate() {
        for bad in ["new_err", "forward_err", "backward_err"] {
            assert!(!f.contains_key(bad), "{case} rank {rank}: {f:?}");
        }
        assert_eq!(f["same_as_rank0"], "true", "{case} rank {rank}: {f:?}");
    }
    let diff: f64 = reports[0]["max_diff"].parse().unwrap();
    eprintln!("{case} x{world}: largest parameter difference {diff:e}");
    assert!(
        (0.0..TOL).contains(&diff),
        "{case} x{world}: {:?}",
        reports[0]
    );
}

/// Non-contiguous tensors (they used to exchange the wrong elements and overwrite their
/// neighbours), `Avg` of integers (used to fail after the sum, leaving it in place),
/// `reduce_scatter` inputs of two shapes or dtypes (used to abort the process in Gloo).
#[test]
fn misused_collective_arguments() {
    let reports = run_ok("collective_args", 2);
    for (rank, f) in reports.iter().enumerate() {
        eprintln!("rank {rank}: {f:?}");
        for key in [
            "noncontig_all_reduce",
            "noncontig_rest_untouched",
            "noncontig_broadcast",
            "transposed_all_gather",
            "empty_all_reduce",
            "scalar_all_reduce",
            "still_works",
        ] {
            assert_eq!(f[key], "true", "rank {rank} {key}: {f:?}");
        }
        for key in ["noncontig_all_reduce_err", "noncontig_broadcast_err"] {
            assert_eq!(f[key], "false", "rank {rank} {key}: {f:?}");
        }
        // Refused before anything is exchanged: the tensor keeps this rank's values.
        assert!(f["int_avg_err"].starts_with("InvalidArgument"), "{f:?}");
        assert_eq!(
            f["int_avg_value"],
            format!("[{}.0,_{}.0]", 3 + rank, 4 + rank),
            "{f:?}"
        );
        for key in ["reduce_scatter_ragged", "reduce_scatter_dtypes"] {
            assert!(f[key].starts_with("err:InvalidArgument"), "{key}: {f:?}");
        }
    }
}

/// A collective whose ranks disagree on the size or dtype is an error on every rank, with
/// the message of `dist/agree.rs`. Without that fingerprint exchange, c10d's Gloo backend
/// has none: the rank receiving more bytes than it expects aborts in Gloo's transport
/// thread (`gloo::EnforceNotMet`, uncatchable) and the other gets "Connection reset by
/// peer" or, for `all_gather`, garbage and no error (PyTorch too, unless
/// `TORCH_DISTRIBUTED_DEBUG=DETAIL`).
fn check_collective_mismatch(scenario: &str) {
    let results = run_workers(scenario, 2, Duration::from_secs(60));
    for (rank, (ok, report)) in results.iter().enumerate() {
        assert!(ok, "{scenario} rank {rank} died: {report}");
        let err = &fields(report)["err"];
        assert!(err.starts_with("Dist("), "{scenario} rank {rank}: {report}");
        assert!(
            err.contains("every_rank_must_make_the_same_collective_call"),
            "{scenario} rank {rank}: {report}"
        );
    }
}

#[test]
fn all_gather_with_shapes_that_differ_between_ranks_is_an_error_on_every_rank() {
    check_collective_mismatch("all_gather_shapes_differ");
}

#[test]
fn all_reduce_with_dtypes_that_differ_between_ranks_is_an_error_on_every_rank() {
    check_collective_mismatch("all_reduce_dtypes_differ");
}

/// Construction fails on every rank with a message naming what differs (and nothing
/// aborts or is left silently wrong).
fn check_model_mismatch(scenario: &str, needle: &str) {
    let results = run_workers(scenario, 2, Duration::from_secs(60));
    for (rank, (ok, report)) in results.iter().enumerate() {
        eprintln!("{scenario} rank {rank}: {report}");
        assert!(ok, "{scenario} rank {rank} died: {report}");
        let err = &fields(report)["err"];
        assert!(err.starts_with("Dist("), "{scenario} rank {rank}: {report}");
        assert!(err.contains("same_model_on_every_rank"), "{report}");
        assert!(
            err.contains(needle),
            "{scenario}: {needle:?} not in {report}"
        );
    }
}

#[test]
fn ddp_with_dtypes_that_differ_between_ranks_is_an_error_on_every_rank() {
    check_model_mismatch("ddp_dtypes_differ", "parameter_0_is_");
}

#[test]
fn ddp_with_dims_that_differ_between_ranks_is_an_error_on_every_rank() {
    check_model_mismatch("ddp_dims_differ", "dimensions");
}

#[test]
fn ddp_with_buffers_that_differ_between_ranks_is_an_error_on_every_rank() {
    check_model_mismatch("ddp_buffers_differ", "buffer_0_is_");
}

#[test]
fn two_process_groups_at_once() {
    for f in run_ok("two_groups", 2) {
        assert_eq!(f["two_groups"], "true", "{f:?}");
    }
}

/// A layer frozen with `set_requires_grad(false)` used to make construction fail
/// ("parameter 0 does not require grad"): tch keeps it among the trainable variables.
#[test]
fn ddp_with_a_frozen_layer_matches_one_process() {
    check_train("frozen", 2);
}

#[test]
fn ddp_with_a_layer_in_three_segments_matches_one_process() {
    check_train("shared3", 2);
}

#[test]
fn ddp_with_a_layer_unused_on_one_rank_matches_one_process() {
    check_train("unused_on_rank1", 2);
}

#[test]
fn ddp_no_sync_for_two_micro_batches_from_the_first_step_matches_one_process() {
    check_train("no_sync3", 2);
}

#[test]
fn ddp_after_a_forward_without_backward_matches_one_process() {
    check_train("forward_without_backward", 2);
}

#[test]
fn ddp_with_a_model_macro_matches_one_process() {
    check_train("model_macro", 2);
}

#[test]
fn ddp_with_float64_parameters_matches_one_process() {
    check_train("float64", 2);
}

#[test]
fn ddp_with_two_forwards_and_one_backward_matches_one_process() {
    check_train("two_forwards", 2);
}

/// Used to crash with a segmentation fault at the first step whose set of unused
/// parameters differs from the previous one: the Reducer had no `c10d::Logger`.
#[test]
fn find_unused_parameters_with_a_layer_skipped_at_odd_steps_matches_one_process() {
    check_train("skip_odd_steps_listed", 2);
}

/// `find_unused_parameters` searches the graph from the outputs for parameters; a
/// tensor a checkpointed closure captures unlisted is not in that graph, so it is
/// marked unused, then its gradient arrives from the recompute: PyTorch's error, on
/// every rank, at the first step (documented on `DdpOptions::find_unused_parameters`).
#[test]
fn find_unused_parameters_with_an_unlisted_capture_is_the_reducer_error() {
    for (rank, (ok, report)) in run_workers("train_skip_odd_steps", 2, Duration::from_secs(120))
        .iter()
        .enumerate()
    {
        assert!(ok, "rank {rank}: {report}");
        let err = &fields(report)["backward_err"];
        assert!(err.starts_with("step0:"), "rank {rank}: {report}");
        assert!(
            err.contains("marked_as_ready_twice"),
            "rank {rank}: {report}"
        );
    }
}

#[test]
fn three_ranks_with_a_layer_in_three_segments_and_no_sync() {
    check_train("shared3", 3);
    check_train("no_sync3", 3);
}

#[test]
fn a_rank_that_panics_in_a_recompute_makes_the_others_fail_within_the_timeout() {
    let results = run_workers("train_panic_in_recompute", 2, Duration::from_secs(120));
    eprintln!("{results:?}");
    let (ok, report) = &results[0];
    assert!(ok, "rank 0: {report}");
    let f = fields(report);
    // An error of the backward (tch's `Torch` error: c10d's message, "Connection closed
    // by peer") at the step where rank 1 failed; rank 1 got the recompute's panic as an
    // error of its own backward.
    assert!(f["backward_err"].starts_with("step1:"), "{report}");
    assert!(
        results[1].1.contains("panicked_during_recompute"),
        "rank 1: {}",
        results[1].1
    );
    let secs: f64 = f["backward_secs"].parse().unwrap();
    assert!(secs < 60.0, "{report}");
}

#[test]
fn ddp_with_tiny_buckets_matches_one_process() {
    check_train("tiny_buckets", 2);
}

/// `Duration::MAX` ("wait forever") used to overflow c10d's deadline and fail at once.
#[test]
fn a_huge_timeout_is_not_an_immediate_failure() {
    let _serial = serial();
    for timeout in [Duration::MAX, Duration::from_secs(1 << 40)] {
        let mut o = InitOptions::new("127.0.0.1", free_port(), 0, 1);
        o.timeout = timeout;
        match dist::f_init(&o) {
            Ok(pg) => {
                let t = Tensor::from_slice(&[2.0f32]);
                let r = pg.f_all_reduce(&t, ReduceOp::Sum);
                let b = pg.f_barrier();
                eprintln!("timeout {timeout:?}: all_reduce {r:?} barrier {b:?}");
                assert!(r.is_ok() && b.is_ok(), "{timeout:?}: {r:?} {b:?}");
            }
            Err(e) => panic!("timeout {timeout:?}: {e:?}"),
        }
    }
}

#[test]
fn an_unresolvable_master_is_an_error_within_the_timeout() {
    let mut o = InitOptions::new("no-such-host.invalid", free_port(), 1, 2);
    o.timeout = Duration::from_secs(3);
    let start = Instant::now();
    let r = dist::f_init(&o);
    eprintln!("{:?} after {:?}", r.as_ref().err(), start.elapsed());
    assert!(matches!(r, Err(CkptError::Dist(_))), "{:?}", r.err());
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}

/// `DistributedSampler` at its edges: fewer samples than ranks, both tail options,
/// every rank's share across epochs, against PyTorch's counts.
#[test]
fn distributed_sampler_edges() {
    use ckpt::dist::DistributedSampler;
    for len in 0..12usize {
        for world in 1..5usize {
            for drop_last in [false, true] {
                let shares: Vec<Vec<usize>> = (0..world)
                    .map(|r| {
                        DistributedSampler::new(len, world, r)
                            .drop_last(drop_last)
                            .seed(3)
                            .indices()
                    })
                    .collect();
                // PyTorch: ceil((len - world) / world) with drop_last and a ragged tail,
                // else ceil(len / world).
                let expect = if drop_last && len % world != 0 {
                    ((len as f64 - world as f64) / world as f64).ceil().max(0.0) as usize
                } else {
                    len.div_ceil(world)
                };
                let s = DistributedSampler::new(len, world, 0).drop_last(drop_last);
                assert_eq!(
                    s.num_samples(),
                    expect,
                    "len {len} world {world} {drop_last}"
                );
                assert!(
                    shares.iter().all(|s| s.len() == expect),
                    "{len} {world} {shares:?}"
                );
                let mut all: Vec<usize> = shares.concat();
                assert!(all.iter().all(|&i| i < len), "{len} {world} {all:?}");
                all.sort();
                let n = all.len();
                all.dedup();
                if drop_last {
                    // Disjoint shares.
                    assert_eq!(all.len(), n, "{len} {world} {shares:?}");
                } else {
                    // Every sample covered.
                    assert_eq!(all, (0..len).collect::<Vec<_>>(), "{len} {world}");
                }
            }
        }
    }
    // set_epoch reorders, and every rank agrees on the epoch's permutation.
    let mut a = DistributedSampler::new(10, 2, 0);
    let mut b = DistributedSampler::new(10, 2, 1);
    let e0 = [a.indices(), b.indices()].concat();
    a.set_epoch(1);
    b.set_epoch(1);
    let e1 = [a.indices(), b.indices()].concat();
    assert_ne!(e0, e1);
    let (mut s0, mut s1) = (e0.clone(), e1.clone());
    s0.sort();
    s1.sort();
    assert_eq!(s0, s1);
}
