// What csrc/ckpt.cpp shares with csrc/memory.cpp and csrc/state.cpp: how their C++
// errors are raised (the C boundary itself is csrc/ffi.h), whether CUDA is present, and
// the generator and autocast state a segment records for its recompute.
#pragma once

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "ffi.h"

#include <cstddef>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {

// Errors of these files are std::runtime_error with a plain message: libtorch's engine
// carries them out of backward unchanged, and tch reports `what()`, so users see the
// message without a C++ backtrace.
template <typename... Args>
[[noreturn]] inline void fail(const Args&... args) {
  throw std::runtime_error(c10::str(args...));
}

template <typename... Args>
inline void check(bool ok, const Args&... args) {
  if (!ok) fail(args...);
}

// ---------------------------------------------------------------------------------
// RNG and autocast state (decision 4)

inline at::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_generator_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

inline bool cuda_present() {
  try {
    return at::globalContext().hasCUDA();
  } catch (...) {
    return false;
  }
}

struct RngState {
  at::Tensor cpu;  // undefined: the CPU generator is not saved
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda;

  // The CPU generator (when `with_cpu`), plus the CUDA generators of `devices`.
  static RngState capture(const std::set<c10::DeviceIndex>& devices, bool with_cpu = true) {
    RngState s;
    if (with_cpu) s.cpu = generator_state(at::detail::getDefaultCPUGenerator());
    for (auto idx : devices) {
      auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, idx));
      s.cuda.emplace_back(idx, generator_state(gen));
    }
    return s;
  }

  void restore() const {
    if (cpu.defined()) set_generator_state(at::detail::getDefaultCPUGenerator(), cpu);
    for (const auto& [idx, st] : cuda) {
      set_generator_state(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, idx)),
                          st);
    }
  }
};

struct AutocastState {
  bool cpu_enabled = false;
  bool cuda_enabled = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  at::ScalarType cuda_dtype = at::kHalf;
  bool cache_enabled = true;

  static AutocastState capture() {
    AutocastState s;
    s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
    s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    s.cuda_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
    s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    s.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return s;
  }

  void apply() const {
    at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
    at::autocast::set_autocast_cache_enabled(cache_enabled);
  }
};

// ---- memory.cpp

// Wraps libtorch's CPU allocator in the counting one, once (a no-op after the first call,
// or when the allocator cannot be wrapped).
void install_counting_allocator();

}  // namespace ckpt
