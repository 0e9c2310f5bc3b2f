//! Automatic mixed precision: PyTorch's `torch.autocast` for tch code, on CPU and CUDA.
//!
//! tch's own `tch::autocast` covers CUDA with float16 only; this covers both device types
//! and both reduced-precision types. Checkpointed segments record the autocast state at
//! forward and replay their recompute under it (PyTorch does the same), so a segment run
//! under `autocast` recomputes in the same precision even though backward runs outside.

use tch::{Device, Kind};

use crate::{CkptError, ffi};

fn scalar_type(kind: Kind) -> Option<i32> {
    // c10::ScalarType codes.
    match kind {
        Kind::Half => Some(5),
        Kind::BFloat16 => Some(15),
        _ => None,
    }
}

struct Restore {
    cuda: bool,
    enabled: bool,
    dtype: i32,
}

impl Drop for Restore {
    fn drop(&mut self) {
        ffi::autocast_exit();
        // Restoring a state that was read a moment ago cannot fail.
        let _ = ffi::autocast_set(self.cuda, self.enabled, self.dtype);
    }
}

/// Runs `f` with autocast enabled for `device`'s type: eligible ops (matmul, linear,
/// convolutions, ...) compute in `dtype`, as `with torch.autocast(device_type, dtype)`.
/// The previous state is restored when `f` returns or panics.
///
/// ```no_run
/// # extern crate ckpt_runtime as ckpt;
/// use tch::{Device, Kind, Tensor};
/// let a = Tensor::randn([4, 4], (Kind::Float, Device::Cpu));
/// let b = ckpt::amp::autocast(Device::Cpu, Kind::BFloat16, || a.matmul(&a));
/// assert_eq!(b.kind(), Kind::BFloat16);
/// ```
///
/// # Panics
///
/// When [`f_autocast`] returns an error.
pub fn autocast<T>(device: Device, dtype: Kind, f: impl FnOnce() -> T) -> T {
    f_autocast(device, dtype, f).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`autocast`].
///
/// # Errors
///
/// [`CkptError::InvalidArgument`] for a device other than CPU or CUDA, or a `dtype`
/// other than `Kind::Half` / `Kind::BFloat16`; `f` does not run then.
pub fn f_autocast<T>(device: Device, dtype: Kind, f: impl FnOnce() -> T) -> Result<T, CkptError> {
    let cuda = match device {
        Device::Cpu => false,
        Device::Cuda(_) => true,
        other => {
            return Err(CkptError::InvalidArgument(format!(
                "autocast supports CPU and CUDA, not {other:?}"
            )));
        }
    };
    let code = scalar_type(dtype).ok_or_else(|| {
        CkptError::InvalidArgument(format!(
            "autocast computes in Half or BFloat16, not {dtype:?}"
        ))
    })?;
    let (enabled, prev) = ffi::autocast_set(cuda, true, code).map_err(CkptError::Torch)?;
    ffi::autocast_enter();
    let _restore = Restore {
        cuda,
        enabled,
        dtype: prev,
    };
    Ok(f())
}
