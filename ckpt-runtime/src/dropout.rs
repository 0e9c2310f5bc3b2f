//! Compact dropout: training-mode CPU dropout that keeps its mask for backward as bits
//! ([`compact_dropout`]).

use crate::ffi::CompactDropout;

/// Runs `f` with compact dropout on this thread: every training-mode dropout call
/// (`Tensor::dropout`, `nn::func::dropout`, the `dropout` of tch's modules) on a CPU
/// floating-point tensor that needs a gradient keeps its mask as bits, 1 bit an element,
/// for its backward, instead of a noise tensor of the input's size and type. Results and
/// gradients (first and second order) are bit-equal to plain dropout's; the random stream
/// is drawn exactly as plain dropout draws it (the same `bernoulli_(1 - p)` on a tensor
/// like the input's).
///
/// libtorch's CPU dropout (`at::native::dropout`, a composite) returns `input * noise`,
/// whose `MulBackward0` node holds the noise until backward: as many bytes as the output,
/// 4 an element for float32. A compact dropout's node holds the noise's 0/1 pattern,
/// `ceil(numel / 8)` bytes, and rebuilds the noise in backward (`csrc/policy.cpp`). On a
/// transformer block the attention weights' dropout is the big one: at batch 4, 4 heads,
/// seq 1024 its noise is a `[4, 4, 1024, 1024]` float tensor, 64 MiB, held in 2 MiB.
/// PyTorch's CUDA dropout (`native_dropout`) keeps a mask too, one byte an element.
///
/// Calls it leaves alone, which run libtorch's dropout unchanged: under `no_grad` or on
/// an input that needs no gradient (nothing is held for backward then), evaluation mode,
/// `p` of 0 or 1, CUDA tensors (libtorch's CUDA dropout keeps a byte mask already),
/// inputs with a forward-mode tangent, and calls inside a checkpointed segment that has
/// a [`Policy`](crate::Policy) keeping dropout masks (the segment keeps them itself). A
/// checkpointed segment's recompute is compact when its backward is called inside the
/// scope on this thread (it runs on the calling thread on CPU), and its policy keeps no
/// masks.
///
/// Nesting is allowed (the inner scope restores the outer setting); the setting is per
/// thread, like grad mode, and is restored when `f` panics.
///
/// ```
/// # use tch::{Kind, Tensor};
/// let x = Tensor::randn([4, 256], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
/// let y = ckpt_runtime::compact_dropout(|| x.dropout(0.1, true));
/// // the mask is held as 4 * 256 / 8 = 128 bytes until backward, not as a 4 KiB tensor
/// y.sum(Kind::Float).backward();
/// ```
pub fn compact_dropout<R>(f: impl FnOnce() -> R) -> R {
    let _on = CompactDropout::set(true);
    f()
}

/// The guard form of [`compact_dropout`]: compact dropout is on on this thread until the
/// guard is dropped, which restores the setting it found. Not `Send`. Guards nest when
/// dropped in the reverse order of their creation (as tch's grad-mode guards); dropped
/// out of order, the last one dropped restores what it found (on, for an inner guard).
#[must_use = "compact dropout is on only while the guard lives"]
pub struct CompactDropoutGuard(#[allow(dead_code)] CompactDropout);

impl std::fmt::Debug for CompactDropoutGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompactDropoutGuard")
    }
}

/// Turns compact dropout on on this thread until the returned guard is dropped (see
/// [`compact_dropout`]).
pub fn compact_dropout_guard() -> CompactDropoutGuard {
    CompactDropoutGuard(CompactDropout::set(true))
}
