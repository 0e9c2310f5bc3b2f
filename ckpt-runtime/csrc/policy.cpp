// Selective checkpointing: a segment's forward run keeps the outputs of `aten::linear`
// (expensive to recompute, cheap to keep: Korthikanti et al., "Reducing Activation
// Recomputation in Large Transformer Models", 2022) and its dropout masks (one bit an
// element instead of a redraw), and the recompute in backward uses them instead of
// computing them again. PyTorch offers the same idea as selective activation
// checkpointing (`torch.utils.checkpoint.create_selective_checkpoint_contexts` with a
// policy returning `CheckpointPolicy.MUST_SAVE` for matmuls).
//
// How: `aten::linear` and `aten::dropout` are CompositeImplicitAutograd operators; this
// file registers kernels for them under the Autograd dispatch keys, which take
// precedence over the composite. Outside a policy scope the kernels call the composite
// (`at::native::linear` / `at::native::dropout`), so every other call is unchanged.
// Inside a scope:
// - record (the segment's forward, grad mode off): linear runs the composite's fused
//   path itself (`addmm(bias, input2d, weight.t())`, with the same flattening of a
//   contiguous N-d input) and keeps the 2-d result; dropout on CPU draws its noise as
//   the composite does (`empty_like`, `bernoulli_(1 - p)`), keeps it as a bit mask (8
//   elements a byte, in the input's logical element order) with the generator's state
//   after the draw, and returns `input * noise / (1 - p)`, formed from the bits;
// - replay (the recompute, grad mode on): linear builds the very graph the composite
//   would (view of the input, `t()` of the weight, PyTorch's own `AddmmBackward0` node
//   with the tensors it saves, view of the result) around the kept result; dropout
//   multiplies by the noise of the bits (0 or 1 / (1 - p), bit-equal to the drawn and
//   divided noise), puts the generator where the draw left it (with preserve_rng_state
//   only: `Cache::sets_generator`), and its node (`BitMaskDropoutBackward`) holds the
//   bits for backward instead of the noise `MulBackward0` would hold.
// Gradients are therefore bit-equal to the full recompute's, and to the plain model's.
//
// Compact dropout (`ckpt::compact_dropout`, `t_compact`): outside a policy that keeps
// masks, a dropout with grad draws as the composite does and holds its mask for backward
// as bits, in the same node: 1 bit an element instead of the noise (4 bytes for float32).
//
// The mask kernels run on libtorch's intra-op threads (`at::parallel_for`, which in an
// OpenMP build of libtorch needs this file compiled with -fopenmp: build.rs).
//
// A policy may keep only the outputs of narrowing linears (out_features < in_features,
// `keeps_linear`); the others are then recomputed as usual.
//
// Rules: the recompute must call linear and dropout in the order and with the shapes
// of the forward (it computes the same thing; a mismatch is an error that says so); a
// kept output that was changed in place after forward (its version moved) is
// recomputed instead. Linear without a bias, or on inputs the composite does not send
// down its fused path, is recomputed as usual.

#include "policy.h"
#include "bernoulli.h"
#include "ffi.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/dropout_native.h>
#include <ATen/ops/linear_native.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace ckpt_policy {

// Where a weight's values live, as the replay compares them: its first element, sizes
// and strides (a weight without strided storage, which is never on the fused path: null
// and nothing else).
struct WeightKey {
  const void* data = nullptr;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;

  explicit WeightKey(const at::Tensor& w) {
    if (w.layout() == c10::kStrided && w.has_storage()) {
      data = w.const_data_ptr();
      sizes = w.sizes().vec();
      strides = w.strides().vec();
    }
  }
  bool operator==(const WeightKey& o) const {
    return data == o.data && sizes == o.sizes && strides == o.strides;
  }
};

struct LinearEntry {
  at::Tensor out2d;                // addmm's result, [rows, out_features]; undefined
                                   // for a call off the fused path (nothing kept)
  std::vector<int64_t> in_sizes;   // the input's sizes, checked on replay
  WeightKey weight;                // the weight's values, checked on replay
  uint32_t version;                // out2d's version when recorded
};

