#pragma once
// The engine's fp32 product, y = x w^T, owned so that it is batch-invariant: every element
// y[i][r] is the same sum, in the same order, whatever the number of rows of x, the rows of w
// in the call, the tile the element falls in or the instruction set. A library SGEMM is not:
// OpenBLAS's AVX2 kernels sum the last rows of a tall x in another order than the first, so a
// prompt's row computed in a batch of 20 differed in its last bits from the same row in a batch
// of 120, and exact cache hits were no longer exact (issue 45).
//
// The sum, for a row pair of length k: eight running sums s[l] over the elements j = 8m + l
// (each a fused multiply-add, m ascending), reduced as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) +
// (s3 + s7)), then the last k mod 8 elements fused in, in order. The AVX2 kernel keeps s in one
// register per element of a 4 x 3 tile; the portable loop computes the same numbers with
// std::fma, so both give the same bits (the qgemm tests compare them).
#include <cstdint>

namespace relokv_engine {

/// y[i * ldy + r] = dot(x[i * ldx ...], w[r * ldw ...]) over k elements, for i < n and r < m.
void sgemm_nt(const float* x, std::int32_t ldx, std::int32_t n, const float* w, std::int32_t ldw,
              std::int32_t m, std::int32_t k, float* y, std::int32_t ldy) noexcept;
/// The same sum for one pair (the reference the kernels are tested against).
[[nodiscard]] float sgemm_dot(const float* x, const float* w, std::int32_t k) noexcept;
/// "avx2" or "portable": what sgemm_nt runs now (isa_cap() caps it).
[[nodiscard]] const char* sgemm_isa() noexcept;

}  // namespace relokv_engine
