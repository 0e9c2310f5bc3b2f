//! `ckpt::dist` on CPU Gloo over 127.0.0.1: collectives, `DistributedDataParallel` with
//! checkpointed models against a single process trained on the global batch (distinct
//! layers per segment, a layer shared by two segments, `no_sync`, `#[checkpointed]`
//! blocks, `segments = auto`, an unused layer), bucket overlap, buffers, the launchers
//! (ours and torchrun's), and the faults (bad launcher variables, unreachable master,
//! port in use, NCCL, a dead rank, parameters that differ between ranks).
//!
//! Multi-process tests re-execute this test binary as workers: the parent runs the
//! ignored test `worker` in N child processes with the variables torchrun sets
//! (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, ...) and `CKPT_DIST_SCENARIO`;
//! each worker writes `rank<r>.txt` into `CKPT_DIST_OUT`. Every wait is bounded: workers
//! that outlive the deadline are killed by PID and the test fails.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ckpt::dist::{
    self, Backend, DdpOptions, DistributedDataParallel, InitOptions, LocalLaunch, ProcessGroup,
    ReduceOp,
};
use ckpt::{CheckpointOptions, CkptError, ShallowClone};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

// ---------------------------------------------------------------------------------
// Parent side: spawning workers (tests/dist_common)

mod dist_common;
use dist_common::{fields, free_port, reports, run_ok, run_workers, serial};

// ---------------------------------------------------------------------------------
// Worker side

/// The worker entry point: not a test on its own (ignored); the multi-process tests run
/// it in child processes.
#[test]
#[ignore = "worker process of the multi-process tests, which run it"]
fn worker() {
    let scenario = std::env::var("CKPT_DIST_SCENARIO")
        .expect("CKPT_DIST_SCENARIO: this is run by the multi-process tests");
    let out = PathBuf::from(std::env::var("CKPT_DIST_OUT").expect("CKPT_DIST_OUT"));
    tch::set_num_threads(1);
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let report = match scenario.as_str() {
        "collectives" => collectives(),
        "train_distinct" => train(Variant::Distinct),
        "train_shared" => train(Variant::Shared),
        "train_no_sync" => train(Variant::NoSync),
        "train_macro" => train(Variant::Macro),
        "train_auto" => train(Variant::Auto),
        "train_unused" => train(Variant::Unused),
        "train_listed" => train(Variant::Listed),
        "train_macro_dynamic" => train(Variant::MacroDynamic),
        "dynamic_shared" => dynamic_shared(),
        "buffers" => buffers(),
        "overlap" => overlap(),
        "shape_mismatch" => shape_mismatch(),
        "dead_rank" => dead_rank(),
        other => panic!("unknown scenario {other}"),
    };
    write_report(&out, rank, &report);
}

fn write_report(out: &Path, rank: usize, report: &str) {
    std::fs::write(out.join(format!("rank{rank}.txt")), report).expect("write report");
}

fn init_env(timeout: Duration) -> ProcessGroup {
    let mut opts = InitOptions::from_env().expect("launcher variables");
    opts.timeout = timeout;
    dist::init(&opts)
}