struct DropoutEntry {
  at::Tensor bits;           // uint8 [ceil(numel / 8)]: bit i % 8 of byte i / 8 is
                             // element i (logical order) of the noise, 1 where kept
  at::Tensor state_after;    // CPU generator state after the draw
  std::vector<int64_t> sizes;
  double p;
};

struct Cache {
  uint32_t flags = 0;
  // Whether a replayed dropout puts the generator where forward's draw left it: with
  // preserve_rng_state, whose recompute starts from forward's state and hands the
  // generator back as it found it (csrc/ckpt.cpp). Without it the recompute runs on the
  // generator as it is, and a replay that moved it would rewind it to forward's draws.
  bool sets_generator = true;
  std::vector<LinearEntry> linears;
  std::vector<DropoutEntry> dropouts;
  size_t next_linear = 0;
  size_t next_dropout = 0;
};

namespace {

enum Mode : int { kOff = 0, kRecord = 1, kReplay = 2 };

thread_local int t_mode = kOff;
thread_local Cache* t_cache = nullptr;
// The policy of the next segment created on this thread (set by ckpt_policy_exchange).
thread_local uint32_t t_next_flags = 0;
// Whether a dropout run with grad outside any policy scope saves its mask as bits
// (`compact_dropout`; set by ckpt_compact_dropout_exchange).
thread_local bool t_compact = false;

std::string sizes_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

[[noreturn]] void diverged(const std::string& what) {
  throw std::runtime_error(
      "selective checkpointing: the recompute " + what +
      "; a segment must compute the same thing in forward and in recompute (side "
      "effects? data-dependent control flow?)");
}

at::Tensor cpu_generator_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_generator_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// ---------------------------------------------------------------------------------
// linear

// The composite's fused path (at::native::linear): a bias, and a 2-d input, or a
// contiguous strided input of 3 dimensions or with a 1-d bias, flattened to 2-d.
bool fused_path(const at::Tensor& input, const at::Tensor& weight,
                const c10::optional<at::Tensor>& bias) {
  if (!bias.has_value() || !bias->defined()) return false;
  if (input.is_mkldnn() || input.layout() != c10::kStrided || weight.layout() != c10::kStrided ||
      bias->layout() != c10::kStrided || weight.dim() != 2 || input.dim() < 2)
    return false;
  if (input.dim() == 2) return true;
  return input.is_contiguous() && (input.dim() == 3 || bias->dim() == 1);
}

// The 2-d view of a fused-path input, as the composite flattens it.
at::Tensor as_2d(const at::Tensor& input) {
  if (input.dim() == 2) return input;
  const auto sizes = input.sizes();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) rows *= sizes[i];
  return input.reshape({rows, sizes.back()});
}

at::Tensor from_2d(const at::Tensor& out2d, const at::Tensor& input) {
  if (input.dim() == 2) return out2d;
  std::vector<int64_t> sizes(input.sizes().begin(), input.sizes().end() - 1);
  sizes.push_back(out2d.size(1));
  return out2d.view(sizes);
}

// Every call the policy would keep takes an entry, in order, also one off the fused path
// (kept: nothing), so that a recompute whose call leaves or joins the fused path (another
// layout of the same values) does not shift the entries of the calls after it.
at::Tensor linear_record(Cache& c, const at::Tensor& input, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias) {
  const bool fused = fused_path(input, weight, bias);
  at::Tensor out2d = fused ? at::addmm(*bias, as_2d(input), weight.t()) : at::Tensor();
  c.linears.push_back({out2d, input.sizes().vec(), WeightKey(weight),
                       fused ? static_cast<uint32_t>(out2d._version()) : 0u});
  if (!fused) return at::native::linear(input, weight, bias);
  // A 2-d input's result is returned as a view of the kept tensor, as a 3-d one's is:
  // never the kept tensor itself, which the segment would then have to hand out as an
  // alias (a view the caller could not modify in place).
  return input.dim() == 2 ? out2d.view(out2d.sizes()) : from_2d(out2d, input);
}

