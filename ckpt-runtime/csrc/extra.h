// Declarations shared by csrc/ckpt.cpp and the files that keep its additions apart:
// csrc/buffers.cpp (running statistics of batch norm during recompute and profiling),
// csrc/rng.cpp (generator snapshots taken only when a segment draws random numbers) and
// csrc/params.cpp (captured parameters as inputs of the node, and the ops a recompute runs
// with grad off).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <set>
#include <unordered_map>
#include <string>
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

// ---- params.cpp

// The parameters among `listed` that the node takes as inputs: defined leaves that require
// grad, each once. One that is also an input of the segment stays listed: the recompute
// reads the input through its detached copy and the parameter through the captured module.
std::vector<at::Tensor> node_params(const std::vector<at::Tensor>& listed);

// While alive, records which of `params` the ops run on this thread take as inputs (a
// segment's forward run: see params.cpp). Nothing is recorded, and ops pay nothing, when
// `params` is empty.
class ParamUsage {
 public:
  explicit ParamUsage(const std::vector<at::Tensor>& params);
  ~ParamUsage();
  ParamUsage(const ParamUsage&) = delete;
  ParamUsage& operator=(const ParamUsage&) = delete;

  // `params` that an op read so far, in their order.
  std::vector<at::Tensor> used() const;
  void mark(const c10::TensorImpl* impl);

 private:
  std::vector<at::Tensor> params_;
  std::vector<bool> used_;
  std::unordered_map<const c10::TensorImpl*, size_t> index_;
  bool active_ = false;
};

// The gradients of a segment's parameters in one recompute, caught on their way to the
// parameters' accumulators (see params.cpp).
class ParamGrads {
 public:
  // `pass_on` (double backward): the capture nodes lead on to the real accumulators, for
  // a later backward through the recomputed graph; the recompute's backward must then
  // capture their inputs as wanted outputs (it cannot accumulate).
  ParamGrads(const std::vector<at::Tensor>& params, bool pass_on);

  // While alive, graph recorded for a parameter leads to its capture node (the recompute's
  // forward runs inside one); the destructor puts the real accumulators back.
  class Redirect {
   public:
    explicit Redirect(const ParamGrads& g);
    ~Redirect();
    Redirect(const Redirect&) = delete;
    Redirect& operator=(const Redirect&) = delete;

   private:
    void restore() noexcept;
    std::vector<std::pair<at::Tensor, c10::weak_intrusive_ptr<torch::autograd::Node>>> saved_;
  };

  // Edges to the capture nodes, in parameter order (the outputs wanted from the engine when
  // nothing may accumulate).
  torch::autograd::edge_list edges() const;

 private:
  std::vector<at::Tensor> params_;
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> capture_;
};

// In a backward with explicit inputs (`run_backward`): the description ("[3, 4] Float") of a
// leaf that the recomputed graph from `roots` reaches (not through the recompute's inputs,
// `stash`) and whose gradient the caller asked for, though the node does not list it (a
// tensor the closure captured without `ckpt` seeing it); empty if there is none.
std::string requested_but_unseen(const torch::autograd::edge_list& roots,
                                 const std::vector<at::Tensor>& stash);

// While alive, notes the first op run on this thread with grad mode off and an input that
// requires grad (a segment's recompute: see params.cpp), seen through the same kind of
// RecordFunction callback as `ParamUsage`. That is the closure turning grad off in its
// recompute (`tch::no_grad`): what the op computes gets no graph, so no gradient reaches
// the inputs and parameters behind it. The forward runs of nested segments, under no_grad
// by design, are not watched: they run inside a `GradOffWatch::Pause`.
class GradOffWatch {
 public:
  GradOffWatch();
  ~GradOffWatch();
  GradOffWatch(const GradOffWatch&) = delete;
  GradOffWatch& operator=(const GradOffWatch&) = delete;

  // The name of the first such op (`aten::sin`), empty if none ran.
  const std::string& op() const { return op_; }
  void note(const char* op);

  // While alive, ops run on this thread are not seen by the watches around it.
  class Pause {
   public:
    Pause();
    ~Pause();
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    bool active_ = false;
  };

 private:
  std::string op_;
};

}  // namespace ckpt
