//! Exact tensor-memory accounting, in bytes.
//!
//! - **CPU**: a counting wrapper around libtorch's CPU allocator (`c10::SetCPUAllocator`)
//!   adds the requested size of every tensor allocation and subtracts it when the
//!   storage is freed. It is installed when the program loads (a static initialiser of
//!   `ckpt-runtime`'s C++ part, before any tensor op can run), so every CPU tensor is
//!   counted. The figures are the bytes tensors asked for: exact and deterministic for a
//!   given program, which is why tests may assert them. Allocator overhead (a 64-byte
//!   header per allocation, not counted) and non-tensor memory (oneDNN scratch buffers,
//!   the Rust heap) are not included.
//! - **CUDA**: the caching allocator's own statistics
//!   (`c10::CachingDeviceAllocator::DeviceStats::allocated_bytes`, aggregate pool), the
//!   numbers behind `torch.cuda.memory_allocated` / `max_memory_allocated`.

use tch::Device;

use crate::{CkptError, ffi};

/// Current and peak tensor bytes of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes held by live tensor storages now.
    pub current_bytes: i64,
    /// The largest `current_bytes` since the last [`reset_peak`] (or since counting began).
    pub peak_bytes: i64,
}

/// What [`measure`] saw while running a closure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeakReport {
    /// Tensor bytes live when the closure started.
    pub baseline_bytes: i64,
    /// Highest tensor bytes while it ran, minus `baseline_bytes`: the extra memory the
    /// closure needed at its worst moment.
    pub peak_above_baseline_bytes: i64,
    /// Tensor bytes live after it returned, minus `baseline_bytes` (what it kept).
    pub retained_bytes: i64,
}

/// Makes sure CPU tensor allocations are counted. Counting starts when the program
/// loads, so this is only needed where that static initialiser could not run (it is
/// idempotent and cheap).
pub fn enable() {
    ffi::memory_enable();
}

/// Current and peak tensor bytes on `device` (see the [module docs](self) for what is
/// counted).
///
/// # Panics
///
/// When [`f_stats`] fails.
pub fn stats(device: Device) -> MemoryStats {
    f_stats(device).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`stats`].
///
/// # Errors
///
/// [`CkptError::Cuda`] when `device` is CUDA and CUDA is not available;
/// [`CkptError::InvalidArgument`] for devices other than CPU and CUDA.
pub fn f_stats(device: Device) -> Result<MemoryStats, CkptError> {
    match device {
        Device::Cpu => {
            ffi::memory_enable();
            let (current_bytes, peak_bytes) = ffi::cpu_memory();
            Ok(MemoryStats {
                current_bytes,
                peak_bytes,
            })
        }
        Device::Cuda(i) => {
            let (current_bytes, peak_bytes) = ffi::cuda_memory(i).map_err(CkptError::Cuda)?;
            Ok(MemoryStats {
                current_bytes,
                peak_bytes,
            })
        }
        other => Err(CkptError::InvalidArgument(format!(
            "memory statistics are available for CPU and CUDA, not {other:?}"
        ))),
    }
}

/// Tensor bytes live on `device` now.
///
/// # Panics
///
/// As [`stats`].
pub fn current_bytes(device: Device) -> i64 {
    stats(device).current_bytes
}

/// The peak of [`current_bytes`] since the last [`reset_peak`].
///
/// # Panics
///
/// As [`stats`].
pub fn peak_bytes(device: Device) -> i64 {
    stats(device).peak_bytes
}

/// Sets the peak of `device` to its current bytes (`torch.cuda.reset_peak_memory_stats`).
///
/// # Panics
///
/// When [`f_reset_peak`] fails.
pub fn reset_peak(device: Device) {
    f_reset_peak(device).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`reset_peak`].
///
/// # Errors
///
/// As [`f_stats`].
pub fn f_reset_peak(device: Device) -> Result<(), CkptError> {
    match device {
        Device::Cpu => {
            ffi::memory_enable();
            ffi::cpu_reset_peak();
            Ok(())
        }
        Device::Cuda(i) => ffi::cuda_reset_peak(i).map_err(CkptError::Cuda),
        other => Err(CkptError::InvalidArgument(format!(
            "memory statistics are available for CPU and CUDA, not {other:?}"
        ))),
    }
}

/// Runs `f` and reports its peak tensor memory on `device` above the bytes live when it
/// started. Resets the device's peak first, so the figure belongs to `f` alone; on CUDA
/// it synchronises nothing, so call it around work whose allocations are issued inside
/// `f` (they are, for eager tch code).
///
/// On CPU, measurements nest: when `f` returns, the device's peak is raised back to at
/// least what it was before, so an enclosing `measure` (or a profiling run of
/// `segments = auto` inside it) still sees its own earlier peak. On CUDA the caching
/// allocator's peak can only be reset, so a nested `measure` forgets the enclosing one's
/// peak before it.
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// use tch::{Device, Kind, Tensor};
/// let (_, report) = ckpt::memory::measure(Device::Cpu, || {
///     let a = Tensor::zeros([1024], (Kind::Float, Device::Cpu)); // 4096 bytes
///     let b = a.exp();                                           // 4096 more
///     drop(a);
///     b
/// });
/// assert_eq!(report.peak_above_baseline_bytes, 8192);
/// assert_eq!(report.retained_bytes, 4096);
/// ```
///
/// # Panics
///
/// As [`stats`], and when `f` panics.
pub fn measure<R>(device: Device, f: impl FnOnce() -> R) -> (R, PeakReport) {
    f_measure(device, f).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`measure`].
///
/// # Errors
///
/// As [`f_stats`]; `f` is not run then. A panic of `f` is not an error: it propagates
/// (an enclosing measurement keeps the peak it had seen).
pub fn f_measure<R>(device: Device, f: impl FnOnce() -> R) -> Result<(R, PeakReport), CkptError> {
    /// Gives the enclosing measurement its peak back, also when `f` panics.
    struct KeepEnclosingPeak(Option<i64>);
    impl Drop for KeepEnclosingPeak {
        fn drop(&mut self) {
            if let Some(peak) = self.0 {
                ffi::cpu_raise_peak(peak);
            }
        }
    }
    let enclosing_peak = f_stats(device)?.peak_bytes;
    f_reset_peak(device)?;
    let keep = KeepEnclosingPeak((device == Device::Cpu).then_some(enclosing_peak));
    let before = f_stats(device)?;
    let r = f();
    let after = f_stats(device)?;
    drop(keep);
    Ok((
        r,
        PeakReport {
            baseline_bytes: before.current_bytes,
            peak_above_baseline_bytes: after.peak_bytes - before.current_bytes,
            retained_bytes: after.current_bytes - before.current_bytes,
        },
    ))
}

/// Whether a CUDA device is usable by libtorch in this process.
pub fn cuda_available() -> bool {
    ffi::cuda_available()
}
