// Batch norm's running statistics are updated once per training step, as without
// checkpointing.
//
// A batch norm in training mode updates running_mean and running_var in place every time
// it runs. A checkpointed segment runs twice (forward, then the recompute in backward), and
// the planner's profiling runs the stages again: each of those runs would move the
// statistics once more (pytorch#96136, open in PyTorch). The statistics are reachable from
// no handle that ckpt sees (a closure-built `nn::func_t` captures its `BatchNorm`), so the
// update is suppressed where every route passes: the dispatcher. `aten::batch_norm` and
// `aten::instance_norm` (what tch's `nn::BatchNorm` and `Tensor::instance_norm` call) get a
// kernel at the AutogradCPU / AutogradCUDA keys, which run before the composite kernel;
// it calls that composite kernel (`at::native::batch_norm`) unchanged, except while the
// thread is in a frozen scope (the recompute, the profiling): then training-mode calls get
// no running statistics. Training mode normalises with the batch's statistics whether or
// not running ones are passed, and the backward formula uses the saved batch statistics,
// so outputs and gradients are the same bits; only the in-place update is skipped.
// Evaluation mode (training = false) reads the running statistics and is passed through.
//
// Cost: one thread-local read per batch norm call, no memory.

#include "extra.h"
#include "ffi.h"

#include <ATen/ops/batch_norm_native.h>
#include <ATen/ops/instance_norm_native.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

namespace {

thread_local int32_t g_frozen = 0;

at::Tensor batch_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias,
                      const std::optional<at::Tensor>& running_mean,
                      const std::optional<at::Tensor>& running_var, bool training,
                      double momentum, double eps, bool cudnn_enabled) {
  if (training && g_frozen > 0) {
    return at::native::batch_norm(input, weight, bias, std::nullopt, std::nullopt, training,
                                  momentum, eps, cudnn_enabled);
  }
  return at::native::batch_norm(input, weight, bias, running_mean, running_var, training,
                                momentum, eps, cudnn_enabled);
}

// instance_norm with use_input_stats updates its running statistics from the per-instance
// ones (through a batch_norm on repeated statistics and a copy back); frozen, it gets none.
at::Tensor instance_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& running_mean,
                         const std::optional<at::Tensor>& running_var, bool use_input_stats,
                         double momentum, double eps, bool cudnn_enabled) {
  if (use_input_stats && g_frozen > 0) {
    return at::native::instance_norm(input, weight, bias, std::nullopt, std::nullopt,
                                     use_input_stats, momentum, eps, cudnn_enabled);
  }
  return at::native::instance_norm(input, weight, bias, running_mean, running_var,
                                   use_input_stats, momentum, eps, cudnn_enabled);
}

}  // namespace

// A kernel registered at a runtime autograd key takes precedence over the op's
// CompositeImplicitAutograd kernel for that key (the dispatcher's rule 1), so tensors that
// carry autograd keys (all but inference tensors) come here; the composite kernel it
// calls decomposes into ops that are dispatched (and differentiated) as before.
TORCH_LIBRARY_IMPL(aten, AutogradCPU, m) {
  m.impl("batch_norm", TORCH_FN(batch_norm));
  m.impl("instance_norm", TORCH_FN(instance_norm));
}

TORCH_LIBRARY_IMPL(aten, AutogradCUDA, m) {
  m.impl("batch_norm", TORCH_FN(batch_norm));
  m.impl("instance_norm", TORCH_FN(instance_norm));
}

namespace ckpt {

void running_stats_freeze_enter() { ++g_frozen; }

void running_stats_freeze_exit() {
  if (g_frozen > 0) --g_frozen;
}

bool running_stats_frozen() { return g_frozen > 0; }

}  // namespace ckpt

extern "C" {

// `on` != 0 enters a frozen scope on the calling thread, 0 leaves one (src/ffi.rs pairs
// them in an RAII guard).
void ckpt_running_stats_freeze(int32_t on) {
  if (on != 0) {
    ckpt::running_stats_freeze_enter();
  } else {
    ckpt::running_stats_freeze_exit();
  }
}

}  // extern "C"
