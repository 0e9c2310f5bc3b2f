// The counting CPU allocator (exact current and peak tensor bytes on CPU) and the CUDA
// caching allocator's statistics: the C++ half of `ckpt::memory` (src/memory.rs).

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/alignment.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "common.h"

using ckpt::check;
using ckpt::cuda_present;

namespace {

// ---------------------------------------------------------------------------------
// Counting CPU allocator (decision 7)

std::atomic<int64_t> g_cpu_current{0};
std::atomic<int64_t> g_cpu_peak{0};

void bump_peak(int64_t now) {
  int64_t peak = g_cpu_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// Each allocation carries a header in front of the data with its requested size, so the
// data pointer doubles as the context (libtorch's `raw_allocate` requires such "simple"
// pointers) and freeing needs no lookup. The header is one alignment unit long, so the
// data keeps the wrapped allocator's alignment.
constexpr size_t kHeader = c10::gAlignment > sizeof(int64_t) ? c10::gAlignment : sizeof(int64_t);

c10::DeleterFnPtr g_inner_raw_delete = nullptr;

void counted_delete(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  int64_t bytes;
  std::memcpy(&bytes, block, sizeof(bytes));
  g_cpu_current.fetch_sub(bytes, std::memory_order_relaxed);
  g_inner_raw_delete(block);
}

struct CountingAllocator final : public c10::Allocator {
  c10::Allocator* inner;
  explicit CountingAllocator(c10::Allocator* a) : inner(a) {}

  c10::DataPtr allocate(size_t n) override {
    void* block = inner->raw_allocate(n + kHeader);
    const int64_t bytes = static_cast<int64_t>(n);
    std::memcpy(block, &bytes, sizeof(bytes));
    void* data = static_cast<char*>(block) + kHeader;
    const int64_t now = g_cpu_current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    bump_peak(now);
    return {data, data, &counted_delete, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &counted_delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

std::once_flag g_alloc_once;

}  // namespace

void ckpt::install_counting_allocator() {
  std::call_once(g_alloc_once, [] {
    c10::Allocator* inner = c10::GetCPUAllocator();
    // Only an allocator with plain (pointer == context) allocations can be wrapped this
    // way; libtorch's default CPU allocator is one. Otherwise counting stays off.
    if (inner->raw_deleter() == nullptr) return;
    g_inner_raw_delete = inner->raw_deleter();
    static CountingAllocator counting(inner);
    // Priority above the default registration (0), so libtorch uses it from now on.
    c10::SetCPUAllocator(&counting, /*priority=*/100);
  });
}

namespace {

// The allocator is swapped when the program loads, before any tensor op can run. A swap
// later, while another thread is between a `raw_allocate` of the old allocator and the
// matching `raw_deallocate` (some kernels pair them for scratch memory), would hand our
// deleter a block it did not allocate. libc10's own static initialisers (which register
// the default CPU allocator) run before this one, as it is a dependency of the binary.
struct InstallAtLoad {
  InstallAtLoad() {
    try {
      ckpt::install_counting_allocator();
    } catch (...) {
      // Counting stays off; nothing else depends on it.
    }
  }
};
InstallAtLoad g_install_at_load;

c10::DeviceAllocator* cuda_allocator() {
  check(cuda_present(), "CUDA is not available (no CUDA device, or libtorch_cuda is not loaded)");
  return c10::getDeviceAllocator(c10::DeviceType::CUDA);
}

}  // namespace

// ---------------------------------------------------------------------------------
// C API used by src/ffi.rs

extern "C" {

void ckpt_memory_enable() {
  try {
    ckpt::install_counting_allocator();
  } catch (...) {
  }
}

int64_t ckpt_cpu_current_bytes() { return g_cpu_current.load(); }

int64_t ckpt_cpu_peak_bytes() { return g_cpu_peak.load(); }

void ckpt_cpu_reset_peak() { g_cpu_peak.store(g_cpu_current.load()); }

void ckpt_cpu_raise_peak(int64_t bytes) { bump_peak(bytes); }

int32_t ckpt_cuda_memory(int32_t device, int64_t* current, int64_t* peak,
                         const ckpt_error* err) {
  return ckpt::guarded(*err, [&] {
    auto stats = cuda_allocator()->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto& s =
        stats.allocated_bytes[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
    *current = s.current;
    *peak = s.peak;
  });
}

int32_t ckpt_cuda_reset_peak(int32_t device, const ckpt_error* err) {
  return ckpt::guarded(*err, [&] {
    cuda_allocator()->resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
}

int32_t ckpt_cuda_available() { return cuda_present() ? 1 : 0; }

}  // extern "C"
