//! Automatic mixed precision: PyTorch's `torch.autocast` for tch code, on CPU and CUDA.
//!
//! tch's own `tch::autocast` covers CUDA with float16 only; this covers both device types
//! and both reduced-precision types. Checkpointed segments record the autocast state at
//! forward and replay their recompute under it (PyTorch does the same), so a segment run
//! under `autocast` recomputes in the same precision even though backward runs outside.
//!
//! **A weight used more than once.** Autocast casts a float32 weight to the reduced type
//! once per autocast region and reuses the copy (its cast cache). Without checkpointing,
//! the gradients of all uses meet at that one cast and are summed in the reduced type
//! before its backward converts the sum to float32. A recompute casts the weight again
//! (the region of the forward is over by backward), so a use inside a checkpointed segment
//! reaches the float32 `.grad` through its own cast, and the uses' gradients are summed in
//! float32: the gradient differs from the plain one at reduced-precision level (one
//! bfloat16 ulp of the sum). It is the more accurate of the two: with two uses it is the
//! exact sum of the two reduced-precision gradients rounded once to float32, so no element
//! is further from the exact sum than the plain gradient's (`tests/amp.rs`). Making it
//! equal to the plain one would mean sending the recompute's gradient into the forward
//! graph's cast node from inside that graph's backward, to get a less accurate sum; `ckpt`
//! does not. The same holds on CUDA, float16 or bfloat16: the cast cache and the
//! gradient flow are the same code for every device type (float16's sum rounds at 2^-11
//! of its magnitude instead of bfloat16's 2^-8).

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
/// other than `Kind::Half` / `Kind::BFloat16`; `f` does not run then. A panic of `f` is
/// not an error: it propagates, after the previous autocast state is restored.
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
