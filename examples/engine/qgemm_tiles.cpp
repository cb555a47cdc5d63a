// Prefill products on integer tiles (see qgemm.hpp): the weights' blocks unpacked to int16
// panels, activations in int16 blocks of 32, multiplied with AVX-512 VNNI (VPDPWSSD) in
// register tiles of 4 activation rows by 48 weight rows, or with AVX2 (VPMADDWD + VPADDD) in
// register tiles of 3 by 16, scaled per block in fp32.
#include "isa.hpp"
#include "qgemm.hpp"
#include "qgemm_blocks.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#include <immintrin.h>
#define RELOKV_ENGINE_TILES_VNNI 1
#else
#define RELOKV_ENGINE_TILES_VNNI 0
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RELOKV_ENGINE_TILES_AVX2 1
#else
#define RELOKV_ENGINE_TILES_AVX2 0
#endif

// GCC 12 reports a false -Wmaybe-uninitialized inside AVX-512 intrinsics (their
// _mm512_undefined_* operands, GCC bug 105593), as in qgemm.cpp.
#if RELOKV_ENGINE_TILES_VNNI && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace relokv_engine {
namespace {

// Block b (32 elements) of row r as integers q, a scale d and an offset m, so that element
// j = d * q[j] + m: the whole format's arithmetic is in d and m, the tiles multiply q exactly.
// K-quants: the sub-block's integer scale is folded into q (|q| <= 945 for Q4_K, <= 4096 for
// Q6_K), the super-block's fp16 scale is d.
void unpack32(const qmatrix& w, std::int32_t r, std::int32_t b, std::int16_t* q, float& d,
              float& m) {
  const std::uint8_t* row = w.row(r);
  switch (w.type) {
    case ggml_type::kQ4_0:
    case ggml_type::kQ4_1: {
      const bool q41 = w.type == ggml_type::kQ4_1;
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * (q41 ? 20 : 18);
      const std::uint8_t* n = p + (q41 ? 4 : 2);
      const int off = q41 ? 0 : 8;
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<std::int16_t>((n[j] & 0xF) - off);
        q[j + 16] = static_cast<std::int16_t>((n[j] >> 4) - off);
      }
      d = fp16_at(p);
      m = q41 ? fp16_at(p + 2) : 0.0f;
      return;
    }
    case ggml_type::kQ5_0: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * 22;
      std::uint32_t qh = 0;
      std::memcpy(&qh, p + 2, 4);
      for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<std::int16_t>(((p[6 + j] & 0xF) | (((qh >> j) & 1u) << 4)) - 16);
        q[j + 16] =
            static_cast<std::int16_t>(((p[6 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16);
      }
      d = fp16_at(p);
      m = 0.0f;
      return;
    }
    case ggml_type::kQ8_0: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * 34;
      for (int j = 0; j < 32; ++j) q[j] = static_cast<std::int8_t>(p[2 + j]);
      d = fp16_at(p);
      m = 0.0f;
      return;
    }
    case ggml_type::kQ4_K: {
      // Sub-block s of a super-block: 32 nibbles (low for even s, high for odd), scale and
      // minimum from the 12 packed bytes.
      const std::uint8_t* p = row + static_cast<std::size_t>(b / 8) * 144;
      const int s = b % 8;
      const std::uint8_t* sc = p + 4;
      int scale = 0, mn = 0;
      q4_k_scale_min(sc, s, scale, mn);
      const std::uint8_t* n = p + 16 + 32 * (s / 2);
      const int shift = (s % 2) * 4;
      for (int j = 0; j < 32; ++j)
        q[j] = static_cast<std::int16_t>(((n[j] >> shift) & 0xF) * scale);
      d = fp16_at(p);
      m = -fp16_at(p + 2) * static_cast<float>(mn);
      return;
    }
    case ggml_type::kQ6_K: {
      // Sub-block s (32 elements) of a super-block: half h = s / 4, quarter c = s % 4 of it;
      // two int8 scales, one per 16 elements.
      const std::uint8_t* p = row + static_cast<std::size_t>(b / 8) * 210;
      const int s = b % 8, h = s / 4, c = s % 4;
      const std::uint8_t* l = p + 64 * h + (c % 2) * 32;
      const std::uint8_t* hi = p + 128 + 32 * h;
      const auto* scales = reinterpret_cast<const std::int8_t*>(p + 192) + 8 * h;
      const int lshift = (c / 2) * 4, hshift = 2 * c;
      for (int j = 0; j < 32; ++j) {
        const int v = (((l[j] >> lshift) & 0xF) | (((hi[j] >> hshift) & 3) << 4)) - 32;
        q[j] = static_cast<std::int16_t>(v * scales[j / 16 + 2 * c]);
      }
      d = fp16_at(p + 208);
      m = 0.0f;
      return;
    }
    default:
      throw std::logic_error(std::string("tiles: no integer form for ") + traits_of(w.type).name);
  }
}

