// Prefill products on integer tiles (see qgemm.hpp): the weights' blocks unpacked to int16
// panels, activations in int16 blocks of 32, multiplied with AVX-512 VNNI (VPDPWSSD) in
// register tiles of 4 activation rows by 48 weight rows, or with AVX2 (VPMADDWD + VPADDD) in
// register tiles of 3 by 16, scaled per block in fp32.
#include "isa.hpp"
#include "qgemm.hpp"
#include "qgemm_blocks.hpp"
#include "qgemm_panel.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace relokv_engine {
namespace {

using detail::kGroup;
using detail::pack_vectorized;
using detail::tile_panel;

[[maybe_unused]] constexpr int kMr = 4;  // activation rows per register tile
constexpr int kGn = 3;                   // groups per register tile

// Without VNNI: output (i, r) from the panel by plain loops, as the tiles compute it.
[[maybe_unused]] void tile_portable(const q16_activations& x, std::int32_t i, const tile_panel& p,
                                    std::int32_t g, std::int32_t n, float* out) {
  const auto nbx = static_cast<std::size_t>(x.cols / 32);
  float acc = 0.0f;
  for (std::int32_t b = 0; b < p.nb; ++b) {
    const std::int16_t* a = x.q.data() +
                            static_cast<std::size_t>(i) * static_cast<std::size_t>(x.cols) +
                            static_cast<std::size_t>(b) * 32;
    const std::int16_t* w = p.block(g, b) + static_cast<std::size_t>(n) * 2;
    std::int32_t s = 0;
    for (int k = 0; k < 16; ++k) s += a[2 * k] * w[k * 32] + a[2 * k + 1] * w[k * 32 + 1];
    const std::size_t xb = static_cast<std::size_t>(i) * nbx + static_cast<std::size_t>(b);
    acc += static_cast<float>(s) * (p.d[p.at(g, b) + static_cast<std::size_t>(n)] * x.d[xb]) +
           p.m[p.at(g, b) + static_cast<std::size_t>(n)] * x.s[xb];
  }
  *out = acc;
}

#if RELOKV_ENGINE_TILES_VNNI
// MR activation rows from i0 against GN groups from g0: the int32 sums of one block in
// registers, then scaled into fp32 accumulators; `cols` valid outputs of the last group.
template <int MR, int GN, bool Min>
void tile(const q16_activations& x, std::int32_t i0, const tile_panel& p, std::int32_t g0, float* y,
          std::size_t ldy, int last_cols) {
  const auto nbx = static_cast<std::size_t>(x.cols / 32);
  __m512 acc[MR][GN];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < GN; ++j) acc[r][j] = _mm512_setzero_ps();
  for (std::int32_t b = 0; b < p.nb; ++b) {
    __m512i s[MR][GN];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < GN; ++j) s[r][j] = _mm512_setzero_si512();
    const std::int16_t* B[GN];
    for (int j = 0; j < GN; ++j) B[j] = p.block(g0 + j, b);
    const std::int16_t* A[MR];
    for (int r = 0; r < MR; ++r)
      A[r] = x.q.data() + static_cast<std::size_t>(i0 + r) * static_cast<std::size_t>(x.cols) +
             static_cast<std::size_t>(b) * 32;
    for (int k = 0; k < 16; ++k) {
      __m512i w[GN];
      for (int j = 0; j < GN; ++j) w[j] = _mm512_load_si512(B[j] + k * 32);
      for (int r = 0; r < MR; ++r) {
        std::int32_t pair;
        std::memcpy(&pair, A[r] + 2 * k, 4);
        const __m512i a = _mm512_set1_epi32(pair);
        for (int j = 0; j < GN; ++j) s[r][j] = _mm512_dpwssd_epi32(s[r][j], a, w[j]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      const std::size_t xb = static_cast<std::size_t>(i0 + r) * nbx + static_cast<std::size_t>(b);
      const __m512 dx = _mm512_set1_ps(x.d[xb]);
      for (int j = 0; j < GN; ++j) {
        const __m512 dw = _mm512_load_ps(p.d.data() + p.at(g0 + j, b));
        acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][j]), _mm512_mul_ps(dw, dx), acc[r][j]);
        if constexpr (Min)
          acc[r][j] = _mm512_fmadd_ps(_mm512_load_ps(p.m.data() + p.at(g0 + j, b)),
                                      _mm512_set1_ps(x.s[xb]), acc[r][j]);
      }
    }
  }
  const __mmask16 tail = static_cast<__mmask16>((1u << last_cols) - 1u);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < GN; ++j) {
      float* out =
          y + static_cast<std::size_t>(i0 + r) * ldy + static_cast<std::size_t>(j) * kGroup;
      if (j == GN - 1 && last_cols < kGroup)
        _mm512_mask_storeu_ps(out, tail, acc[r][j]);
      else
        _mm512_storeu_ps(out, acc[r][j]);
    }
}

