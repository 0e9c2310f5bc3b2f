//! The multi-process harness `tests/dist.rs` and `tests/dist_break.rs` share: a test
//! runs the ignored test `worker` of its own binary in N child processes through `ckpt`'s
//! local launcher (the variables torchrun sets, plus `CKPT_DIST_SCENARIO`, `CKPT_DIST_OUT`
//! and a second free port `CKPT_DIST_PORT2`), on 127.0.0.1 and a free port; each worker
//! writes `rank<r>.txt` into `CKPT_DIST_OUT`. Every wait is bounded: workers that outlive
//! the deadline are killed by PID and the test fails.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ckpt::dist::{self, LocalLaunch};

/// One multi-process run at a time: the machine has few cores and each run starts up to
/// three processes.
static RUNS: Mutex<()> = Mutex::new(());

/// Holds the one-run-at-a-time lock.
pub fn serial() -> MutexGuard<'static, ()> {
    RUNS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port of 127.0.0.1 free now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local addr")
        .port()
}

/// Runs `scenario` in `world` worker processes; returns each rank's exit success and
/// report (the contents of its `rank<r>.txt`, empty when it wrote none). Workers still
/// running at `deadline` are killed by PID (by the launcher) and the test fails.
pub fn run_workers(scenario: &str, world: usize, deadline: Duration) -> Vec<(bool, String)> {
    let _serial = serial();
    let out = tempfile::tempdir().expect("tempdir");
    let mut launch = LocalLaunch::new(
        std::env::current_exe().expect("current_exe"),
        [
            "--ignored",
            "--exact",
            "worker",
            "--nocapture",
            "--test-threads=1",
        ]
        .map(Into::into)
        .to_vec(),
        world,
    );
    launch.envs = vec![
        ("CKPT_DIST_SCENARIO".into(), scenario.into()),
        ("CKPT_DIST_OUT".into(), out.path().display().to_string()),
        ("CKPT_DIST_PORT2".into(), free_port().to_string()),
        ("OMP_NUM_THREADS".into(), "1".into()),
    ];
    launch.timeout = Some(deadline);
    let result = dist::launch_local(&launch).expect("launch workers");
    assert!(
        !result.timed_out,
        "scenario {scenario} x{world}: workers still running after {deadline:?}; killed"
    );
    reports(
        out.path(),
        &result
            .status
            .iter()
            .map(|s| s.is_some_and(|s| s.success()))
            .collect::<Vec<_>>(),
    )
}

/// Each rank's success (`ok`) with its report, read from `out/rank<r>.txt`.
pub fn reports(out: &Path, ok: &[bool]) -> Vec<(bool, String)> {
    ok.iter()
        .enumerate()
        .map(|(r, ok)| {
            let report =
                std::fs::read_to_string(out.join(format!("rank{r}.txt"))).unwrap_or_default();
            (*ok, report)
        })
        .collect()
}

/// Runs a scenario that must succeed on every rank; returns the reports.
pub fn run_ok(scenario: &str, world: usize) -> Vec<String> {
    let results = run_workers(scenario, world, Duration::from_secs(240));
    for (rank, (ok, report)) in results.iter().enumerate() {
        assert!(
            ok,
            "scenario {scenario} x{world}: rank {rank} failed: {report}"
        );
    }
    results.into_iter().map(|(_, r)| r).collect()
}

/// `key=value` pairs of a report.
pub fn fields(report: &str) -> HashMap<String, String> {
    report
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
