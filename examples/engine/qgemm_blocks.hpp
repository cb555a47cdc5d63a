#pragma once
// Decode products block by block for every quantized type (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K,
// Q6_K): what qmatmul_rows runs for the types without a paired kernel, and on hosts without
// AVX-512 VNNI for all of them. Each block of 32 weights is decoded to unsigned bytes with a
// scale and an offset per half block (K-quants: their sub-block's), so one loop serves every
// type; the int8 activations' half-block sums (q8_activations::s16) carry the offsets.
#include <cstddef>
#include <cstdint>

#include "qgemm.hpp"

namespace relokv_engine {

/// The instruction sets of the block kernels: VPDPBUSD on 256 bits (AVX-512 VNNI + VL),
/// VPMADDUBSW + VPMADDWD (AVX2), or scalar loops.
enum class block_isa { kVnni256, kAvx2, kPortable };

/// How far ahead of the bytes being multiplied a GEMV prefetches its weights (into L2), step
/// by step: 1, 4, 8 and 16 KiB streamed a 48 MB matrix slower
/// (bench/results/engine-2026-12-02.md).
inline constexpr std::size_t kPrefetchAhead = 2048;
/// Prefetches (into L2) the lines of the `bytes` at p + kPrefetchAhead. Each step of a GEMV
/// kernel prefetches its own bytes, spread among its products: a burst of a row's lines at its
/// start stalled the core once the lines in flight filled its buffers
/// (bench/results/engine-2026-12-02b.md).
inline void prefetch_ahead(const std::uint8_t* p, std::size_t bytes) noexcept {
  for (std::size_t j = 0; j < bytes; j += 64) __builtin_prefetch(p + kPrefetchAhead + j, 0, 2);
}

/// Whether this build has the kernels of `isa` (the host must run what the build targets).
[[nodiscard]] bool block_isa_available(block_isa isa) noexcept;
/// Whether t is one of the types the block kernels decode.
[[nodiscard]] bool has_block_decode(ggml_type t) noexcept;

/// y[i][r] = dot(xq[i], w[r]) for i < n and r in [r0, r1) on the kernels of `isa`
/// (portable when this build lacks them).
/// @throws std::logic_error when w's type has no block decode
void block_rows(block_isa isa, const qmatrix& w, const q8_activations& xq, std::int32_t n, float* y,
                std::int32_t ldy, std::int32_t r0, std::int32_t r1);

/// One row's product by the scalar loops: the reference of every integer kernel.
[[nodiscard]] float block_dot_portable(const qmatrix& w, std::int32_t r, const q8_activations& xq,
                                       std::int32_t i);

}  // namespace relokv_engine