using tile_fn = void (*)(const q16_activations&, std::int32_t, const tile_panel&, std::int32_t,
                         float*, std::size_t, int);
template <bool Min, int MR, int... GN>
constexpr std::array<tile_fn, kGn> row_of(std::integer_sequence<int, GN...>) {
  return {&tile<MR, GN + 1, Min>...};
}
template <bool Min, int... MR>
constexpr std::array<std::array<tile_fn, kGn>, kMr> table_of(std::integer_sequence<int, MR...>) {
  return {row_of<Min, MR + 1>(std::make_integer_sequence<int, kGn>{})...};
}
constexpr auto kTiles = table_of<false>(std::make_integer_sequence<int, kMr>{});
constexpr auto kTilesMin = table_of<true>(std::make_integer_sequence<int, kMr>{});
#endif

#if RELOKV_ENGINE_TILES_AVX2
// AVX2 has no VPDPWSSD and 16 registers: MR (<= 3) activation rows against one group (16 rows,
// two ymm of 8), the int32 sums of one block and the fp32 accumulators in 12 registers.
constexpr int kMr2 = 3;
template <int MR, bool Min>
void tile_avx2(const q16_activations& x, std::int32_t i0, const tile_panel& p, std::int32_t g,
               float* y, std::size_t ldy, int last_cols) {
  const auto nbx = static_cast<std::size_t>(x.cols / 32);
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (std::int32_t b = 0; b < p.nb; ++b) {
    __m256i s[MR][2];
    for (int r = 0; r < MR; ++r) s[r][0] = s[r][1] = _mm256_setzero_si256();
    const std::int16_t* B = p.block(g, b);
    const std::int16_t* A[MR];
    for (int r = 0; r < MR; ++r)
      A[r] = x.q.data() + static_cast<std::size_t>(i0 + r) * static_cast<std::size_t>(x.cols) +
             static_cast<std::size_t>(b) * 32;
    for (int k = 0; k < 16; ++k) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(B + k * 32));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(B + k * 32 + 16));
      for (int r = 0; r < MR; ++r) {
        std::int32_t pair;
        std::memcpy(&pair, A[r] + 2 * k, 4);
        const __m256i a = _mm256_set1_epi32(pair);
        s[r][0] = _mm256_add_epi32(s[r][0], _mm256_madd_epi16(a, w0));
        s[r][1] = _mm256_add_epi32(s[r][1], _mm256_madd_epi16(a, w1));
      }
    }
    const std::size_t at = p.at(g, b);
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_load_ps(p.d.data() + at + 8 * h);
      for (int r = 0; r < MR; ++r) {
        const std::size_t xb = static_cast<std::size_t>(i0 + r) * nbx + static_cast<std::size_t>(b);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][h]),
                                    _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xb])), acc[r][h]);
        if constexpr (Min)
          acc[r][h] = _mm256_fmadd_ps(_mm256_load_ps(p.m.data() + at + 8 * h),
                                      _mm256_set1_ps(x.s[xb]), acc[r][h]);
      }
    }
  }
  // Lanes below last_cols (per half: min(8, last_cols - 8 h)) are stored.
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int h = 0; h < 2; ++h) {
    const int live = std::min(8, last_cols - 8 * h);
    if (live <= 0) break;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(live), lane);
    for (int r = 0; r < MR; ++r) {
      float* out = y + static_cast<std::size_t>(i0 + r) * ldy + static_cast<std::size_t>(8 * h);
      if (live == 8)
        _mm256_storeu_ps(out, acc[r][h]);
      else
        _mm256_maskstore_ps(out, mask, acc[r][h]);
    }
  }
}
using tile_avx2_fn = void (*)(const q16_activations&, std::int32_t, const tile_panel&, std::int32_t,
                              float*, std::size_t, int);