fn collectives() -> String {
    let pg = init_env(Duration::from_secs(60));
    let (r, w) = (pg.rank() as f64, pg.world_size() as f64);
    let mut checks = Vec::new();
    // all_reduce: rank r holds [r + 1, 10 r, -r].
    let t = |r: f64| Tensor::from_slice(&[r + 1.0, 10.0 * r, -r]).to_kind(Kind::Float);
    let sum = t(r);
    pg.all_reduce(&sum, ReduceOp::Sum);
    let n = w * (w - 1.0) / 2.0; // sum of ranks
    checks.push(
        Vec::<f32>::try_from(&sum).unwrap() == vec![(n + w) as f32, (10.0 * n) as f32, -n as f32],
    );
    let avg = t(r);
    pg.all_reduce(&avg, ReduceOp::Avg);
    // Small integers sum exactly in float32; the division by the world size is then
    // correctly rounded.
    let expect_avg = vec![((n + w) / w) as f32, (10.0 * n / w) as f32, (-n / w) as f32];
    checks.push(Vec::<f32>::try_from(&avg).unwrap() == expect_avg);
    let max = t(r);
    pg.all_reduce(&max, ReduceOp::Max);
    checks.push(
        Vec::<f32>::try_from(&max).unwrap() == vec![w as f32, (10.0 * (w - 1.0)) as f32, 0.0],
    );
    // broadcast from the last rank.
    let b = Tensor::full([4], r, (Kind::Double, Device::Cpu));
    pg.broadcast(&b, pg.world_size() - 1);
    checks.push(Vec::<f64>::try_from(&b).unwrap() == vec![w - 1.0; 4]);
    // all_gather of [r, r*r] (int64).
    let g = pg.all_gather(&Tensor::from_slice(&[r as i64, (r * r) as i64]));
    checks.push(
        g.iter()
            .enumerate()
            .all(|(k, t)| Vec::<i64>::try_from(t).unwrap() == vec![k as i64, (k * k) as i64]),
    );
    // reduce_scatter: rank r sends [r*100 + k] to rank k; rank k gets sum over r.
    let inputs: Vec<Tensor> = (0..pg.world_size())
        .map(|k| Tensor::from_slice(&[r * 100.0 + k as f64, 1.0]))
        .collect();
    let rs = pg.reduce_scatter(&inputs, ReduceOp::Sum);
    checks.push(Vec::<f64>::try_from(&rs).unwrap() == vec![100.0 * n + w * r, w]);
    pg.barrier();
    // Bad arguments are errors, not panics or hangs.
    checks.push(matches!(
        pg.f_broadcast(&b, 99),
        Err(CkptError::InvalidArgument(_))
    ));
    checks.push(matches!(
        pg.f_reduce_scatter(&inputs[..1], ReduceOp::Sum),
        Err(CkptError::InvalidArgument(_))
    ));
    format!(
        "checks={checks:?} all_ok={} agent_store={}",
        checks.iter().all(|c| *c),
        pg.options().use_agent_store
    )
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    /// Each checkpointed segment uses its own layers.
    Distinct,
    /// Layer `l[1]` is used by both checkpointed segments.
    Shared,
    /// Distinct layers; two micro-batches per step, the first under `no_sync`.
    NoSync,
    /// Blocks whose forward is `#[checkpointed]` (one segment per block), the head
    /// inline.
    Macro,
    /// The forward under `#[checkpointed(segments = auto)]`: the planner profiles it
    /// at the first call and chooses the cuts.
    Auto,
    /// Distinct layers, but `l[2]` is never used: its gradient stays undefined.
    Unused,
    /// As `Shared`, with each segment listing the layers it captures
    /// (`CheckpointOptions::parameters_of`), and the Reducer without static graph: each
    /// parameter's accumulator runs once per backward.
    Listed,
    /// As `Macro` (the macro lists what its segments capture), without static graph.
    MacroDynamic,
}

impl Variant {
    /// Whether the Reducer runs in static-graph mode (the default), which checkpointing
    /// needs only for tensors captured unlisted.
    fn static_graph(self) -> bool {
        !matches!(self, Variant::Listed | Variant::MacroDynamic)
    }
}

/// The stages of `Variant::Auto`'s forward.
#[derive(Debug, ckpt::ShallowClone)]
struct AutoNet {
    l0: nn::Linear,
    l1: nn::Linear,
    l2: nn::Linear,
    head: nn::Linear,
}

impl AutoNet {
    #[ckpt::checkpointed(segments = auto)]
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.l0.forward(x).gelu("none").dropout(0.1, true);
        let h = self.l1.forward(&h).gelu("none").dropout(0.1, true) + h;
        let h = self.l2.forward(&h).gelu("none") + h;
        self.head.forward(&h)
    }
}

/// A residual block checkpointed as a whole by the macro, with dropout inside.
#[derive(Debug, ckpt::ShallowClone)]
struct Block {
    fc: nn::Linear,
}

impl Block {
    #[ckpt::checkpointed]
    fn forward(&self, x: &Tensor) -> Tensor {
        self.fc.forward(x).gelu("none").dropout(0.1, true) + x
    }
}

const D: i64 = 48;
const B: i64 = 4; // rows per rank and micro-batch
const STEPS: i64 = 4;

/// Three hidden layers and a head; two checkpointed segments, dropout inside them.
#[derive(Debug)]
struct Net {
    l: Vec<nn::Linear>,
    head: nn::Linear,
    shared: bool,
    macro_blocks: bool,
    auto: bool,
    skip: bool,
    listed: bool,
}