at::Tensor linear_replay(Cache& c, const at::Tensor& input, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias_opt) {
  if (c.next_linear >= c.linears.size()) {
    diverged("called linear more often than forward did (" +
             std::to_string(c.linears.size()) + " times)");
  }
  const LinearEntry& e = c.linears[c.next_linear++];
  if (e.in_sizes != input.sizes().vec()) {
    diverged("called linear on an input of sizes " + sizes_str(input.sizes()) +
             " where forward's input had sizes " + sizes_str(e.in_sizes));
  }
  if (!e.out2d.defined() || !fused_path(input, weight, bias_opt) ||
      !(e.weight == WeightKey(weight)) ||
      static_cast<uint32_t>(e.out2d._version()) != e.version) {
    // Nothing kept (forward's call was off the fused path), this call is off it, another
    // weight, or the kept output was changed in place after forward: compute.
    return at::native::linear(input, weight, bias_opt);
  }
  const at::Tensor& bias = *bias_opt;
  at::Tensor in2d = as_2d(input);
  at::Tensor wt = weight.t();
  // A new tensor on the kept storage, which the node below becomes the grad_fn of.
  at::Tensor result = e.out2d.detach();
  if (c10::GradMode::is_enabled() &&
      (bias.requires_grad() || in2d.requires_grad() || wt.requires_grad())) {
    // What the generated autograd kernel of aten::addmm does for
    // addmm(bias, in2d, wt, beta = 1, alpha = 1).
    using torch::autograd::SavedVariable;
    auto node = c10::make_intrusive<torch::autograd::generated::AddmmBackward0>();
    node->set_next_edges(torch::autograd::collect_next_edges(bias, in2d, wt));
    node->alpha = 1;
    node->beta = 1;
    if (node->should_compute_output(2)) node->mat1_ = SavedVariable(in2d, false);
    node->mat1_layout = in2d.layout();
    node->mat1_sym_sizes = in2d.sym_sizes().vec();
    node->mat1_sym_strides = in2d.sym_strides().vec();
    if (node->should_compute_output(1)) node->mat2_ = SavedVariable(wt, false);
    node->mat2_layout = wt.layout();
    node->mat2_sym_sizes = wt.sym_sizes().vec();
    node->mat2_sym_strides = wt.sym_strides().vec();
    torch::autograd::set_history(result, node);
  }
  return from_2d(result, input);
}

// Whether a segment with these policy bits keeps this linear's output: every linear's
// with kSaveLinear; with kSaveNarrowingLinear only a narrowing one's (a 2-d weight
// [out_features, in_features] with out_features < in_features, such as a transformer's
// feed-forward down-projection), whose output costs 2 in_features flops an element to
// recompute, more than the layers on the narrower input, for the fewest bytes.
// Record and replay ask the same question of the same weight, so they agree on which
// calls take a cache entry.
bool keeps_linear(uint32_t flags, const at::Tensor& weight) {
  if ((flags & kSaveLinear) != 0) return true;
  return (flags & kSaveNarrowingLinear) != 0 && weight.dim() == 2 && weight.size(0) < weight.size(1);
}

at::Tensor linear_kernel(const at::Tensor& input, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias) {
  Cache* c = t_cache;
  // A nested input (whose sizes are not one list) takes no entry, in forward as in the
  // recompute, which computes the same thing.
  if (t_mode == kOff || c == nullptr || input.is_nested() || !keeps_linear(c->flags, weight)) {
    return at::native::linear(input, weight, bias);
  }
  if (t_mode == kRecord) return linear_record(*c, input, weight, bias);
  return linear_replay(*c, input, weight, bias);
}

// ---------------------------------------------------------------------------------
// dropout (CPU: the composite draws its noise with bernoulli_; on CUDA it calls the
// fused native_dropout, which this file leaves alone)

