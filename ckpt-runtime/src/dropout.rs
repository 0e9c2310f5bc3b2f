//! Compact dropout: training-mode CPU dropout that keeps its mask for backward as bits
//! ([`compact_dropout`]).

use crate::ffi::CompactDropout;

/// Runs `f` with compact dropout on this thread: every training-mode dropout call
/// (`Tensor::dropout`, `nn::func::dropout`, the `dropout` of tch's modules) on a CPU
/// floating-point tensor draws its mask straight into bits and, where it needs a
/// gradient, keeps those bits for its backward, 1 bit an element, instead of a noise
/// tensor of the input's size and type. Results and gradients (first and second order)
/// are bit-equal to plain dropout's, and the random stream is left as plain dropout
/// leaves it: the same draws (`bernoulli_(1 - p)` on a tensor like the input's) from the
/// same CPU generator.
///
/// libtorch's CPU dropout (`at::native::dropout`, a composite) returns `input * noise`,
/// whose `MulBackward0` node holds the noise until backward: as many bytes as the output,
/// 4 an element for float32. A compact dropout's node holds the noise's 0/1 pattern,
/// `ceil(numel / 8)` bytes, and rebuilds the noise in backward (`csrc/policy.cpp`). On a
/// transformer block the attention weights' dropout is the big one: at batch 4, 4 heads,
/// seq 1024 its noise is a `[4, 4, 1024, 1024]` float tensor, 64 MiB, held in 2 MiB.
/// PyTorch's CUDA dropout (`native_dropout`) keeps a mask too, one byte an element.
///
/// **The draw.** libtorch draws CPU dropout noise on one thread, element by element
/// (`bernoulli_`'s serial kernel over the generator's MT19937 engine): about 130 ms for
/// that `[4, 4, 1024, 1024]` noise on a 2-core Xeon. For a contiguous input a compact
/// dropout draws the same numbers from the same engine itself, blockwise and with AVX2
/// where the CPU has it (`csrc/bernoulli.cpp`), straight into the bits: about 12 ms there.
/// That kernel is checked against this libtorch's `bernoulli_` once a process; where they
/// disagree (another libtorch build), or for a non-contiguous input, the draw is
/// `bernoulli_`'s own, with the same results.
///
/// Calls it leaves alone, which run libtorch's dropout unchanged: evaluation mode, `p` of
/// 0 or 1, CUDA tensors (libtorch's CUDA dropout keeps a byte mask already), inputs with
/// a forward-mode tangent or a layout other than strided, and calls inside a
/// checkpointed segment that has a [`Policy`](crate::Policy) keeping dropout masks (the
/// segment keeps them itself, drawn the same way). A call under `no_grad`, or on an
/// input that needs no gradient, draws as above and holds nothing (there is no
/// backward). A checkpointed segment's recompute is compact when its backward is called
/// inside the scope on this thread (it runs on the calling thread on CPU), and its
/// policy keeps no masks.
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

/// Test hook: `true` makes the mask draw of compact dropout and of the policies use its
/// portable loop where the CPU would take the AVX2 one, process-wide (both draw the same
/// bits). Returns the previous setting. Not part of the API.
#[doc(hidden)]
pub fn force_portable_draw(on: bool) -> bool {
    crate::ffi::force_portable_draw(on)
}

/// Test hook: the kernel the mask draw of compact dropout and of the policies uses now:
/// `"avx2"`, `"portable"`, or `"bernoulli_"` where `csrc/bernoulli.cpp`'s kernels disagree
/// with this libtorch (libtorch's own draw then). Not part of the API.
#[doc(hidden)]
pub fn mask_draw_kernel() -> &'static str {
    match crate::ffi::mask_draw_kernel() {
        2 => "avx2",
        1 => "portable",
        _ => "bernoulli_",
    }
}