impl Net {
    fn new(vs: &nn::VarStore, variant: Variant) -> Net {
        let shared = matches!(variant, Variant::Shared | Variant::Listed);
        let macro_blocks = matches!(variant, Variant::Macro | Variant::MacroDynamic);
        let l = (0..3)
            .map(|i| nn::linear(vs.root() / format!("l{i}"), D, D, Default::default()))
            .collect();
        let head = nn::linear(vs.root() / "head", D, 2, Default::default());
        Net {
            l,
            head,
            shared,
            macro_blocks,
            auto: variant == Variant::Auto,
            skip: variant == Variant::Unused,
            listed: variant == Variant::Listed,
        }
    }

    fn forward(&self, xs: &Tensor) -> Tensor {
        if self.auto {
            let net = AutoNet {
                l0: self.l[0].shallow_clone(),
                l1: self.l[1].shallow_clone(),
                l2: self.l[2].shallow_clone(),
                head: self.head.shallow_clone(),
            };
            return net.forward(xs);
        }
        if self.macro_blocks {
            let mut h = xs.shallow_clone();
            for fc in &self.l {
                h = Block {
                    fc: fc.shallow_clone(),
                }
                .forward(&h);
            }
            return self.head.forward(&h);
        }
        // The options of a segment capturing `layers`: listing them when `listed`.
        let options = |layers: &[&nn::Linear]| {
            layers.iter().fold(CheckpointOptions::new(), |o, l| {
                if self.listed { o.parameters_of(*l) } else { o }
            })
        };
        let (a, b, shared) = (
            self.l[0].shallow_clone(),
            self.l[1].shallow_clone(),
            self.shared,
        );
        let h = ckpt::checkpoint_with(
            &options(&[&a, &b]),
            move |x: Tensor| {
                let h = a.forward(&x).gelu("none").dropout(0.1, true);
                if shared { b.forward(&h).tanh() + h } else { h }
            },
            xs.shallow_clone(),
        );
        let (b, c, skip) = (
            self.l[1].shallow_clone(),
            self.l[2].shallow_clone(),
            self.skip,
        );
        let h = ckpt::checkpoint_with(
            &options(&[&b, &c]),
            move |x: Tensor| {
                let h = b.forward(&x).gelu("none").dropout(0.1, true) + &x;
                if skip {
                    h
                } else {
                    c.forward(&h).gelu("none") + h
                }
            },
            h,
        );
        self.head.forward(&h)
    }
}

/// The global batch of `step`: inputs `[world * micro * rows, D]`, targets `[.., 2]`.
fn global_batch(step: i64, world: i64, micro: i64, rows: i64) -> (Tensor, Tensor) {
    tch::manual_seed(7000 + step);
    let n = world * micro * rows;
    (
        Tensor::randn([n, D], (Kind::Float, Device::Cpu)),
        Tensor::randn([n, 2], (Kind::Float, Device::Cpu)),
    )
}

/// Rows of rank `r`, micro-batch `m`.
fn shard(t: &Tensor, r: i64, m: i64, micro: i64, rows: i64) -> Tensor {
    t.narrow(0, (r * micro + m) * rows, rows)
}