// A buffer of T whose data is 64-byte aligned (one zmm per cache line), grown, never shrunk.
template <class T>
struct aligned_buffer {
  std::vector<T> raw;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  void assign(std::size_t n, T v) {
    if (raw.size() < n + 64 / sizeof(T)) raw.resize(n + 64 / sizeof(T));
    auto addr = reinterpret_cast<std::uintptr_t>(raw.data());
    data_ = raw.data() + ((64 - addr % 64) % 64) / sizeof(T);
    size_ = n;
    std::fill_n(data_, n, v);
  }
  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
};

// Whether the panels of Q4_0, Q4_1 and Q8_0 are unpacked in registers (tests compare both).
std::atomic<bool>& pack_vectorized() {
  static std::atomic<bool> on{true};
  return on;
}

constexpr int kGroup = 16;               // weight rows per group: one zmm of outputs
[[maybe_unused]] constexpr int kMr = 4;  // activation rows per register tile
constexpr int kGn = 3;                   // groups per register tile

// Rows [r0, r1) of w in groups of 16: per group and block, 16 pairs of elements of each of the
// 16 rows ([pair][row][2] int16, what VPDPWSSD reads against a broadcast activation pair), and
// the rows' scales and offsets. Rows past r1 are zeros.
struct tile_panel {
  aligned_buffer<std::int16_t> q;
  aligned_buffer<float> d, m;
  std::int32_t groups = 0, nb = 0;
  bool has_min = false;

  [[nodiscard]] const std::int16_t* block(std::int32_t g, std::int32_t b) const noexcept {
    return q.data() + (static_cast<std::size_t>(g) * static_cast<std::size_t>(nb) +
                       static_cast<std::size_t>(b)) *
                          512;
  }
  [[nodiscard]] std::size_t at(std::int32_t g, std::int32_t b) const noexcept {
    return (static_cast<std::size_t>(g) * static_cast<std::size_t>(nb) +
            static_cast<std::size_t>(b)) *
           kGroup;
  }

  void pack(const qmatrix& w, std::int32_t r0, std::int32_t r1) {
    nb = w.cols / 32;
    groups = (r1 - r0 + kGroup - 1) / kGroup;
    const std::size_t slots = static_cast<std::size_t>(groups) * static_cast<std::size_t>(nb);
    q.assign(slots * 512, 0);
    d.assign(slots * kGroup, 0.0f);
    m.assign(slots * kGroup, 0.0f);
    has_min = false;
    std::int32_t r = r0;
#if RELOKV_ENGINE_TILES_VNNI || RELOKV_ENGINE_TILES_AVX2
    // Whole groups of the formats the shipped models use, in registers (the same panel).
    if (pack_vectorized().load(std::memory_order_relaxed))
      for (; r + kGroup <= r1 && pack_group(w, r, (r - r0) / kGroup); r += kGroup) {
      }
#endif
    std::int16_t v[32];
    for (; r < r1; ++r) {
      const std::int32_t g = (r - r0) / kGroup, n = (r - r0) % kGroup;
      for (std::int32_t b = 0; b < nb; ++b) {
        float db = 0.0f, mb = 0.0f;
        unpack32(w, r, b, v, db, mb);
        std::int16_t* dst = q.data() +
                            (static_cast<std::size_t>(g) * static_cast<std::size_t>(nb) +
                             static_cast<std::size_t>(b)) *
                                512 +
                            static_cast<std::size_t>(n) * 2;
        for (int k = 0; k < 16; ++k) {
          dst[k * 32] = v[2 * k];
          dst[k * 32 + 1] = v[2 * k + 1];
        }
        d[at(g, b) + static_cast<std::size_t>(n)] = db;
        m[at(g, b) + static_cast<std::size_t>(n)] = mb;
        has_min = has_min || mb != 0.0f;
      }
    }
  }

#if RELOKV_ENGINE_TILES_VNNI || RELOKV_ENGINE_TILES_AVX2
  // Rows [r, r + 16) of a Q4_0, Q4_1 or Q8_0 matrix as group g: per block, each row's 32
  // integers as registers of 16 pairs, transposed (pair k of every row is then contiguous, as
  // the tiles read it). False for another type (nothing written).
  bool pack_group(const qmatrix& w, std::int32_t r, std::int32_t g) {
    const bool q41 = w.type == ggml_type::kQ4_1;
    if (w.type != ggml_type::kQ4_0 && !q41 && w.type != ggml_type::kQ8_0) return false;
    const bool q8 = w.type == ggml_type::kQ8_0;
    const std::size_t bytes = q8 ? 34 : q41 ? 20 : 18, lead = q41 ? 4 : 2;
    const __m256i low = _mm256_set1_epi16(0xF), off = _mm256_set1_epi16(q41 ? 0 : 8);
    for (std::int32_t b = 0; b < nb; ++b) {
      __m256i t[kGroup][2];  // row n: pairs 0-7 (its first 16 integers), pairs 8-15
      const std::size_t at_b = at(g, b);
      for (int n = 0; n < kGroup; ++n) {
        const std::uint8_t* p = w.row(r + n) + static_cast<std::size_t>(b) * bytes;
        if (q8) {
          t[n][0] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2)));
          t[n][1] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18)));
        } else {
          const __m256i x =
              _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + lead)));
          t[n][0] = _mm256_sub_epi16(_mm256_and_si256(x, low), off);
          t[n][1] = _mm256_sub_epi16(_mm256_srli_epi16(x, 4), off);
        }
        d[at_b + static_cast<std::size_t>(n)] = fp16_at(p);
        if (q41) {
          const float mb = fp16_at(p + 2);
          m[at_b + static_cast<std::size_t>(n)] = mb;
          has_min = has_min || mb != 0.0f;
        }
      }
      std::int16_t* dst = q.data() + at_b * 32;  // block (g, b): 512 int16 from 32 * at
