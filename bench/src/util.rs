//! What both benchmark programs share: their common arguments, running the PyTorch side
//! and reading its JSON, and the plots' font.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, ensure};
use plotters::style::FontStyle;
use serde_json::Value;

/// The arguments both benchmark programs take (flattened into each one's own).
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Intra-op threads on both sides.
    #[arg(long, default_value_t = 2)]
    pub threads: i32,
    /// A Python with PyTorch 2.13.0 (the venv that `./x.sh` sets up).
    #[arg(long)]
    pub python: PathBuf,
    /// `libckpt_bench.so`, which the PyTorch side loads to count tensor bytes.
    #[arg(long)]
    pub meter: PathBuf,
    /// Machine description for the report.
    #[arg(long, default_value = "unknown machine")]
    pub machine: String,
    /// Date for the report.
    #[arg(long, default_value = "unknown date")]
    pub date: String,
}

impl CommonArgs {
    /// Runs the PyTorch side `script` with `request` (its `--request`) and these
    /// arguments' Python, meter and threads; parses the JSON object it prints last.
    ///
    /// # Errors
    ///
    /// As [`last_json_line`].
    pub fn run_torch_side(&self, script: &Path, request: &Value) -> Result<Value> {
        last_json_line(
            Command::new(&self.python)
                .arg(script)
                .arg("--meter")
                .arg(&self.meter)
                .arg("--threads")
                .arg(self.threads.to_string())
                .arg("--request")
                .arg(request.to_string()),
        )
    }
}

/// Runs `cmd` (a PyTorch side script) and parses the JSON object it prints on its last
/// line of standard output.
///
/// # Errors
///
/// The program cannot start, exits unsuccessfully (its standard error is in the message),
/// prints nothing, or its last line is not JSON.
pub fn last_json_line(cmd: &mut Command) -> Result<Value> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    ensure!(
        out.status.success(),
        "the PyTorch side failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .last()
        .ok_or_else(|| anyhow!("the PyTorch side printed nothing"))?;
    serde_json::from_str(last).with_context(|| format!("the PyTorch side printed {last:?}"))
}

/// Registers the Hack font shipped inside the binary as `sans-serif`, so plots need no
/// system fonts.
///
/// # Errors
///
/// The built-in font cannot be loaded.
pub fn font() -> Result<()> {
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| anyhow!("the built-in font cannot be loaded"))
}
