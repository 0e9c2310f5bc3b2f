//! The Rust side of `ckpt`'s side-by-side benchmarks (`bench/README.md`), and the byte
//! meter that the PyTorch side loads.
//!
//! The library is built twice: as an rlib for the `ckpt-bench` binary, and as a shared
//! object (`libckpt_bench.so`) exporting [`ckpt_meter_current_bytes`],
//! [`ckpt_meter_peak_bytes`] and [`ckpt_meter_reset_peak`]. `torch_side.py` loads it
//! with `ctypes` after `import torch`; both processes use the same libtorch 2.13.0
//! libraries, so loading it installs `ckpt`'s counting CPU allocator into PyTorch too,
//! and both sides measure peak tensor bytes with the very same counter.

pub mod measure;
pub mod models;
pub mod util;

use std::panic::catch_unwind;

use tch::Device;

/// Tensor bytes live on the CPU now (`ckpt::memory::current_bytes`); -1 on failure.
#[unsafe(no_mangle)]
pub extern "C" fn ckpt_meter_current_bytes() -> i64 {
    catch_unwind(|| ckpt::memory::current_bytes(Device::Cpu)).unwrap_or(-1)
}

/// The peak of [`ckpt_meter_current_bytes`] since the last reset; -1 on failure.
#[unsafe(no_mangle)]
pub extern "C" fn ckpt_meter_peak_bytes() -> i64 {
    catch_unwind(|| ckpt::memory::peak_bytes(Device::Cpu)).unwrap_or(-1)
}

/// Sets the CPU peak to the current bytes.
#[unsafe(no_mangle)]
pub extern "C" fn ckpt_meter_reset_peak() {
    let _ = catch_unwind(|| ckpt::memory::reset_peak(Device::Cpu));
}