constexpr std::array<tile_avx2_fn, kMr2> kTilesAvx2 = {&tile_avx2<1, false>, &tile_avx2<2, false>,
                                                       &tile_avx2<3, false>};
constexpr std::array<tile_avx2_fn, kMr2> kTilesAvx2Min = {&tile_avx2<1, true>, &tile_avx2<2, true>,
                                                          &tile_avx2<3, true>};
#endif

}  // namespace

namespace {
enum class tile_isa { kVnni, kAvx2, kPortable };
constexpr bool available(tile_isa isa) noexcept {
  switch (isa) {
    case tile_isa::kVnni:
      return RELOKV_ENGINE_TILES_VNNI != 0;
    case tile_isa::kAvx2:
      return RELOKV_ENGINE_TILES_AVX2 != 0;
    case tile_isa::kPortable:
      break;
  }
  return true;
}
constexpr const char* name_of(tile_isa isa) noexcept {
  switch (isa) {
    case tile_isa::kVnni:
      return "avx512-vnni";
    case tile_isa::kAvx2:
      return "avx2";
    case tile_isa::kPortable:
      break;
  }
  return "portable";
}
constexpr tile_isa kTileIsas[] = {tile_isa::kVnni, tile_isa::kAvx2, tile_isa::kPortable};
/// The best the build has under isa_cap().
tile_isa best_tile_isa() {
  const isa_level cap = isa_cap();
  for (const tile_isa isa : kTileIsas)
    if (available(isa) && (isa != tile_isa::kVnni || cap >= isa_level::kAvx512) &&
        (isa != tile_isa::kAvx2 || cap >= isa_level::kAvx2))
      return isa;
  return tile_isa::kPortable;
}
std::atomic<tile_isa> g_tile_isa{best_tile_isa()};
}  // namespace

bool has_tile_kernel(ggml_type t) noexcept {
  return has_block_decode(t) && integer_kernels_on() &&
         g_tile_isa.load(std::memory_order_relaxed) != tile_isa::kPortable;
}

std::int32_t tile_weight_bound(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::kQ4_K:
      return 63 * 15;
    case ggml_type::kQ6_K:
      return 128 * 32;
    default:
      return 128;
  }
}

const char* tile_kernel_isa() noexcept {
  return name_of(g_tile_isa.load(std::memory_order_relaxed));
}

std::vector<std::string> tile_kernel_isas() {
  std::vector<std::string> out;
  for (const tile_isa isa : kTileIsas)
    if (available(isa)) out.emplace_back(name_of(isa));
  return out;
}

void use_vectorized_panels(bool on) noexcept {
  pack_vectorized().store(on, std::memory_order_relaxed);
}

bool select_tile_kernel_isa(const std::string& isa) noexcept {
  for (const tile_isa t : kTileIsas)
    if (available(t) && isa == name_of(t)) {
      g_tile_isa.store(t, std::memory_order_relaxed);
      return true;
    }
  return false;
}

void q16_activations::size(std::int32_t rows, std::int32_t width, std::int32_t bound) {
  n = rows;
  cols = width;
  // A block's 32 products, each at most bound * limit in magnitude, sum in int32.
  limit = static_cast<std::int32_t>(std::min<std::int64_t>(
      32767, (std::int64_t{1} << 31) / (32 * static_cast<std::int64_t>(std::max(bound, 1))) - 1));
  const auto nbk = static_cast<std::size_t>(width / 32);
  q.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(width));
  d.resize(static_cast<std::size_t>(rows) * nbk);
  s.resize(d.size());
}

void q16_activations::quantize(const float* x, std::int32_t rows, std::int32_t width,
                               std::int32_t bound) {
  size(rows, width, bound);
  quantize_rows(x, 0, rows);
}

void q16_activations::quantize_rows(const float* x, std::int32_t i0, std::int32_t i1) {
  const auto nbk = static_cast<std::size_t>(cols / 32);
  const float lim = static_cast<float>(limit);
  for (std::size_t blk = static_cast<std::size_t>(i0) * nbk;
       blk < static_cast<std::size_t>(i1) * nbk; ++blk) {
    const float* xb = x + blk * 32;
    std::int16_t* qb = q.data() + blk * 32;
    int sum = 0;
    float amax = 0.0f;
#if RELOKV_ENGINE_TILES_VNNI
    const __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
    amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? lim / amax : 0.0f);
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), _mm512_cvtsepi32_epi16(qlo));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 16), _mm512_cvtsepi32_epi16(qhi));
    sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