// The noise's 0/1 pattern as bits, 8 elements a byte, least significant bit first.
// A contiguous float32 noise (that of a contiguous float input, the common case) is read
// in place, 8 elements a step with SSE2 compares where the target has them; any other
// noise is first laid out in logical order as bools.
at::Tensor pack_bits(const at::Tensor& noise) {
  const int64_t n = noise.numel();
  at::Tensor bits = at::empty({(n + 7) / 8}, noise.options().dtype(at::kByte));
  uint8_t* out = bits.mutable_data_ptr<uint8_t>();
  // Byte i from the up-to-8 elements at in + 8 i, one scalar test each.
  auto scalar_byte = [n](const auto* in, int64_t i) {
    uint8_t byte = 0;
    const int64_t first = i * 8;
    const int64_t count = std::min<int64_t>(8, n - first);
    for (int64_t j = 0; j < count; ++j) byte |= static_cast<uint8_t>(in[first + j] != 0) << j;
    return byte;
  };
  if (noise.is_contiguous() && noise.scalar_type() == at::kFloat) {
    const float* in = noise.const_data_ptr<float>();
    const int64_t full = n / 8;
    at::parallel_for(0, bits.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
#if defined(__SSE2__)
        if (i < full) {
          const __m128 zero = _mm_setzero_ps();
          const int lo = _mm_movemask_ps(_mm_cmpneq_ps(_mm_loadu_ps(in + 8 * i), zero));
          const int hi = _mm_movemask_ps(_mm_cmpneq_ps(_mm_loadu_ps(in + 8 * i + 4), zero));
          out[i] = static_cast<uint8_t>(lo | (hi << 4));
          continue;
        }
#endif
        out[i] = scalar_byte(in, i);
      }
    });
    return bits;
  }
  const at::Tensor kept = noise.ne(0).contiguous();
  const bool* in = kept.const_data_ptr<bool>();
  at::parallel_for(0, bits.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = scalar_byte(in, i);
  });
  return bits;
}

// The 8 scaled-noise values of each of the 256 bit patterns of a byte: 0 or
// `1 / (1 - p)` computed by the very kernel forward's `div_` ran (`options`: the noise's
// type). One 16-byte aligned row a pattern.
template <typename T>
struct alignas(16) NoiseRow {
  T v[8];
};

template <typename T>
std::vector<NoiseRow<T>> noise_table(const at::TensorOptions& options, double p) {
  const T one = at::ones({1}, options).div_(1 - p).item<T>();
  std::vector<NoiseRow<T>> table(256);
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 8; ++j) table[b].v[j] = ((b >> j) & 1) ? one : T(0);
  }
  return table;
}

// The scaled noise `bernoulli_(1 - p)` then `div_(1 - p)` left in forward: 0 or
// `1 / (1 - p)` as `input`'s type computes it, with `input`'s sizes and strides, from
// `pack_bits`'s bits. A contiguous float32 or float64 input gets it in one pass, a
// table of the 256 patterns of 8 elements copied a byte at a time; any other through a
// bool tensor in logical order, copied into the input's layout and divided, as forward
// did. The values are those forward's noise held, so `input * noise` is bit-equal.
//
// `fill_scaled_noise` writes those values into `noise`, a tensor of the input's sizes in
// any layout, and returns it.
at::Tensor fill_scaled_noise(const at::Tensor& bits, at::Tensor noise, double p) {
  const int64_t n = noise.numel();
  const uint8_t* in = bits.const_data_ptr<uint8_t>();
  auto fill = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    const auto table = noise_table<T>(noise.options(), p);
    const int64_t full = n / 8;  // bytes of 8 elements; a last partial one follows
    at::parallel_for(0, bits.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
      const int64_t stop = std::min(end, full);
      // A fixed-size copy, which the compiler emits as vector moves.
      for (int64_t i = begin; i < stop; ++i) {
        std::memcpy(out + i * 8, table[in[i]].v, sizeof(T) * 8);
      }
      for (int64_t i = std::max(begin, full); i < end; ++i) {
        std::memcpy(out + i * 8, table[in[i]].v, sizeof(T) * (n - i * 8));
      }
    });
  };
  if (noise.is_contiguous() && noise.scalar_type() == at::kFloat) {
    fill(noise.mutable_data_ptr<float>());
    return noise;
  }
  if (noise.is_contiguous() && noise.scalar_type() == at::kDouble) {
    fill(noise.mutable_data_ptr<double>());
    return noise;
  }
  at::Tensor kept = at::empty(noise.sizes(), noise.options().dtype(at::kBool));
  bool* out = kept.mutable_data_ptr<bool>();
  at::parallel_for(0, n, 1 << 18, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = (in[i >> 3] >> (i & 7)) & 1;
  });
  noise.copy_(kept);
  noise.div_(1 - p);
  return noise;
}