#if RELOKV_ENGINE_TILES_VNNI
      __m512i z[kGroup];
      for (int n = 0; n < kGroup; ++n)
        z[n] = _mm512_inserti64x4(_mm512_castsi256_si512(t[n][0]), t[n][1], 1);
      transpose16(z);
      for (int k = 0; k < kGroup; ++k) _mm512_store_si512(dst + k * 32, z[k]);
#else
      // Four 8 x 8 blocks: rows 8h.., pairs 8c.. to pairs 8c.., rows 8h.. (16 int16 a row).
      for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 2; ++c) {
          __m256i e[8];
          for (int i = 0; i < 8; ++i) e[i] = t[8 * h + i][c];
          transpose8(e);
          for (int k = 0; k < 8; ++k)
            _mm256_store_si256(reinterpret_cast<__m256i*>(dst + (8 * c + k) * 32 + 16 * h), e[k]);
        }
#endif
    }
    return true;
  }
#endif

#if RELOKV_ENGINE_TILES_VNNI
  // A 16 x 16 matrix of 32-bit elements, one row a register, transposed in place.
  static void transpose16(__m512i* t) {
    __m512i a[16], c[16];
    for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks of elements
      a[i] = _mm512_unpacklo_epi32(t[i], t[i + 1]);
      a[i + 1] = _mm512_unpackhi_epi32(t[i], t[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // 4 x 4 blocks within each 128-bit lane
      c[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
      c[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
      c[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
      c[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    // c[4q + j] holds, in 128-bit lane l, elements (4q .. 4q+3) of column 4l + j: lanes are
    // then exchanged across the four registers groups q.
    for (int j = 0; j < 4; ++j) {
      const __m512i x0 = _mm512_shuffle_i32x4(c[j], c[4 + j], 0x88);       // lanes 0, 2
      const __m512i x1 = _mm512_shuffle_i32x4(c[j], c[4 + j], 0xDD);       // lanes 1, 3
      const __m512i x2 = _mm512_shuffle_i32x4(c[8 + j], c[12 + j], 0x88);  // lanes 0, 2
      const __m512i x3 = _mm512_shuffle_i32x4(c[8 + j], c[12 + j], 0xDD);  // lanes 1, 3
      t[j] = _mm512_shuffle_i32x4(x0, x2, 0x88);                           // column j
      t[8 + j] = _mm512_shuffle_i32x4(x0, x2, 0xDD);                       // column 8 + j
      t[4 + j] = _mm512_shuffle_i32x4(x1, x3, 0x88);                       // column 4 + j
      t[12 + j] = _mm512_shuffle_i32x4(x1, x3, 0xDD);                      // column 12 + j
    }
  }
#elif RELOKV_ENGINE_TILES_AVX2
  // An 8 x 8 matrix of 32-bit elements, one row a register, transposed in place.
  static void transpose8(__m256i* t) {
    __m256i a[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      a[i] = _mm256_unpacklo_epi32(t[i], t[i + 1]);
      a[i + 1] = _mm256_unpackhi_epi32(t[i], t[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {  // u[4q + j]: rows 4q.. of column 4l + j in lane l
      u[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
      u[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
      u[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
      u[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
    }
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
      t[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
  }
#endif
};

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
