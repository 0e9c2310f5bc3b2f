// libtorch's CPU Bernoulli draw, reproduced exactly and drawn as bits.
//
// A training-mode dropout on CPU draws its noise with `bernoulli_(1 - p)` (the composite
// `at::native::dropout`). libtorch's CPU kernel for a scalar probability
// (`templates::cpu::bernoulli_kernel` in ATen/native/cpu/DistributionTemplates.h; the
// MKL one is compiled out, pytorch#132395) runs serially, element by element in memory
// order: `random64()` of the CPU generator, whose engine is MT19937 (Matsumoto and
// Nishimura, "Mersenne Twister", ACM TOMACS 8(1), 1998; at::mt19937 in
// ATen/core/MT19937RNGEngine.h) called twice, the first output the high word; its low 53
// bits times 2^-53 (`uniform_real_distribution<double>`), compared `< q`. About 8 ns an
// element on the 2-core Xeon this was written on: 130 ms for the 16.8 million elements of
// a [4, 4, 1024, 1024] attention dropout, on one thread.
//
// The same stream here: the engine's state is copied out of the generator, advanced
// block by block (the twist of all 624 words, then the tempering of the words a chunk
// needs, 8 lanes at a time with AVX2 where the CPU has it), and each element's two
// outputs compared as one integer: `m * 2^-53 < q` (m < 2^53, exact in a double) holds
// exactly when `m < ceil(q * 2^53)`, an exact scaling by a power of two. The state goes
// back into the generator, so the draws after it are those after `bernoulli_`. The
// result is the bits themselves (1 bit an element, what csrc/policy.cpp keeps), never a
// float noise tensor: with AVX2 about 10x faster than `bernoulli_`, the portable loop
// about 1.6x.
//
// Whether this libtorch draws that way is checked once a process: both kernels against
// `bernoulli_` on a generator of this file's own, at several probabilities, lengths and
// engine positions; a mismatch turns the kernel off and `draw_bits` returns false.

#include "bernoulli.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CKPT_BERNOULLI_AVX2 1
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

namespace ckpt_bernoulli {

namespace {

constexpr int kN = 624;  // MT19937's state words (at::MERSENNE_STATE_N)
constexpr int kM = 397;  // at::MERSENNE_STATE_M
constexpr uint32_t kMatrixA = 0x9908b0df;
constexpr uint32_t kUpper = 0x80000000;
constexpr uint32_t kLower = 0x7fffffff;
constexpr uint64_t kLow53 = (uint64_t{1} << 53) - 1;

// The integer a draw's 53 bits must stay under to be a one: `m * 2^-53 < q` exactly when
// `m < ceil(q * 2^53)` (0 <= q <= 1, so at most 2^53).
uint64_t threshold(double q) { return static_cast<uint64_t>(std::ceil(std::ldexp(q, 53))); }

// ---------------------------------------------------------------------------------
// The portable kernels

inline uint32_t twist_word(uint32_t u, uint32_t v, uint32_t far) {
  const uint32_t y = (u & kUpper) | (v & kLower);
  return far ^ (y >> 1) ^ ((0u - (v & 1u)) & kMatrixA);
}

// All 624 words at once, as at::mt19937's next_state.
void twist_portable(uint32_t* s) {
  int i = 0;
  for (; i < kN - kM; ++i) s[i] = twist_word(s[i], s[i + 1], s[i + kM]);
  for (; i < kN - 1; ++i) s[i] = twist_word(s[i], s[i + 1], s[i + kM - kN]);
  s[kN - 1] = twist_word(s[kN - 1], s[0], s[kM - 1]);
}

inline uint32_t temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

void temper_portable(const uint32_t* in, uint32_t* out, int k) {
  for (int j = 0; j < k; ++j) out[j] = temper(in[j]);
}

// Draw j is a one when the 53 low bits of (out[2j] << 32 | out[2j + 1]) are under t.
inline bool is_one(const uint32_t* out, int64_t j, uint64_t t) {
  const uint64_t m = ((static_cast<uint64_t>(out[2 * j]) << 32) | out[2 * j + 1]) & kLow53;
  return m < t;
}

// `count` draws from 2 `count` outputs into ceil(count / 8) bytes.
void compare_portable(const uint32_t* out, int64_t count, uint64_t t, uint8_t* bits) {
  for (int64_t b = 0; b * 8 < count; ++b) {
    uint8_t byte = 0;
    const int64_t last = std::min<int64_t>(8, count - b * 8);
    for (int64_t j = 0; j < last; ++j) byte |= static_cast<uint8_t>(is_one(out, b * 8 + j, t)) << j;
    bits[b] = byte;
  }
}

// ---------------------------------------------------------------------------------
// The AVX2 kernels (x86 only; chosen at run time)

#ifdef CKPT_BERNOULLI_AVX2
__attribute__((target("avx2"))) inline void twist8(uint32_t* s, int i, const uint32_t* far) {
  const __m256i upper = _mm256_set1_epi32(static_cast<int>(kUpper));
  const __m256i lower = _mm256_set1_epi32(static_cast<int>(kLower));
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i a = _mm256_set1_epi32(static_cast<int>(kMatrixA));
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 1));
  const __m256i f = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(far));
  const __m256i y = _mm256_or_si256(_mm256_and_si256(u, upper), _mm256_and_si256(v, lower));
  const __m256i odd = _mm256_and_si256(_mm256_cmpeq_epi32(_mm256_and_si256(v, one), one), a);
  const __m256i w = _mm256_xor_si256(_mm256_xor_si256(f, _mm256_srli_epi32(y, 1)), odd);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s + i), w);
}