fn dropout_seed(step: i64, m: i64, r: i64) -> i64 {
    1000 * step + 10 * m + r
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

/// K AdamW steps data-parallel; rank 0 then trains a single process on the same global
/// batches (same initial parameters, same dropout masks: each shard's forward is seeded
/// alike) and reports the largest parameter difference. Every rank also checks that its
/// parameters are bit-equal to rank 0's.
fn train(variant: Variant) -> String {
    let pg = init_env(Duration::from_secs(60));
    let (rank, world) = (pg.rank() as i64, pg.world_size() as i64);
    let micro = if variant == Variant::NoSync { 2 } else { 1 };
    // `segments = auto` checkpoints only when activations outweigh a segment's own cost
    // (its RNG state copy, 5 KB): give it 64 rows.
    let rows = if variant == Variant::Auto { 64 } else { B };

    // Different initial parameters on each rank: DDP must broadcast rank 0's.
    tch::manual_seed(100 + rank);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs, variant);
    let opts = DdpOptions {
        bucket_cap_mb: 0.02,
        first_bucket_cap_mb: 0.01,
        static_graph: variant.static_graph(),
        ..DdpOptions::default()
    };
    let ddp = DistributedDataParallel::new(&pg, &vs, opts);
    let buckets = ddp.bucket_sizes().len();
    let mut opt = nn::AdamW::default().build(&vs, 1e-2).unwrap();
    for step in 0..STEPS {
        let (x, y) = global_batch(step, world, micro, rows);
        opt.zero_grad();
        for m in 0..micro {
            let _guard = (m + 1 < micro).then(|| ddp.no_sync());
            tch::manual_seed(dropout_seed(step, m, rank));
            let out = ddp.forward(|| net.forward(&shard(&x, rank, m, micro, rows)));
            mse(&out, &shard(&y, rank, m, micro, rows)).backward();
        }
        opt.step();
    }
    let trained = snapshot(&vs);

    // Every rank holds rank 0's parameters, bit for bit.
    let mut same_as_rank0 = true;
    for (_, t) in &trained {
        let gathered = pg.all_gather(t);
        same_as_rank0 &= gathered.iter().all(|g| g.equal(&gathered[0]));
    }

    let mut max_diff = -1.0;
    if rank == 0 {
        tch::manual_seed(100);
        let vs = nn::VarStore::new(Device::Cpu);
        let net = Net::new(&vs, variant);
        let mut opt = nn::AdamW::default().build(&vs, 1e-2).unwrap();
        for step in 0..STEPS {
            let (x, y) = global_batch(step, world, micro, rows);
            opt.zero_grad();
            for r in 0..world {
                for m in 0..micro {
                    tch::manual_seed(dropout_seed(step, m, r));
                    let out = net.forward(&shard(&x, r, m, micro, rows));
                    (mse(&out, &shard(&y, r, m, micro, rows)) / world as f64).backward();
                }
            }
            opt.step();
        }
        let reference = snapshot(&vs);
        max_diff = trained
            .iter()
            .zip(&reference)
            .map(|((ka, a), (kb, b))| {
                assert_eq!(ka, kb);
                (a - b).abs().max().double_value(&[])
            })
            .fold(0.0, f64::max);
    }
    // Whether the unused layer got a gradient (it must not, on any rank).
    let unused_grad = net.l[2].ws.grad().defined();
    // Segments the planner chose (`segments = auto`), else 0.
    let planned = ckpt::plan::function_plans()
        .first()
        .map_or(0, |p| p.plan.segments());
    format!(
        "max_diff={max_diff:e} same_as_rank0={same_as_rank0} buckets={buckets} planned_segments={planned} unused_grad={unused_grad}"
    )
}

/// Records the bucket launches of a backward (after the first, static-graph, step):
/// with small buckets several all-reduces start before backward's last gradient.
fn overlap() -> String {
    let pg = init_env(Duration::from_secs(60));
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs, Variant::Distinct);
    let opts = DdpOptions {
        // ~1000 floats: each 48 x 48 weight closes a bucket.
        bucket_cap_mb: 0.004,
        first_bucket_cap_mb: 0.004,
        record_bucket_launches: true,
        ..DdpOptions::default()
    };
    let ddp = DistributedDataParallel::new(&pg, &vs, opts);
    let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
    let mut last = Default::default();
    for _ in 0..3 {
        let out = ddp.forward(|| net.forward(&x));
        out.square().mean(Kind::Float).backward();
        last = ddp.last_bucket_launches();
    }
    let launches = &last.launches;
    // A bucket launched by the k-th gradient hook records k - 1 hooks fired (the
    // Reducer's hook runs before the counting one): it started while backward still had
    // gradients to compute when k < hooks_total.
    let early = launches
        .iter()
        .filter(|(_, fired)| fired + 1 < last.hooks_total)
        .count();
    format!(
        "buckets={} launches={} early={early} hooks_total={} order={:?}",
        ddp.bucket_sizes().len(),
        launches.len(),
        last.hooks_total,
        launches
    )
}

/// Without static-graph mode a layer used by two checkpointed segments that capture it
/// unlisted has its gradient hook fire twice, which the Reducer refuses (the PyTorch
/// error, pytorch#24005). Listed (`Variant::Listed`), it fires once.
fn dynamic_shared() -> String {
    let pg = init_env(Duration::from_secs(30));
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs, Variant::Shared);
    let opts = DdpOptions {
        static_graph: false,
        ..DdpOptions::default()
    };
    let ddp = DistributedDataParallel::new(&pg, &vs, opts);
    let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
    let out = ddp.forward(|| net.forward(&x));
    match out.square().mean(Kind::Float).f_backward() {
        Err(e) => format!(
            "error=true marked_twice={}",
            e.to_string().contains("mark a variable ready only once")
        ),
        Ok(()) => "error=false".into(),
    }
}

