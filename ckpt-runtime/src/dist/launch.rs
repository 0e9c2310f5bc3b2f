//! A small local launcher: `torchrun --no-python --nproc-per-node N` for one machine,
//! without Python.

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::CkptError;

/// What [`launch_local`] starts: `nproc` copies of `program args..` on this machine.
#[derive(Debug, Clone)]
pub struct LocalLaunch {
    /// The program each worker runs.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Number of worker processes (the world size).
    pub nproc: usize,
    /// `MASTER_ADDR` (default `127.0.0.1`).
    pub master_addr: String,
    /// `MASTER_PORT`; `None` picks a free port of `127.0.0.1`.
    pub master_port: Option<u16>,
    /// More variables for every worker (`(name, value)`).
    pub envs: Vec<(String, String)>,
    /// Give up after this long: the workers still running are killed and the launch is
    /// an error. `None` waits as long as they run.
    pub timeout: Option<Duration>,
}

impl LocalLaunch {
    /// `nproc` workers running `program args..`, rendezvous on a free local port.
    pub fn new(program: impl Into<PathBuf>, args: Vec<OsString>, nproc: usize) -> Self {
        LocalLaunch {
            program: program.into(),
            args,
            nproc,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            envs: Vec::new(),
            timeout: None,
        }
    }
}

/// How each worker of a [`launch_local`] ended, by rank.
#[derive(Debug, Clone)]
pub struct LaunchResult {
    /// Exit status of each rank; `None` for a worker killed by the launcher (because
    /// another failed first, as torchrun does, or at the timeout).
    pub status: Vec<Option<ExitStatus>>,
    /// Whether the launcher gave up at the timeout.
    pub timed_out: bool,
}

impl LaunchResult {
    /// Every worker exited with success.
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.iter().all(|s| s.is_some_and(|s| s.success()))
    }
}

fn free_port() -> Result<u16, CkptError> {
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| CkptError::Dist(format!("cannot find a free port on 127.0.0.1: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| CkptError::Dist(e.to_string()))?
        .port())
}

fn kill(children: &mut [Child], status: &[Option<ExitStatus>]) {
    for (c, s) in children.iter_mut().zip(status) {
        if s.is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `launch.nproc` workers with the variables torchrun sets for one machine —
/// `RANK` = `LOCAL_RANK` = `0..nproc`, `WORLD_SIZE` = `LOCAL_WORLD_SIZE` = `nproc`,
/// `GROUP_RANK=0`, `MASTER_ADDR`, `MASTER_PORT` — and waits for them. When a worker
/// fails the others are killed (torchrun's behaviour), as they are at the timeout.
///
/// Errors: [`CkptError::InvalidArgument`] for `nproc = 0`, [`CkptError::Dist`] when a
/// worker cannot be started. Workers that fail are reported in the result, not as an
/// error.
pub fn launch_local(launch: &LocalLaunch) -> Result<LaunchResult, CkptError> {
    if launch.nproc == 0 {
        return Err(CkptError::InvalidArgument(
            "--nproc must be at least 1".into(),
        ));
    }
    let port = match launch.master_port {
        Some(p) => p,
        None => free_port()?,
    };
    let mut children = Vec::with_capacity(launch.nproc);
    for rank in 0..launch.nproc {
        let mut cmd = Command::new(&launch.program);
        cmd.args(&launch.args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("GROUP_RANK", "0")
            .env("WORLD_SIZE", launch.nproc.to_string())
            .env("LOCAL_WORLD_SIZE", launch.nproc.to_string())
            .env("MASTER_ADDR", &launch.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env_remove("TORCHELASTIC_USE_AGENT_STORE");
        for (k, v) in &launch.envs {
            cmd.env(k, v);
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                let status = vec![None; children.len()];
                kill(&mut children, &status);
                return Err(CkptError::Dist(format!(
                    "cannot start worker {rank} ({}): {e}",
                    launch.program.display()
                )));
            }
        }
    }
    let start = Instant::now();
    let mut status: Vec<Option<ExitStatus>> = vec![None; launch.nproc];
    loop {
        for (i, c) in children.iter_mut().enumerate() {
            if status[i].is_none()
                && let Ok(Some(s)) = c.try_wait()
            {
                status[i] = Some(s);
            }
        }
        if status.iter().all(Option::is_some) {
            return Ok(LaunchResult {
                status,
                timed_out: false,
            });
        }
        if status.iter().flatten().any(|s| !s.success()) {
            kill(&mut children, &status);
            return Ok(LaunchResult {
                status,
                timed_out: false,
            });
        }
        if launch.timeout.is_some_and(|t| start.elapsed() > t) {
            kill(&mut children, &status);
            return Ok(LaunchResult {
                status,
                timed_out: true,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// For a program's `--nproc N`: when `nproc > 1` and this process is not already a
/// worker (no `RANK` set), relaunches the current executable `nproc` times with `args`
/// (the program's arguments without `--nproc`) through [`launch_local`] and returns its
/// result; returns `Ok(None)` when this process should run as a worker or alone.
pub fn relaunch_self(nproc: usize, args: Vec<OsString>) -> Result<Option<LaunchResult>, CkptError> {
    if nproc <= 1 || std::env::var_os("RANK").is_some() {
        return Ok(None);
    }
    let exe = std::env::current_exe()
        .map_err(|e| CkptError::Dist(format!("cannot find the current executable: {e}")))?;
    launch_local(&LocalLaunch::new(exe, args, nproc)).map(Some)
}

/// [`relaunch_self`] for a program whose own `--nproc N` flag asks for `N` local workers:
/// the workers get this process's arguments without `--nproc N` (or `--nproc=N`), so
/// that each runs as one rank.
///
/// Returns `Ok(None)` when this process should run as a worker or alone (`nproc <= 1`, or
/// `RANK` already set by a launcher such as torchrun); errors as [`relaunch_self`].
pub fn relaunch_self_from_args(nproc: usize) -> Result<Option<LaunchResult>, CkptError> {
    relaunch_self(nproc, without_flag(std::env::args_os().skip(1), "--nproc"))
}

/// `args` without `flag VALUE` and `flag=VALUE` (every occurrence).
fn without_flag(args: impl IntoIterator<Item = OsString>, flag: &str) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut args = args.into_iter();
    let joined = format!("{flag}=");
    while let Some(a) = args.next() {
        if a == flag {
            args.next();
        } else if !a.to_str().is_some_and(|s| s.starts_with(&joined)) {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nproc_flag_is_removed_in_both_spellings() {
        let args = [
            "--quick",
            "--nproc",
            "2",
            "--seed",
            "3",
            "--nproc=4",
            "--nprocs=5",
        ];
        let out = without_flag(args.map(OsString::from), "--nproc");
        assert_eq!(
            out,
            ["--quick", "--seed", "3", "--nprocs=5"].map(OsString::from)
        );
    }
}
