// Declarations shared by csrc/ckpt.cpp and the files that keep its additions apart:
// csrc/buffers.cpp (running statistics of batch norm during recompute and profiling) and
// csrc/rng.cpp (generator snapshots taken only when a segment draws random numbers).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace ckpt {

// ---- buffers.cpp

// While the calling thread is inside at least one `FrozenRunningStats` scope, batch norm
// and instance norm in training mode normalise with the batch statistics as usual but do
// not update their running statistics (running_mean, running_var): the recompute of a
// segment and the planner's profiling runs repeat a forward that already updated them,
// or must not count as one.
void running_stats_freeze_enter();
void running_stats_freeze_exit();
bool running_stats_frozen();

struct FrozenRunningStats {
  FrozenRunningStats() { running_stats_freeze_enter(); }
  ~FrozenRunningStats() { running_stats_freeze_exit(); }
  FrozenRunningStats(const FrozenRunningStats&) = delete;
  FrozenRunningStats& operator=(const FrozenRunningStats&) = delete;
};

// ---- rng.cpp

using CudaStates = std::vector<std::pair<c10::DeviceIndex, at::Tensor>>;

// The generators as they were before a segment's forward: a copy of the CPU generator (its
// engine, about 2.5 KiB of host memory, released when the forward is over) and the
// states of the CUDA generators of `devices` (16 bytes each).
struct RngProbe {
  std::shared_ptr<at::CPUGeneratorImpl> cpu;
  CudaStates cuda;

  static RngProbe take(const std::set<c10::DeviceIndex>& devices);

  // The states (as `Generator::get_state` returns them) of the generators that moved since
  // `take`: `cpu` stays undefined when the CPU generator did not move, `cuda` lists the
  // CUDA devices whose generator did. A forward that drew no random numbers leaves both
  // empty: its recompute draws none either, so nothing needs to be restored for it.
  void moved(at::Tensor& cpu_state, CudaStates& cuda_states) const;
};

}  // namespace ckpt