/// Each rank writes its own value into a buffer (a variable that does not require grad,
/// like batch norm's running mean); a synchronized forward copies rank 0's to every
/// rank, unless `broadcast_buffers` is off.
fn buffers() -> String {
    let pg = init_env(Duration::from_secs(30));
    let mut out = Vec::new();
    for broadcast_buffers in [true, false] {
        let vs = nn::VarStore::new(Device::Cpu);
        let lin = nn::linear(vs.root() / "lin", 3, 3, Default::default());
        let mut buf = vs.root().zeros_no_train("running_mean", &[3]);
        let opts = DdpOptions {
            broadcast_buffers,
            ..DdpOptions::default()
        };
        let ddp = DistributedDataParallel::new(&pg, &vs, opts);
        let _ = tch::no_grad(|| buf.fill_(pg.rank() as f64 + 1.0));
        let x = Tensor::ones([2, 3], (Kind::Float, Device::Cpu));
        ddp.forward(|| lin.forward(&x) + &buf)
            .sum(Kind::Float)
            .backward();
        out.push(format!(
            "broadcast_{broadcast_buffers}={}",
            buf.double_value(&[0])
        ));
    }
    out.join(" ")
}

/// Rank 1 builds a different model: construction fails on every rank.
fn shape_mismatch() -> String {
    let pg = init_env(Duration::from_secs(30));
    let vs = nn::VarStore::new(Device::Cpu);
    let width = if pg.rank() == 1 { D + 1 } else { D };
    let _l = nn::linear(vs.root() / "l", width, D, Default::default());
    match DistributedDataParallel::f_new(&pg, &vs, DdpOptions::default()) {
        Err(CkptError::Dist(m)) => format!("error=dist message={:?}", m.replace(' ', "_")),
        Err(e) => format!("error=other message={e:?}"),
        Ok(_) => "error=none".into(),
    }
}

/// Rank 1 exits after construction; rank 0's next collective fails within its timeout.
fn dead_rank() -> String {
    let pg = init_env(Duration::from_secs(5));
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs, Variant::Distinct);
    let ddp = DistributedDataParallel::new(&pg, &vs, DdpOptions::default());
    if pg.rank() == 1 {
        std::process::exit(0);
    }
    let start = Instant::now();
    let x = Tensor::randn([B, D], (Kind::Float, Device::Cpu));
    let out = ddp.forward(|| net.forward(&x));
    let backward = out.square().mean(Kind::Float).f_backward();
    let all_reduce = pg.f_all_reduce(
        &Tensor::ones([3], (Kind::Float, Device::Cpu)),
        ReduceOp::Sum,
    );
    format!(
        "backward_err={} all_reduce_err={} secs={:.1}",
        backward.is_err(),
        matches!(all_reduce, Err(CkptError::Dist(_))),
        start.elapsed().as_secs_f64()
    )
}

// ---------------------------------------------------------------------------------
// Tests

#[test]
fn collectives_give_exact_values_on_2_and_3_ranks() {
    for world in [2, 3] {
        for (rank, report) in run_ok("collectives", world).iter().enumerate() {
            assert_eq!(
                fields(report)["all_ok"],
                "true",
                "x{world} rank {rank}: {report}"
            );
        }
    }
}

/// The tolerance of a data-parallel run against the single process. The two compute
/// the same gradient with a different summation order (each rank's mean over its shard,
/// multiplied by 1/world, then summed by Gloo, against autograd accumulating
/// loss/world shard by shard), so the averaged gradients differ by a few float32 ulps
/// (relative ~1e-7). AdamW turns a gradient into a step of about `lr` (1e-2) per
/// element whatever its scale, so a relative gradient error ε moves a step by about
/// `lr * ε` (more where the gradient is tiny against AdamW's eps); over 4 steps that is
/// ~1e-8. 1e-5 leaves room for the elements whose gradient is near zero, and is still
/// far below the 1e-2 step a wrong (for example unreduced or doubly reduced) gradient
/// makes.
const TOL: f64 = 1e-5;

