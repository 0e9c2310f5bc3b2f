//! What both benchmark programs share: running the PyTorch side and reading its JSON,
//! and the plots' font.

use std::process::Command;

use anyhow::{Context, Result, anyhow, ensure};
use plotters::style::FontStyle;
use serde_json::Value;

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