#elif RELOKV_ENGINE_TILES_AVX2
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    amax = _mm_cvtss_f32(m4);
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? lim / amax : 0.0f);
    __m256i qi[4], total = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      qi[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv));  // |q| <= limit: no saturation
      total = _mm256_add_epi32(total, qi[k]);
    }
    // VPACKSSDW packs within 128-bit lanes: the permute puts the elements back in order.
    for (int k = 0; k < 2; ++k)
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(qb + 16 * k),
          _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2 * k], qi[2 * k + 1]), 0xD8));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
    sum = _mm_cvtsi128_si32(t4);
#else
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(xb[j]));
    const float inv = amax > 0.0f ? lim / amax : 0.0f;
    for (int j = 0; j < 32; ++j) {
      qb[j] = static_cast<std::int16_t>(std::lrintf(xb[j] * inv));
      sum += qb[j];
    }
#endif
    d[blk] = amax / lim;
    s[blk] = d[blk] * static_cast<float>(sum);
  }
}

void tile_matmul_rows(const qmatrix& w, const q16_activations& x, float* y, std::int32_t ldy,
                      std::int32_t r0, std::int32_t r1) {
  if (r1 <= r0 || x.n <= 0) return;
  if (x.cols != w.cols)
    throw std::logic_error("tiles: activations of " + std::to_string(x.cols) + " for a matrix of " +
                           std::to_string(w.cols) + " columns");
  // Panels of at most ~512 KiB (a share of L2), whole register tiles of rows.
  const std::int32_t per_tile = kGroup * kGn;
  const std::int32_t chunk = std::max<std::int32_t>(
      per_tile,
      static_cast<std::int32_t>((std::size_t{512} << 10) / (2 * static_cast<std::size_t>(w.cols))) /
          per_tile * per_tile);
  thread_local tile_panel p;
  [[maybe_unused]] const tile_isa isa = g_tile_isa.load(std::memory_order_relaxed);
  for (std::int32_t c0 = r0; c0 < r1; c0 += chunk) {
    const std::int32_t c1 = std::min(r1, c0 + chunk);
    p.pack(w, c0, c1);
    for (std::int32_t g = 0; g < p.groups; g += kGn) {
      const std::int32_t gn = std::min<std::int32_t>(kGn, p.groups - g);
      const std::int32_t col = c0 + g * kGroup;
      [[maybe_unused]] const int last =
          static_cast<int>(std::min<std::int32_t>(kGroup, c1 - (col + (gn - 1) * kGroup)));
#if RELOKV_ENGINE_TILES_VNNI
      if (isa == tile_isa::kVnni) {
        const auto& table = p.has_min ? kTilesMin : kTiles;
        for (std::int32_t i = 0; i < x.n; i += kMr) {
          const std::int32_t mr = std::min<std::int32_t>(kMr, x.n - i);
          table[static_cast<std::size_t>(mr - 1)][static_cast<std::size_t>(gn - 1)](
              x, i, p, g, y + col, static_cast<std::size_t>(ldy), last);
        }
        continue;
      }
#endif
#if RELOKV_ENGINE_TILES_AVX2
      if (isa == tile_isa::kAvx2) {
        const auto& table = p.has_min ? kTilesAvx2Min : kTilesAvx2;
        for (std::int32_t j = 0; j < gn; ++j) {
          const int cols = j == gn - 1 ? last : kGroup;
          for (std::int32_t i = 0; i < x.n; i += kMr2) {
            const std::int32_t mr = std::min<std::int32_t>(kMr2, x.n - i);
            table[static_cast<std::size_t>(mr - 1)](x, i, p, g + j, y + col + j * kGroup,
                                                    static_cast<std::size_t>(ldy), cols);
          }
        }
        continue;
      }
#endif
      for (std::int32_t i = 0; i < x.n; ++i)
        for (std::int32_t j = 0; j < gn; ++j)
          for (std::int32_t n = 0; n < kGroup && col + j * kGroup + n < c1; ++n)
            tile_portable(x, i, p, g + j, n,
                          y + static_cast<std::size_t>(i) * static_cast<std::size_t>(ldy) +
                              static_cast<std::size_t>(col + j * kGroup + n));
    }
  }
}

}  // namespace relokv_engine