at::Tensor unpack_scaled_noise(const at::Tensor& bits, const at::Tensor& input, double p) {
  return fill_scaled_noise(bits, at::empty_like(input), p);
}

// Whether `x * noise` can be formed in one pass over `x` and the bits (`masked_scale`):
// a contiguous strided float32 or float64 CPU tensor.
bool masked_scale_ok(const at::Tensor& x) {
  return x.layout() == c10::kStrided && !x.is_nested() && x.device().is_cpu() &&
         x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
}

// `x * unpack_scaled_noise(bits, x, p)` for a `masked_scale_ok` tensor, in one pass that
// never writes the noise: each element times 0 or `1 / (1 - p)` (as `div_` computes it),
// the very products `mul` forms, so the result is bit-equal. No autograd history.
at::Tensor masked_scale(const at::Tensor& bits, const at::Tensor& x, double p) {
  const int64_t n = x.numel();
  const uint8_t* in_bits = bits.const_data_ptr<uint8_t>();
  at::Tensor out = at::empty_like(x);
  auto run = [&](const auto* in, auto* o) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(in)>>;
    const auto table = noise_table<T>(x.options(), p);
    const int64_t full = n / 8;  // bytes of 8 elements; a last partial one follows
    at::parallel_for(0, bits.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
      const int64_t stop = std::min(end, full);
      int64_t i = begin;
#if defined(__SSE2__)
      if constexpr (std::is_same_v<T, float>) {
        for (; i < stop; ++i) {
          const float* s = table[in_bits[i]].v;
          _mm_storeu_ps(o + i * 8, _mm_mul_ps(_mm_loadu_ps(in + i * 8), _mm_load_ps(s)));
          _mm_storeu_ps(o + i * 8 + 4, _mm_mul_ps(_mm_loadu_ps(in + i * 8 + 4), _mm_load_ps(s + 4)));
        }
      }
#endif
      for (; i < stop; ++i) {
        const T* s = table[in_bits[i]].v;
        for (int j = 0; j < 8; ++j) o[i * 8 + j] = in[i * 8 + j] * s[j];
      }
      for (i = std::max(begin, full); i < end; ++i) {
        const T* s = table[in_bits[i]].v;
        for (int64_t j = 0; j < n - i * 8; ++j) o[i * 8 + j] = in[i * 8 + j] * s[j];
      }
    });
  };
  if (x.scalar_type() == at::kFloat) {
    run(x.const_data_ptr<float>(), out.mutable_data_ptr<float>());
  } else {
    run(x.const_data_ptr<double>(), out.mutable_data_ptr<double>());
  }
  return out;
}

// `x * noise` for the noise of `bits`, without history: `masked_scale` where it applies,
// else the noise rebuilt in `x`'s layout and the composite's product.
at::Tensor times_noise(const at::Tensor& bits, const at::Tensor& x, double p) {
  if (masked_scale_ok(x)) return masked_scale(bits, x, p);
  at::Tensor noise = unpack_scaled_noise(bits, x, p);
  c10::AutoGradMode no_grad(false);
  return x * noise;
}

// The backward of a dropout whose mask is held as bits (a compact dropout, and a replayed
// one under a policy): the incoming gradient times the scaled noise of the bits, which is
// `MulBackward0`'s `grad * noise` for the composite's `input * noise`, bit for bit. The
// node holds 1 bit an element where `MulBackward0` holds the noise itself (the input's
// element size). With grad mode on (a double backward) the product is differentiable, as
// the composite's.
//
// The gradient takes the layout `MulBackward0`'s product would: `layout` is a tensor
// without storage (meta) laid out as forward's noise (`empty_like(input)`), and the
// rebuilt noise is laid out as it, so that `mul` picks the same output strides for any
// incoming gradient (a broadcast one from `sum()` takes the noise's); the one-pass
// product only where both are contiguous, where the result is contiguous either way.
struct BitMaskDropoutBackward : public torch::autograd::Node {
  at::Tensor bits;
  at::Tensor layout;
  double p = 0;

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor& g = grads[0];
    if (!g.defined() || !should_compute_output(0)) return {at::Tensor()};
    if (!bits.defined()) {
      throw std::runtime_error(
          "Trying to backward through the graph a second time (or directly access saved "
          "tensors after they have already been freed): a dropout's mask was freed by the "
          "first backward; specify retain_graph=True (keep_graph) to backward twice");
    }
    if (!c10::GradMode::is_enabled() && layout.is_contiguous() && g.is_contiguous() &&
        masked_scale_ok(g)) {
      return {masked_scale(bits, g, p)};
    }
    // Differentiable in a double backward, as the composite's product.
    return {g * fill_scaled_noise(bits, at::empty_like(layout, g.options()), p)};
  }
  std::string name() const override { return "CkptBitMaskDropoutBackward"; }
  void release_variables() override {
    bits.reset();
    layout.reset();
  }
};