fn check_train(scenario: &str) {
    for world in [2, 3] {
        let reports = run_ok(scenario, world);
        for (rank, report) in reports.iter().enumerate() {
            let f = fields(report);
            assert_eq!(
                f["same_as_rank0"], "true",
                "{scenario} x{world} rank {rank}: {report}"
            );
            assert!(f["buckets"].parse::<usize>().unwrap() > 1, "{report}");
        }
        let diff: f64 = fields(&reports[0])["max_diff"].parse().unwrap();
        eprintln!(
            "{scenario} x{world}: largest parameter difference {diff:e} ({})",
            reports[0]
        );
        assert!(
            (0.0..TOL).contains(&diff),
            "{scenario} x{world}: {}",
            reports[0]
        );
        if scenario == "train_unused" {
            for r in &reports {
                assert_eq!(fields(r)["unused_grad"], "false", "{r}");
            }
        }
        if scenario == "train_auto" {
            let planned: usize = fields(&reports[0])["planned_segments"].parse().unwrap();
            assert!(
                planned >= 2,
                "the planner checkpointed nothing: {}",
                reports[0]
            );
        }
    }
}

#[test]
fn ddp_with_distinct_layers_per_segment_matches_one_process() {
    check_train("train_distinct");
}

#[test]
fn ddp_with_a_layer_shared_by_two_segments_matches_one_process() {
    check_train("train_shared");
}

#[test]
fn ddp_no_sync_accumulation_matches_one_process() {
    check_train("train_no_sync");
}

#[test]
fn ddp_with_checkpointed_macro_blocks_matches_one_process() {
    check_train("train_macro");
}

#[test]
fn ddp_with_an_unused_layer_matches_one_process_and_leaves_its_grad_alone() {
    check_train("train_unused");
}

#[test]
fn ddp_with_segments_auto_matches_one_process() {
    check_train("train_auto");
}

#[test]
fn without_static_graph_a_listed_shared_layer_matches_one_process() {
    check_train("train_listed");
}

#[test]
fn without_static_graph_macro_blocks_match_one_process() {
    check_train("train_macro_dynamic");
}

#[test]
fn without_static_graph_an_unlisted_shared_layer_is_the_reducer_error() {
    for report in run_ok("dynamic_shared", 2) {
        let f = fields(&report);
        assert_eq!(f["error"], "true", "{report}");
        assert_eq!(f["marked_twice"], "true", "{report}");
    }
}

/// The venv's torchrun: `CKPT_TORCHRUN`, else `bin/torchrun` above libtorch (the set-up
/// links `.libtorch` into the venv's site-packages), else in the set-up's cache.
fn torchrun() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CKPT_TORCHRUN") {
        return Some(PathBuf::from(p));
    }
    let libtorch = std::env::var_os("LIBTORCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".libtorch"));
    if let Ok(real) = libtorch.canonicalize() {
        for dir in real.ancestors() {
            let t = dir.join("bin/torchrun");
            if t.exists() {
                return Some(t);
            }
        }
    }
    let cache = std::env::var_os("CKPT_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("ckpt")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/ckpt")))?;
    let t = cache.join("torch-2.13.0/bin/torchrun");
    t.exists().then_some(t)
}

