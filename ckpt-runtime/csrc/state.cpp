// The C API of the generator and autocast state: `RngFork` (torch.random.fork_rng
// around profiling) and `ckpt::amp` (src/ffi.rs); the recompute's own save and restore is
// in csrc/ckpt.cpp.

#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstdint>
#include <set>

#include "common.h"

using ckpt::RngState;

extern "C" {

// Saves the CPU generator's state and, where CUDA is present, every CUDA generator's
// (torch.random.fork_rng); `ckpt_rng_restore` puts them back and frees the copy.
// Returns null on failure (nothing to restore then).
void* ckpt_rng_save() {
  try {
    std::set<c10::DeviceIndex> devices;
    if (ckpt::cuda_present()) {
      const auto n = at::detail::getCUDAHooks().deviceCount();
      for (c10::DeviceIndex i = 0; i < n; ++i) devices.insert(i);
    }
    return new RngState(RngState::capture(devices));
  } catch (...) {
    return nullptr;
  }
}

void ckpt_rng_restore(void* state) {
  if (state == nullptr) return;
  auto* s = static_cast<RngState*>(state);
  try {
    s->restore();
  } catch (...) {
  }
  delete s;
}

// Sets the autocast state of a device type (0 = CPU, 1 = CUDA); the previous state is
// written to `prev_enabled` / `prev_dtype` (ScalarType codes).
int32_t ckpt_autocast_set(int32_t device_type, int32_t enabled, int32_t dtype,
                          int32_t* prev_enabled, int32_t* prev_dtype, const ckpt_error* err) {
  return ckpt::guarded(*err, [&] {
    const at::DeviceType dt = device_type == 1 ? at::kCUDA : at::kCPU;
    *prev_enabled = at::autocast::is_autocast_enabled(dt) ? 1 : 0;
    *prev_dtype = static_cast<int32_t>(at::autocast::get_autocast_dtype(dt));
    at::autocast::set_autocast_dtype(dt, static_cast<at::ScalarType>(dtype));
    at::autocast::set_autocast_enabled(dt, enabled != 0);
  });
}

// torch.autocast's nesting count: the cast cache is cleared when the outermost region
// ends.
void ckpt_autocast_enter() { at::autocast::increment_nesting(); }

void ckpt_autocast_exit() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

}  // extern "C"