// Whether `input * noise` needs a graph: grad mode on and an input that requires grad.
// An input with a forward-mode tangent is left to the composite (only `mul` carries one),
// as `needs_composite` says.
bool needs_graph(const at::Tensor& input) {
  return c10::GradMode::is_enabled() && input.requires_grad();
}

bool needs_composite(const at::Tensor& input) {
  return input.layout() != c10::kStrided || input.is_nested() ||
         torch::autograd::isFwGradDefined(input);
}

// `input * noise` for the bits, with a `BitMaskDropoutBackward` node when it needs a
// gradient.
at::Tensor apply_mask(const at::Tensor& bits, const at::Tensor& input, double p) {
  at::Tensor out = times_noise(bits, input, p);
  if (needs_graph(input)) {
    auto node = c10::make_intrusive<BitMaskDropoutBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(input));
    node->bits = bits;
    node->layout = at::empty_like(input, input.options().device(c10::kMeta));
    node->p = p;
    torch::autograd::set_history(out, node);
  }
  return out;
}

// The composite's draw (`empty_like`, `bernoulli_(1 - p)`) as bits. For a contiguous
// input (whose noise `bernoulli_` fills in logical order) csrc/bernoulli.cpp draws the
// same values straight into bits, without the noise tensor; otherwise, or where that
// kernel does not match this libtorch, the composite's noise is drawn and packed, and
// freed before the product is formed.
at::Tensor draw_bits(const at::Tensor& input, double p) {
  if (input.is_contiguous()) {
    const int64_t n = input.numel();
    at::Tensor bits = at::empty({(n + 7) / 8}, input.options().dtype(at::kByte));
    if (ckpt_bernoulli::draw_bits(n, 1 - p, bits.mutable_data_ptr<uint8_t>())) return bits;
  }
  at::Tensor noise = at::empty_like(input);
  noise.bernoulli_(1 - p);
  return pack_bits(noise);
}

// Whether this dropout call is one the policy kernels handle (else: the composite): a CPU
// floating-point input in training mode with 0 < p < 1, strided, without a tangent.
bool handled(const at::Tensor& input, double p, bool train) {
  return train && p > 0 && p < 1 && input.numel() > 0 && input.device().is_cpu() &&
         at::isFloatingType(input.scalar_type()) && !needs_composite(input);
}

at::Tensor dropout_kernel(const at::Tensor& input, double p, bool train) {
  Cache* c = t_cache;
  const bool in_policy = t_mode != kOff && c != nullptr;
  if (!handled(input, p, train)) return at::native::dropout(input, p, train);
  if (!in_policy || (c->flags & kSaveDropoutMasks) == 0) {
    // Outside a policy that keeps masks: a compact dropout when one applies (it holds
    // the bits for backward only with a graph; without one it only draws faster), else
    // the composite.
    if (t_compact) return apply_mask(draw_bits(input, p), input, p);
    return at::native::dropout(input, p, train);
  }
  if (t_mode == kRecord) {
    at::Tensor bits = draw_bits(input, p);
    c->dropouts.push_back({bits, cpu_generator_state(), input.sizes().vec(), p});
    return apply_mask(bits, input, p);
  }
  if (c->next_dropout >= c->dropouts.size()) {
    diverged("called dropout more often than forward did (" +
             std::to_string(c->dropouts.size()) + " times)");
  }
  const DropoutEntry& e = c->dropouts[c->next_dropout++];
  if (e.sizes != input.sizes().vec() || e.p != p) {
    diverged("called dropout(p = " + std::to_string(p) + ") on sizes " +
             sizes_str(input.sizes()) + " where forward called dropout(p = " +
             std::to_string(e.p) + ") on sizes " + sizes_str(e.sizes));
  }
  if (c->sets_generator) set_cpu_generator_state(e.state_after);
  return apply_mask(e.bits, input, p);
}

}  // namespace

