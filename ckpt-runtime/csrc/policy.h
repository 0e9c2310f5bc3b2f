// Selective checkpointing (csrc/policy.cpp): what a checkpointed segment keeps from its
// forward run so that its recompute does not redo it. Used by csrc/ckpt.cpp.
#pragma once

#include <cstdint>
#include <memory>

namespace ckpt_policy {

// Bits of a policy (src/checkpoint.rs `Policy` sends the same bits).
constexpr uint32_t kSaveLinear = 1;        // keep the outputs of aten::linear
constexpr uint32_t kSaveDropoutMasks = 2;  // keep dropout masks (1 bit an element)
// keep the outputs of narrowing aten::linear calls (fewer output than input features)
constexpr uint32_t kSaveNarrowingLinear = 4;

// What one segment recorded in forward, replayed in order by its recompute.
struct Cache;

// A cache for the segment being created on this thread, or null when the policy that
// `ckpt_policy_exchange` set for it is "recompute everything". With `preserve_rng_state`
// a replayed dropout puts the CPU generator where forward's draw left it; without it the
// replay leaves the generator alone (the recompute draws from it as it is).
std::shared_ptr<Cache> cache_for_new_segment(bool preserve_rng_state);

// Frees what a cache holds (after the last recompute that needs it).
void release(Cache* cache);

// Bytes of tensor data a cache holds.
int64_t bytes(const Cache* cache);

// While alive, aten::linear and aten::dropout on this thread record into `cache` (the
// segment's forward run) or replay from it (the recompute); `cache == nullptr` turns the
// policy off (a segment without one, nested in a segment with one).
class Scope {
 public:
  Scope(Cache* cache, bool replay);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int prev_mode_;
  Cache* prev_cache_;
};

}  // namespace ckpt_policy
