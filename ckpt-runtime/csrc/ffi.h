// The C boundary between the runtime's Rust (src/ffi.rs, src/dist/ffi.rs) and its C++:
// the types that cross it, the callback table, the C API that src/ffi.rs declares, and
// the one helper on the C++ side for each direction an error travels.
//
// Errors cross as raw messages through one shape of slot, `ckpt_error`, in both
// directions; neither side formats the other's message (the text users see is built in
// src/checkpoint.rs and src/error.rs, or is libtorch's own):
// - C++ to Rust: every `extern "C"` entry point that can fail runs its body in
//   `ckpt::guarded`, which catches every C++ exception, writes its message (without
//   libtorch's C++ backtrace) into the caller's slot and returns non-zero;
// - Rust to C++: every Rust callback runs its body in the Rust `guarded` (src/ffi.rs),
//   which catches panics and writes the message of a panic or of a `CkptError` into the
//   slot C++ passed; C++ calls the callbacks through `ckpt::call_rust`, which throws
//   std::runtime_error with that message.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

extern "C" {

// tch's `*mut C_tensor`: a heap-allocated `at::Tensor` (one handle, not the data).
typedef at::Tensor* ckpt_tensor;

// Writes `len` bytes of UTF-8 at `msg` (not NUL-terminated, alive for the call) into the
// string `slot`.
typedef void (*ckpt_msg_fn)(void* slot, const char* msg, size_t len);
// Hands the tensor `t` to the list `sink`; ownership of the heap handle passes with it.
typedef void (*ckpt_push_fn)(void* sink, ckpt_tensor t);

// The one error slot of a call: the callee that fails calls `set(slot, ..)` once with
// its raw message. Owned by the caller, alive for the call.
typedef struct {
  void* slot;
  ckpt_msg_fn set;
} ckpt_error;

// What a callee hands back besides its return code: tensors, each pushed with
// `push(tensors, ..)` (ownership passes to the caller), or an error in `error`. Owned by
// the caller, alive for the call.
typedef struct {
  void* tensors;
  ckpt_push_fn push;
  ckpt_error error;
} ckpt_ctx;

// The callback table: everything C++ calls in Rust, with its user data. Neither callback
// unwinds (src/ffi.rs runs both inside catch_unwind).
typedef struct {
  // The segment's closure (a Rust `Box<ErasedFn>`). From `ckpt_apply` on it is owned by
  // the node, which frees it with `drop` exactly once.
  void* user;
  // Runs the closure on `n` inputs, whose heap handles it takes over; `recompute` is 0 in
  // forward and 1 in backward. Hands back the outputs, or an error, through `ctx`.
  void (*run)(void* user, int32_t recompute, ckpt_tensor* inputs, size_t n,
              const ckpt_ctx* ctx);
  // Frees `user`.
  void (*drop)(void* user);
} ckpt_callbacks;

// One segment, as `ckpt_apply` takes it (src/ffi.rs `Segment`). The arrays and the name
// are borrowed for the call; C++ copies what it keeps.
typedef struct {
  ckpt_callbacks callbacks;
  const ckpt_tensor* inputs;  // the stash, in order; each defined
  size_t n_inputs;
  const ckpt_tensor* params;  // tensors the closure captured, for the node to take as inputs
  size_t n_params;
  const char* name;  // UTF-8, not NUL-terminated
  size_t name_len;
  int32_t preserve_rng_state;
  int32_t determinism_check;
} ckpt_segment;

// ---- ckpt.cpp

// Runs the segment's closure as a checkpointed segment. Always takes ownership of
// `seg->callbacks.user` (freed through `drop` when the graph frees the node, or at once
// on failure). Pushes the outputs into `ctx`; returns 0, or 1 with the error in `ctx`.
int32_t ckpt_apply(const ckpt_segment* seg, const ckpt_ctx* ctx);
int32_t ckpt_grad_enabled();
int64_t ckpt_live_segments();

// ---- memory.cpp

void ckpt_memory_enable();
int64_t ckpt_cpu_current_bytes();
int64_t ckpt_cpu_peak_bytes();
void ckpt_cpu_reset_peak();
void ckpt_cpu_raise_peak(int64_t bytes);
int32_t ckpt_cuda_memory(int32_t device, int64_t* current, int64_t* peak,
                         const ckpt_error* err);
int32_t ckpt_cuda_reset_peak(int32_t device, const ckpt_error* err);
int32_t ckpt_cuda_available();

// ---- state.cpp

void* ckpt_rng_save();
void ckpt_rng_restore(void* state);
int32_t ckpt_autocast_set(int32_t device_type, int32_t enabled, int32_t dtype,
                          int32_t* prev_enabled, int32_t* prev_dtype, const ckpt_error* err);
void ckpt_autocast_enter();
void ckpt_autocast_exit();

// ---- policy.cpp

uint32_t ckpt_policy_exchange(uint32_t flags);
void* ckpt_policy_probe_new(uint32_t flags);
void ckpt_policy_probe_free(void* cache);
void* ckpt_policy_probe_enter(void* cache, bool replay);
void ckpt_policy_probe_leave(void* scope);
int64_t ckpt_policy_probe_bytes(void* cache);

// ---- buffers.cpp

void ckpt_running_stats_freeze(int32_t on);

}  // extern "C"

namespace ckpt {

// The message of the exception being handled, without libtorch's C++ backtrace.
inline std::string current_exception_message() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown C++ exception";
  }
}

// C++ to Rust: runs `f`; on a C++ exception writes its message into `err` and returns 1,
// else returns 0. Every fallible `extern "C"` entry point's body runs in it.
template <typename F>
int32_t guarded(const ckpt_error& err, F&& f) noexcept {
  try {
    f();
    return 0;
  } catch (...) {
    try {
      const std::string msg = current_exception_message();
      err.set(err.slot, msg.data(), msg.size());
    } catch (...) {
      // Out of memory while copying the message: the return code still says it failed.
    }
    return 1;
  }
}

// The (slot, setter) pair of c10d's entry points (csrc/dist.cpp).
template <typename F>
int32_t guarded(void* slot, ckpt_msg_fn set, F&& f) noexcept {
  return guarded(ckpt_error{slot, set}, std::forward<F>(f));
}

// Rust to C++: calls a Rust callback, `call(ctx)`, with a context that collects its
// tensors and error; returns the tensors, or throws std::runtime_error with the
// callback's raw message when it reported one.
template <typename F>
std::vector<at::Tensor> call_rust(F&& call) {
  struct Received {
    std::vector<at::Tensor> tensors;
    bool failed = false;
    std::string error;
  } received;
  auto push = [](void* sink, ckpt_tensor t) {
    std::unique_ptr<at::Tensor> owned(t);
    auto* r = static_cast<Received*>(sink);
    try {
      r->tensors.push_back(std::move(*owned));
    } catch (...) {
      r->failed = true;
      r->error = "out of memory while collecting outputs";
    }
  };
  auto set = [](void* slot, const char* msg, size_t len) {
    auto* r = static_cast<Received*>(slot);
    r->failed = true;
    try {
      r->error.assign(msg, len);
    } catch (...) {
    }
  };
  const ckpt_ctx ctx{&received, push, ckpt_error{&received, set}};
  call(&ctx);
  if (received.failed) {
    throw std::runtime_error(received.error.empty() ? std::string("a Rust callback failed")
                                                    : received.error);
  }
  return std::move(received.tensors);
}

}  // namespace ckpt
