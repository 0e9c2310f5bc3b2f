// Generator snapshots that a segment keeps only when it drew random numbers.
//
// With preserve_rng_state a segment must replay its forward's random draws in the
// recompute, so it needs the generators' states from before its forward. The CPU
// generator's state is 5,056 bytes; kept by every segment, that is more than a small
// segment saves (16 steps of a small recurrent cell checkpointed one by one peaked above
// the plain model). A forward that drew no random number leaves the generator as it was,
// and the recompute, computing the same thing, draws none either: such a segment needs
// no snapshot. So the generators are copied before the forward (the CPU one as a generator
// object, whose engine is host memory that is released when the forward is over) and
// compared after it; only the states of the generators that moved are kept, as the
// tensors that `Generator::get_state` returns (what `set_state` restores).

#include "extra.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <cstring>
#include <mutex>

namespace ckpt {

namespace {

at::Tensor state_of(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         std::memcmp(a.const_data_ptr(), b.const_data_ptr(), a.nbytes()) == 0;
}

bool same_engine(at::CPUGeneratorImpl& a, at::CPUGeneratorImpl& b) {
  const at::mt19937_data_pod x = a.engine().data();
  const at::mt19937_data_pod y = b.engine().data();
  return x.seed_ == y.seed_ && x.left_ == y.left_ && x.seeded_ == y.seeded_ &&
         x.next_ == y.next_ && x.state_ == y.state_ &&
         a.next_float_normal_sample() == b.next_float_normal_sample() &&
         a.next_double_normal_sample() == b.next_double_normal_sample();
}

}  // namespace

RngProbe RngProbe::take(const std::set<c10::DeviceIndex>& devices) {
  RngProbe p;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    p.cpu = gen.get<at::CPUGeneratorImpl>()->clone();
  }
  for (auto idx : devices) {
    p.cuda.emplace_back(idx,
                        state_of(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, idx))));
  }
  return p;
}

void RngProbe::moved(at::Tensor& cpu_state, CudaStates& cuda_states) const {
  cpu_state = at::Tensor();
  cuda_states.clear();
  if (cpu) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    bool same;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      same = same_engine(*cpu, *gen.get<at::CPUGeneratorImpl>());
    }
    if (!same) cpu_state = at::Tensor(cpu->get_state());
  }
  for (const auto& [idx, before] : cuda) {
    at::Tensor now = state_of(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, idx)));
    if (!same_bytes(before, now)) cuda_states.emplace_back(idx, before);
  }
}

}  // namespace ckpt
