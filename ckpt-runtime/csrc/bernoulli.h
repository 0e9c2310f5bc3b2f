// The CPU generator's Bernoulli draw, as bits (csrc/bernoulli.cpp). Used by
// csrc/policy.cpp for every dropout mask it draws.
#pragma once

#include <cstdint>

namespace ckpt_bernoulli {

// Draws `n` Bernoulli(`q`) values (0 <= q <= 1) from libtorch's default CPU generator,
// exactly as `at::empty({n}).bernoulli_(q)` draws them (the same values, the generator
// left in the same state), and writes them as bits: bit `i % 8` of `out[i / 8]` is
// draw `i`, 1 for a one; the unused high bits of the last byte are 0. `out` holds
// `ceil(n / 8)` bytes. Holds the generator's mutex while it draws, as libtorch does.
//
// Returns false, drawing nothing, where this libtorch's CPU `bernoulli_` does not draw
// as this file expects (checked once a process against `bernoulli_` itself on a
// generator of its own); the caller then draws with `bernoulli_`.
bool draw_bits(int64_t n, double q, uint8_t* out);

// Test hook: true makes `draw_bits` use its portable loop where the CPU would take the
// AVX2 one (both draw the same bits). Returns the previous setting.
bool force_portable(bool on);

// The kernel `draw_bits` uses now: 0 none (it returns false), 1 the portable loop, 2 the
// AVX2 one.
int kernel();

}  // namespace ckpt_bernoulli