#[test]
fn torchrun_no_python_launches_the_workers() {
    let Some(torchrun) = torchrun() else {
        eprintln!("skipped: no torchrun found (set CKPT_TORCHRUN to the venv's torchrun)");
        return;
    };
    let _serial = serial();
    let out = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(&torchrun)
        .args(["--no-python", "--nnodes", "1", "--nproc-per-node", "2"])
        .args([
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port.to_string(),
        ])
        .arg(&exe)
        .args([
            "--ignored",
            "--exact",
            "worker",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CKPT_DIST_SCENARIO", "collectives")
        .env("CKPT_DIST_OUT", out.path())
        .env("OMP_NUM_THREADS", "1")
        .spawn()
        .expect("spawn torchrun");
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("torchrun still running after 240 s; killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "torchrun: {status}");
    for (rank, (_, report)) in reports(out.path(), &[true, true]).iter().enumerate() {
        let f = fields(report);
        assert_eq!(
            f.get("all_ok").map(String::as_str),
            Some("true"),
            "rank {rank}: {report}"
        );
        eprintln!("torchrun rank {rank}: agent store = {}", f["agent_store"]);
    }
}

#[test]
fn buckets_are_reduced_while_backward_runs() {
    let reports = run_ok("overlap", 2);
    for report in &reports {
        let f = fields(report);
        let buckets: usize = f["buckets"].parse().unwrap();
        assert!(buckets >= 3, "{report}");
        assert_eq!(f["launches"].parse::<usize>().unwrap(), buckets, "{report}");
        // More than one bucket's all-reduce started before the last gradient hook.
        assert!(f["early"].parse::<usize>().unwrap() > 1, "{report}");
    }
}

#[test]
fn buffers_are_broadcast_from_rank_0_before_each_forward() {
    for (rank, report) in run_ok("buffers", 2).iter().enumerate() {
        let f = fields(report);
        assert_eq!(f["broadcast_true"], "1", "rank {rank}: {report}");
        assert_eq!(
            f["broadcast_false"],
            (rank + 1).to_string(),
            "rank {rank}: {report}"
        );
    }
}

#[test]
fn parameters_that_differ_between_ranks_are_an_error_on_every_rank() {
    let reports = run_ok("shape_mismatch", 2);
    for report in &reports {
        assert_eq!(fields(report)["error"], "dist", "{report}");
    }
}

#[test]
fn a_dead_rank_makes_the_others_fail_within_the_timeout() {
    let results = run_workers("dead_rank", 2, Duration::from_secs(60));
    let (ok, report) = &results[0];
    assert!(ok, "rank 0: {report}");
    let f = fields(report);
    assert_eq!(f["backward_err"], "true", "{report}");
    assert_eq!(f["all_reduce_err"], "true", "{report}");
}

fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

const ENV: [(&str, &str); 4] = [
    ("RANK", "1"),
    ("WORLD_SIZE", "2"),
    ("MASTER_ADDR", "127.0.0.1"),
    ("MASTER_PORT", "29500"),
];

#[test]
fn launcher_variables_are_read_and_checked() {
    let o = InitOptions::from_lookup(lookup(&ENV)).unwrap();
    assert_eq!(
        (o.rank, o.world_size, o.local_rank, o.local_world_size),
        (1, 2, 1, 2)
    );
    assert_eq!(
        (o.master_addr.as_str(), o.master_port),
        ("127.0.0.1", 29500)
    );
    assert!(!o.use_agent_store);
    assert_eq!(o.timeout, dist::DEFAULT_TIMEOUT);

    let mut agent = ENV.to_vec();
    agent.extend([
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("TORCHELASTIC_RESTART_COUNT", "3"),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("GLOO_SOCKET_IFNAME", "lo"),
    ]);
    let o = InitOptions::from_lookup(lookup(&agent)).unwrap();
    assert!(o.use_agent_store);
    assert_eq!(
        (o.restart_count, o.local_rank, o.local_world_size),
        (3, 0, 1)
    );
    assert_eq!(o.gloo_socket_ifname.as_deref(), Some("lo"));

    for missing in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
        let vars: Vec<_> = ENV.iter().copied().filter(|(k, _)| *k != missing).collect();
        match InitOptions::from_lookup(lookup(&vars)) {
            Err(CkptError::DistEnv(m)) => assert!(m.contains(missing), "{m}"),
            other => panic!("{missing} missing: {other:?}"),
        }
    }
    for (k, v, needle) in [
        ("RANK", "2", "out of range"),
        ("RANK", "-1", "RANK"),
        ("WORLD_SIZE", "0", "WORLD_SIZE"),
        ("MASTER_PORT", "0", "MASTER_PORT"),
        ("MASTER_PORT", "70000", "MASTER_PORT"),
        ("WORLD_SIZE", "two", "WORLD_SIZE"),
    ] {
        let mut vars = ENV.to_vec();
        vars.retain(|(key, _)| *key != k);
        vars.push((k, v));
        match InitOptions::from_lookup(lookup(&vars)) {
            Err(CkptError::DistEnv(m)) => assert!(m.contains(needle), "{k}={v}: {m}"),
            other => panic!("{k}={v}: {other:?}"),
        }
    }
    let mut local = ENV.to_vec();
    local.extend([("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2")]);
    assert!(matches!(
        InitOptions::from_lookup(lookup(&local)),
        Err(CkptError::DistEnv(_))
    ));
}

#[test]
fn an_unreachable_master_is_a_timeout_error() {
    // Nothing listens on this port; rank 1 is a client and retries until the timeout.
    let mut o = InitOptions::new("127.0.0.1", free_port(), 1, 2);
    o.timeout = Duration::from_secs(2);
    let start = Instant::now();
    match dist::f_init(&o) {
        Err(CkptError::Dist(m)) => assert!(!m.is_empty()),
        other => panic!("expected a c10d error, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn a_port_in_use_is_an_error() {
    let taken = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut o = InitOptions::new("127.0.0.1", port, 0, 1);
    o.timeout = Duration::from_secs(5);
    match dist::f_init(&o) {
        Err(CkptError::Dist(m)) => assert!(!m.is_empty()),
        other => panic!("expected a c10d error, got {other:?}"),
    }
}

#[test]
fn nccl_and_bad_options_are_errors() {
    let mut o = InitOptions::new("127.0.0.1", free_port(), 0, 1);
    o.backend = Backend::Nccl;
    assert!(matches!(dist::f_init(&o), Err(CkptError::DistEnv(m)) if m.contains("NCCL")));
    let o = InitOptions::new("127.0.0.1", free_port(), 3, 2);
    assert!(matches!(dist::f_init(&o), Err(CkptError::DistEnv(m)) if m.contains("out of range")));
}

#[test]
fn a_single_rank_group_trains_and_reduces_to_itself() {
    let mut o = InitOptions::new("127.0.0.1", free_port(), 0, 1);
    o.timeout = Duration::from_secs(30);
    let pg = dist::init(&o);
    let t = Tensor::from_slice(&[1.5f32, -2.0]);
    pg.all_reduce(&t, ReduceOp::Avg);
    assert_eq!(Vec::<f32>::try_from(&t).unwrap(), vec![1.5, -2.0]);
    // DDP over one rank: gradients equal the plain ones.
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let lin = nn::linear(vs.root(), 4, 3, Default::default());
    let ddp = DistributedDataParallel::new(&pg, &vs, DdpOptions::default());
    let x = Tensor::randn([5, 4], (Kind::Float, Device::Cpu));
    for _ in 0..2 {
        vs.trainable_variables().iter().for_each(|p| {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        });
        ddp.forward(|| lin.forward(&x)).sum(Kind::Float).backward();
    }
    // d(sum)/dW: every row is the sum of the inputs over the batch.
    let expected = x.sum_dim_intlist([0i64].as_slice(), false, Kind::Float);
    for row in 0..3 {
        assert!(
            lin.ws
                .grad()
                .get(row)
                .allclose(&expected, 1e-6, 1e-6, false),
            "row {row}"
        );
    }
    assert!(
        DistributedDataParallel::f_new(&pg, &nn::VarStore::new(Device::Cpu), DdpOptions::default())
            .is_err()
    );
}

fn sh(script: &str, nproc: usize) -> LocalLaunch {
    LocalLaunch::new("/bin/sh", vec!["-c".into(), script.into()], nproc)
}

#[test]
fn the_local_launcher_sets_torchruns_variables() {
    let out = tempfile::tempdir().unwrap();
    let mut l = sh(
        "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR > $OUT/$RANK",
        3,
    );
    l.master_port = Some(29999);
    l.envs = vec![("OUT".into(), out.path().display().to_string())];
    l.timeout = Some(Duration::from_secs(30));
    let r = dist::launch_local(&l).unwrap();
    assert!(r.success(), "{r:?}");
    for rank in 0..3 {
        let got = std::fs::read_to_string(out.path().join(rank.to_string())).unwrap();
        assert_eq!(got.trim(), format!("{rank} {rank} 3 3 0 127.0.0.1"));
    }
}

#[test]
fn the_local_launcher_kills_the_others_when_a_worker_fails_or_time_runs_out() {
    // Rank 1 fails at once; rank 0 would sleep for 60 s and is killed.
    let mut l = sh("[ $RANK = 1 ] && exit 3; sleep 60", 2);
    l.timeout = Some(Duration::from_secs(30));
    let start = Instant::now();
    let r = dist::launch_local(&l).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert!(!r.success() && !r.timed_out, "{r:?}");
    assert_eq!(r.status[1].and_then(|s| s.code()), Some(3));
    assert!(
        r.status[0].is_none(),
        "rank 0 should have been killed: {r:?}"
    );

    let mut l = sh("sleep 60", 2);
    l.timeout = Some(Duration::from_millis(300));
    let r = dist::launch_local(&l).unwrap();
    assert!(r.timed_out && !r.success(), "{r:?}");

    assert!(matches!(
        dist::launch_local(&sh("true", 0)),
        Err(CkptError::InvalidArgument(_))
    ));
    let missing = LocalLaunch::new("/nonexistent/worker", vec![], 2);
    assert!(matches!(
        dist::launch_local(&missing),
        Err(CkptError::Dist(_))
    ));
}
