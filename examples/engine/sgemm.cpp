// The batch-invariant fp32 product (see sgemm.hpp).
#include "sgemm.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "isa.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RELOKV_SGEMM_AVX2 1
#else
#define RELOKV_SGEMM_AVX2 0
#endif

namespace relokv_engine {
namespace {

/// The eight running sums, reduced in the one order every path uses.
inline float reduce8(const float* s) noexcept {
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}
/// The elements past the last whole group of eight, fused in order.
inline float finish(float acc, const float* x, const float* w, std::int32_t k8,
                    std::int32_t k) noexcept {
  for (std::int32_t j = k8; j < k; ++j) acc = std::fma(x[j], w[j], acc);
  return acc;
}

float dot_portable(const float* x, const float* w, std::int32_t k) noexcept {
  float s[8] = {};
  const std::int32_t k8 = k & ~7;
  for (std::int32_t j = 0; j < k8; j += 8)
    for (int l = 0; l < 8; ++l) s[l] = std::fma(x[j + l], w[j + l], s[l]);
  return finish(reduce8(s), x, w, k8, k);
}

#if RELOKV_SGEMM_AVX2
/// One MR x NR tile: MR rows of x against NR rows of w, one register of running sums each.
template <int MR, int NR>
void tile_avx2(const float* x, std::size_t ldx, const float* w, std::size_t ldw, std::int32_t k,
               float* y, std::size_t ldy) noexcept {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  const std::int32_t k8 = k & ~7;
  for (std::int32_t p = 0; p < k8; p += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(w + j * ldw + p);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + p);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      alignas(32) float s[8];
      _mm256_store_ps(s, acc[i][j]);
      y[i * ldy + j] = finish(reduce8(s), x + i * ldx, w + j * ldw, k8, k);
    }
}

template <int MR>
void tile_rows_avx2(int nr, const float* x, std::size_t ldx, const float* w, std::size_t ldw,
                    std::int32_t k, float* y, std::size_t ldy) noexcept {
  switch (nr) {
    case 3:
      tile_avx2<MR, 3>(x, ldx, w, ldw, k, y, ldy);
      break;
    case 2:
      tile_avx2<MR, 2>(x, ldx, w, ldw, k, y, ldy);
      break;
    default:
      tile_avx2<MR, 1>(x, ldx, w, ldw, k, y, ldy);
      break;
  }
}

void sgemm_avx2(const float* x, std::size_t ldx, std::int32_t n, const float* w, std::size_t ldw,
                std::int32_t m, std::int32_t k, float* y, std::size_t ldy) noexcept {
  constexpr int kMr = 4, kNr = 3;
  // A block of w's rows that stays in L2 (about 192 KiB) while every tile of x passes by.
  const std::int32_t block = std::max<std::int32_t>(
      kNr, static_cast<std::int32_t>((192u << 10) / (4u * static_cast<unsigned>(k))) / kNr * kNr);
  for (std::int32_t r0 = 0; r0 < m; r0 += block) {
    const std::int32_t r1 = std::min(m, r0 + block);
    for (std::int32_t i = 0; i < n; i += kMr) {
      const int mr = static_cast<int>(std::min<std::int32_t>(kMr, n - i));
      const float* xi = x + static_cast<std::size_t>(i) * ldx;
      for (std::int32_t r = r0; r < r1; r += kNr) {
        const int nr = static_cast<int>(std::min<std::int32_t>(kNr, r1 - r));
        const float* wr = w + static_cast<std::size_t>(r) * ldw;
        float* yt = y + static_cast<std::size_t>(i) * ldy + static_cast<std::size_t>(r);
        switch (mr) {
          case 4:
            tile_rows_avx2<4>(nr, xi, ldx, wr, ldw, k, yt, ldy);
            break;
          case 3:
            tile_rows_avx2<3>(nr, xi, ldx, wr, ldw, k, yt, ldy);
            break;
          case 2:
            tile_rows_avx2<2>(nr, xi, ldx, wr, ldw, k, yt, ldy);
            break;
          default:
            tile_rows_avx2<1>(nr, xi, ldx, wr, ldw, k, yt, ldy);
            break;
        }
      }
    }
  }
}
#endif

bool use_avx2() noexcept {
#if RELOKV_SGEMM_AVX2
  static const bool on = isa_cap() >= isa_level::kAvx2;
  return on;
#else
  return false;
#endif
}

}  // namespace

float sgemm_dot(const float* x, const float* w, std::int32_t k) noexcept {
  return dot_portable(x, w, k);
}

const char* sgemm_isa() noexcept { return use_avx2() ? "avx2" : "portable"; }

void sgemm_nt(const float* x, std::int32_t ldx, std::int32_t n, const float* w, std::int32_t ldw,
              std::int32_t m, std::int32_t k, float* y, std::int32_t ldy) noexcept {
  if (n <= 0 || m <= 0) return;
  const auto lx = static_cast<std::size_t>(ldx), lw = static_cast<std::size_t>(ldw),
             ly = static_cast<std::size_t>(ldy);
#if RELOKV_SGEMM_AVX2
  if (use_avx2()) {
    sgemm_avx2(x, lx, n, w, lw, m, k, y, ly);
    return;
  }
#endif
  for (std::int32_t i = 0; i < n; ++i)
    for (std::int32_t r = 0; r < m; ++r)
      y[static_cast<std::size_t>(i) * ly + static_cast<std::size_t>(r)] = dot_portable(
          x + static_cast<std::size_t>(i) * lx, w + static_cast<std::size_t>(r) * lw, k);
}

}  // namespace relokv_engine