std::shared_ptr<Cache> cache_for_new_segment(bool preserve_rng_state) {
  if (t_next_flags == 0) return nullptr;
  auto c = std::make_shared<Cache>();
  c->flags = t_next_flags;
  c->sets_generator = preserve_rng_state;
  return c;
}

void release(Cache* cache) {
  if (cache == nullptr) return;
  cache->linears.clear();
  cache->dropouts.clear();
}

int64_t bytes(const Cache* cache) {
  if (cache == nullptr) return 0;
  int64_t n = 0;
  for (const auto& e : cache->linears) {
    if (e.out2d.defined()) n += static_cast<int64_t>(e.out2d.nbytes());
  }
  for (const auto& e : cache->dropouts) {
    n += static_cast<int64_t>(e.bits.nbytes() + e.state_after.nbytes());
  }
  return n;
}

Scope::Scope(Cache* cache, bool replay) : prev_mode_(t_mode), prev_cache_(t_cache) {
  t_cache = cache;
  t_mode = cache == nullptr ? kOff : (replay ? kReplay : kRecord);
  if (cache != nullptr && replay) {
    cache->next_linear = 0;
    cache->next_dropout = 0;
  }
}

Scope::~Scope() {
  t_mode = prev_mode_;
  t_cache = prev_cache_;
}

}  // namespace ckpt_policy

TORCH_LIBRARY_IMPL(aten, AutogradCPU, m) {
  m.impl("linear", TORCH_FN(ckpt_policy::linear_kernel));
  m.impl("dropout", TORCH_FN(ckpt_policy::dropout_kernel));
}

TORCH_LIBRARY_IMPL(aten, AutogradCUDA, m) {
  m.impl("linear", TORCH_FN(ckpt_policy::linear_kernel));
}

extern "C" {

// Turns compact dropout on or off on this thread; returns the previous setting (the Rust
// guard, `ffi::CompactDropout`, restores it).
bool ckpt_compact_dropout_exchange(bool on) {
  bool prev = ckpt_policy::t_compact;
  ckpt_policy::t_compact = on;
  return prev;
}

// Sets the policy bits of the segments this thread creates next; returns the previous
// bits (src/ffi.rs restores them when the segment is made).
uint32_t ckpt_policy_exchange(uint32_t flags) {
  uint32_t prev = ckpt_policy::t_next_flags;
  ckpt_policy::t_next_flags = flags;
  return prev;
}

// Profiling (src/plan/profile.rs, `ffi::PolicyProbe`): a cache outside any segment, to
// measure what a policy would keep from a stage and how long the stage's recompute takes
// when it replays them. Null on allocation failure (nothing here throws otherwise).
void* ckpt_policy_probe_new(uint32_t flags) {
  try {
    auto* c = new ckpt_policy::Cache();
    c->flags = flags;
    return c;
  } catch (...) {
    return nullptr;
  }
}

void ckpt_policy_probe_free(void* cache) { delete static_cast<ckpt_policy::Cache*>(cache); }

// Enters a record (replay = false) or replay scope over the cache on this thread; scopes
// must be left in the reverse order of entering (the Rust guard does).
void* ckpt_policy_probe_enter(void* cache, bool replay) {
  try {
    return new ckpt_policy::Scope(static_cast<ckpt_policy::Cache*>(cache), replay);
  } catch (...) {
    return nullptr;
  }
}

void ckpt_policy_probe_leave(void* scope) { delete static_cast<ckpt_policy::Scope*>(scope); }

int64_t ckpt_policy_probe_bytes(void* cache) {
  return ckpt_policy::bytes(static_cast<const ckpt_policy::Cache*>(cache));
}

}  // extern "C"