// Lanes i..i+7 read words i+1..i+8 before any lane is written, and words i+397.. (first
// loop, not yet twisted) or i-227.. (second loop, twisted in earlier steps): the scalar
// order's values.
__attribute__((target("avx2"))) void twist_avx2(uint32_t* s) {
  int i = 0;
  for (; i + 8 <= kN - kM; i += 8) twist8(s, i, s + i + kM);
  for (; i < kN - kM; ++i) s[i] = twist_word(s[i], s[i + 1], s[i + kM]);
  for (; i + 8 <= kN - 1; i += 8) twist8(s, i, s + i + kM - kN);
  for (; i < kN - 1; ++i) s[i] = twist_word(s[i], s[i + 1], s[i + kM - kN]);
  s[kN - 1] = twist_word(s[kN - 1], s[0], s[kM - 1]);
}

__attribute__((target("avx2"))) void temper_avx2(const uint32_t* in, uint32_t* out, int k) {
  const __m256i b = _mm256_set1_epi32(static_cast<int>(0x9d2c5680u));
  const __m256i c = _mm256_set1_epi32(static_cast<int>(0xefc60000u));
  int j = 0;
  for (; j + 8 <= k; j += 8) {
    __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + j));
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 11));
    y = _mm256_xor_si256(y, _mm256_and_si256(_mm256_slli_epi32(y, 7), b));
    y = _mm256_xor_si256(y, _mm256_and_si256(_mm256_slli_epi32(y, 15), c));
    y = _mm256_xor_si256(y, _mm256_srli_epi32(y, 18));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), y);
  }
  for (; j < k; ++j) out[j] = temper(in[j]);
}

// Read as 64-bit lanes, a draw's two outputs are (low: out[2j], high: out[2j + 1]);
// swapping the halves gives out[2j] << 32 | out[2j + 1]. Values under 2^53 compare
// the same signed and unsigned.
__attribute__((target("avx2"))) void compare_avx2(const uint32_t* out, int64_t count, uint64_t t,
                                                  uint8_t* bits) {
  const __m256i limit = _mm256_set1_epi64x(static_cast<int64_t>(t));
  const __m256i low53 = _mm256_set1_epi64x(static_cast<int64_t>(kLow53));
  const int64_t full = count / 8;
  for (int64_t b = 0; b < full; ++b) {
    const uint32_t* o = out + 16 * b;
    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o));
    __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o + 8));
    x = _mm256_and_si256(_mm256_shuffle_epi32(x, 0xB1), low53);
    y = _mm256_and_si256(_mm256_shuffle_epi32(y, 0xB1), low53);
    const int lo = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(limit, x)));
    const int hi = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(limit, y)));
    bits[b] = static_cast<uint8_t>(lo | (hi << 4));
  }
  if (full * 8 < count) compare_portable(out + 16 * full, count - full * 8, t, bits + full);
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#endif

struct Kernels {
  void (*twist)(uint32_t*);
  void (*temper)(const uint32_t*, uint32_t*, int);
  void (*compare)(const uint32_t*, int64_t, uint64_t, uint8_t*);
};

constexpr Kernels kPortable{twist_portable, temper_portable, compare_portable};
#ifdef CKPT_BERNOULLI_AVX2
constexpr Kernels kAvx2{twist_avx2, temper_avx2, compare_avx2};
#endif

// ---------------------------------------------------------------------------------
// The draw

// Draws per chunk: 2 outputs each, 16 KiB of tempered outputs on the stack. A multiple
// of 8, so that every chunk but the last fills whole bytes.
constexpr int64_t kChunk = 2048;

