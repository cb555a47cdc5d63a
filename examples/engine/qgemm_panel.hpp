#pragma once
// The int16 tiles' weight panels (qgemm_tiles.cpp): a quantized matrix's rows unpacked to the
// integers VPDPWSSD and VPMADDWD multiply, sixteen rows a group, with their scales and offsets.
// Q4_0, Q4_1 and Q8_0 are unpacked sixteen rows at a time in vector registers, the other
// types row by row; the panels are the same bits either way. Included by qgemm_tiles.cpp only
// (its ISA macros and GCC pragmas hold for the rest of that unit).
#include "qgemm.hpp"
#include "qgemm_blocks.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
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

namespace relokv_engine::detail {

// Block b (32 elements) of row r as integers q, a scale d and an offset m, so that element
// j = d * q[j] + m: the whole format's arithmetic is in d and m, the tiles multiply q exactly.
// K-quants: the sub-block's integer scale is folded into q (|q| <= 945 for Q4_K, <= 4096 for
// Q6_K), the super-block's fp16 scale is d.
inline void unpack32(const qmatrix& w, std::int32_t r, std::int32_t b, std::int16_t* q, float& d,
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
inline std::atomic<bool>& pack_vectorized() {
  static std::atomic<bool> on{true};
  return on;
}

inline constexpr int kGroup = 16;  // weight rows per group: one zmm of outputs

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

}  // namespace relokv_engine::detail