// Advances the engine `d` by `n` draws as `bernoulli_` would, writing their bits.
//
// at::mt19937's call: `if (--left == 0) { twist; left = 624; next = 0; } return
// temper(state[next++]);` so `left - 1` outputs are ready at state[next..], and after a
// twist all 624 are (as if left were 625).
void draw_engine(at::mt19937_data_pod& d, int64_t n, double q, uint8_t* bits, const Kernels& k) {
  const uint64_t t = threshold(q);
  alignas(32) uint32_t out[2 * kChunk];
  uint32_t* s = d.state_.data();
  for (int64_t e = 0; e < n; e += kChunk) {
    const int64_t count = std::min(kChunk, n - e);
    int64_t want = 2 * count;
    uint32_t* o = out;
    while (want > 0) {
      int ready = d.left_ - 1;
      if (ready == 0) {
        k.twist(s);
        d.left_ = kN + 1;
        d.next_ = 0;
        ready = kN;
      }
      const int take = static_cast<int>(std::min<int64_t>(ready, want));
      k.temper(s + d.next_, o, take);
      d.left_ -= take;
      d.next_ += static_cast<uint32_t>(take);
      o += take;
      want -= take;
    }
    k.compare(out, count, t, bits + e / 8);
  }
}

bool same_engine(const at::mt19937_data_pod& a, const at::mt19937_data_pod& b) {
  return a.seed_ == b.seed_ && a.left_ == b.left_ && a.seeded_ == b.seeded_ &&
         a.next_ == b.next_ && a.state_ == b.state_;
}

// Whether kernels `k` draw what this libtorch's `bernoulli_` draws: values and the
// engine after, on a generator of its own, over lengths that end inside, at and across
// twists, odd engine positions and probabilities near both ends. No tensor data is
// allocated (`from_blob` on a local buffer), so the check leaves no trace in the
// memory meter.
bool agrees_with_libtorch(const Kernels& k) {
  try {
    const double qs[] = {0.9, 0.5, 0.123456789, 1.0 - 1e-12, 1e-9};
    const int64_t lengths[] = {1, 7, 311, 312, 313, 1000, 2049, 4099};
    const int skips[] = {0, 1, 623, 624};
    std::vector<float> ref(4099);
    std::vector<uint8_t> bits((4099 + 7) / 8);
    int trial = 0;
    for (double q : qs) {
      for (int64_t n : lengths) {
        const int skip = skips[trial % 4];
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + trial++);
        auto* impl = gen.get<at::CPUGeneratorImpl>();
        for (int j = 0; j < skip; ++j) impl->random();
        at::mt19937_data_pod d = impl->engine().data();
        at::from_blob(ref.data(), {n}, at::kFloat).bernoulli_(q, gen);
        draw_engine(d, n, q, bits.data(), k);
        if (!same_engine(d, impl->engine().data())) return false;
        for (int64_t i = 0; i < n; ++i) {
          if (((bits[i >> 3] >> (i & 7)) & 1) != (ref[i] != 0.0f ? 1 : 0)) return false;
        }
      }
    }
    return true;
  } catch (...) {
    return false;
  }
}

std::atomic<bool> g_force_portable{false};

// The kernels this process draws with, checked once; null where neither agrees.
const Kernels* chosen(bool portable) {
  static const bool portable_ok = agrees_with_libtorch(kPortable);
#ifdef CKPT_BERNOULLI_AVX2
  static const bool avx2_ok = cpu_has_avx2() && agrees_with_libtorch(kAvx2);
  if (!portable && avx2_ok) return &kAvx2;
#else
  (void)portable;
#endif
  return portable_ok ? &kPortable : nullptr;
}

}  // namespace

bool draw_bits(int64_t n, double q, uint8_t* out) {
  if (!(q >= 0.0 && q <= 1.0) || n < 0) return false;
  const Kernels* k = chosen(g_force_portable.load(std::memory_order_relaxed));
  if (k == nullptr) return false;
  if (n == 0) return true;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  auto* impl = gen.get<at::CPUGeneratorImpl>();
  // See libtorch's Note [Acquire lock when using random generators].
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::mt19937_data_pod d = impl->engine().data();
  draw_engine(d, n, q, out, *k);
  at::mt19937 engine;
  engine.set_data(d);
  impl->set_engine(engine);
  return true;
}

bool force_portable(bool on) { return g_force_portable.exchange(on); }

int kernel() {
  const Kernels* k = chosen(g_force_portable.load(std::memory_order_relaxed));
  if (k == nullptr) return 0;
#ifdef CKPT_BERNOULLI_AVX2
  if (k == &kAvx2) return 2;
#endif
  return 1;
}

}  // namespace ckpt_bernoulli

extern "C" {

// Test hook (src/ffi.rs): draw with the portable loop even where AVX2 is available.
bool ckpt_bernoulli_force_portable(bool on) { return ckpt_bernoulli::force_portable(on); }

// Test hook (src/ffi.rs): the kernel `draw_bits` uses now: 0 none (the caller draws with
// `bernoulli_`), 1 the portable loop, 2 the AVX2 one.
int32_t ckpt_bernoulli_kernel() { return ckpt_bernoulli::kernel(); }

}  // extern "C"
