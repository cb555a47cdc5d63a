// Decode products for every quantized type, block by block (see qgemm_blocks.hpp): each block
// of 32 weights is decoded to unsigned bytes u with a scale and an offset per half block
// (w = sc * u + o), multiplied with the int8 activations by VPDPBUSD (AVX-512 VNNI, 256-bit)
// or VPMADDUBSW + VPMADDWD (AVX2), scaled per half block in fp32.
#include "qgemm_blocks.hpp"

#include "isa.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RELOKV_ENGINE_AVX2 1
#else
#define RELOKV_ENGINE_AVX2 0
#endif
#if RELOKV_ENGINE_AVX2 && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define RELOKV_ENGINE_VNNI256 1
#else
#define RELOKV_ENGINE_VNNI256 0
#endif

namespace relokv_engine {
namespace {

// What a decoded block's halves (16 elements each) scale by: w = sc * u + o.
struct block_code {
  float sc[2];
  float o[2];
};

// The scalar decoder: block b of `row` as 32 unsigned values (Q8_0: q + 128).
block_code decode_portable(ggml_type t, const std::uint8_t* row, std::int32_t b, std::uint8_t* u) {
  block_code c{};
  const auto both = [&c](float sc, float o) {
    c.sc[0] = c.sc[1] = sc;
    c.o[0] = c.o[1] = o;
  };
  switch (t) {
    case ggml_type::kQ4_0:
    case ggml_type::kQ4_1: {
      const bool q41 = t == ggml_type::kQ4_1;
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * (q41 ? 20 : 18);
      const std::uint8_t* n = p + (q41 ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        u[j] = n[j] & 0xF;
        u[j + 16] = n[j] >> 4;
      }
      both(fp16_at(p), q41 ? fp16_at(p + 2) : -8.0f * fp16_at(p));
      return c;
    }
    case ggml_type::kQ5_0: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * 22;
      std::uint32_t qh = 0;
      std::memcpy(&qh, p + 2, 4);
      for (int j = 0; j < 16; ++j) {
        u[j] = static_cast<std::uint8_t>((p[6 + j] & 0xF) | (((qh >> j) & 1u) << 4));
        u[j + 16] = static_cast<std::uint8_t>((p[6 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      }
      both(fp16_at(p), -16.0f * fp16_at(p));
      return c;
    }
    case ggml_type::kQ8_0: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * 34;
      for (int j = 0; j < 32; ++j) u[j] = static_cast<std::uint8_t>(p[2 + j] ^ 0x80);
      both(fp16_at(p), -128.0f * fp16_at(p));
      return c;
    }
    case ggml_type::kQ4_K: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b / 8) * 144;
      const int s = b % 8;
      int sc = 0, mn = 0;
      q4_k_scale_min(p + 4, s, sc, mn);
      const std::uint8_t* n = p + 16 + 32 * (s / 2);
      for (int j = 0; j < 32; ++j) u[j] = (n[j] >> (4 * (s % 2))) & 0xF;
      both(fp16_at(p) * static_cast<float>(sc), -fp16_at(p + 2) * static_cast<float>(mn));
      return c;
    }
    case ggml_type::kQ6_K: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b / 8) * 210;
      const int s = b % 8, h = s / 4, q = s % 4;
      const std::uint8_t* l = p + 64 * h + (q % 2) * 32;
      const std::uint8_t* hi = p + 128 + 32 * h;
      const auto* scales = reinterpret_cast<const std::int8_t*>(p + 192) + 8 * h;
      for (int j = 0; j < 32; ++j)
        u[j] = static_cast<std::uint8_t>(((l[j] >> (4 * (q / 2))) & 0xF) |
                                         (((hi[j] >> (2 * q)) & 3) << 4));
      const float d = fp16_at(p + 208);
      for (int k = 0; k < 2; ++k) {
        c.sc[k] = d * static_cast<float>(scales[2 * q + k]);
        c.o[k] = -32.0f * c.sc[k];
      }
      return c;
    }
    default:
      throw std::logic_error(std::string("qgemm: no integer decode for ") + traits_of(t).name);
  }
}

#if RELOKV_ENGINE_AVX2
__m256i nibbles(const std::uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// The vector decoder: the same values and code as decode_portable. `Signed`: Q8_0 as its
// signed bytes with no offset (AVX2 multiplies them by sign transfer).
template <ggml_type T, bool Signed>
__attribute__((always_inline)) inline block_code decode_avx2(const std::uint8_t* row,
                                                             std::int32_t b, __m256i& u) {
  constexpr ggml_type t = T;
  block_code c{};
  const auto both = [&c](float sc, float o) {
    c.sc[0] = c.sc[1] = sc;
    c.o[0] = c.o[1] = o;
  };
  switch (t) {  // a constant: the one case is what remains
    case ggml_type::kQ4_0: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * 18;
      u = nibbles(p + 2);
      both(fp16_at(p), -8.0f * fp16_at(p));
      return c;
    }
    case ggml_type::kQ4_1: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * 20;
      u = nibbles(p + 4);
      both(fp16_at(p), fp16_at(p + 2));
      return c;
    }
    case ggml_type::kQ5_0: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * 22;
      std::int32_t qh = 0;
      std::memcpy(&qh, p + 2, 4);
      // Byte j takes byte j / 8 of qh, keeps bit j % 8 of it, and becomes 0x10 where it is set.
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(qh), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                   0x0101010101010101, 0x0000000000000000));
      const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      u = _mm256_or_si256(nibbles(p + 6), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
      both(fp16_at(p), -16.0f * fp16_at(p));
      return c;
    }
    case ggml_type::kQ8_0: {
      const std::uint8_t* p = row + static_cast<std::size_t>(b) * 34;
      u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
      if constexpr (Signed) {
        both(fp16_at(p), 0.0f);
      } else {
        u = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
        both(fp16_at(p), -128.0f * fp16_at(p));
      }
      return c;
    }
    default:
      throw std::logic_error(std::string("qgemm: no integer decode for ") + traits_of(t).name);
  }
}

// K-quants a super-block at a time: the eight sub-blocks' codes decoded once, then their
// bytes one by one.
template <ggml_type T>
inline constexpr bool kSuper = T == ggml_type::kQ4_K || T == ggml_type::kQ6_K;

template <ggml_type T>
__attribute__((always_inline)) inline void super_codes(const std::uint8_t* row, std::size_t sb,
                                                       block_code* c) {
  if constexpr (T == ggml_type::kQ4_K) {
    const std::uint8_t* p = row + sb * 144;
    const float d = fp16_at(p), dmin = fp16_at(p + 2);
    for (int s = 0; s < 8; ++s) {
      int sc = 0, mn = 0;
      q4_k_scale_min(p + 4, s, sc, mn);
      c[s].sc[0] = c[s].sc[1] = d * static_cast<float>(sc);
      c[s].o[0] = c[s].o[1] = -dmin * static_cast<float>(mn);
    }
  } else {
    const std::uint8_t* p = row + sb * 210;
    const float d = fp16_at(p + 208);
    for (int s = 0; s < 8; ++s) {
      const auto* scales = reinterpret_cast<const std::int8_t*>(p + 192) + 8 * (s / 4);
      for (int k = 0; k < 2; ++k) {
        c[s].sc[k] = d * static_cast<float>(scales[2 * (s % 4) + k]);
        c[s].o[k] = -32.0f * c[s].sc[k];
      }
    }
  }
}

template <ggml_type T>
__attribute__((always_inline)) inline __m256i super_bytes(const std::uint8_t* row, std::size_t sb,
                                                          int s) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  if constexpr (T == ggml_type::kQ4_K) {
    const std::uint8_t* p = row + sb * 144;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (s / 2)));
    return _mm256_and_si256(s % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
  } else {
    const std::uint8_t* p = row + sb * 210;
    const int h = s / 4, q = s % 4;
    const __m256i l =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * h + (q % 2) * 32));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h));
    const __m256i lo4 = _mm256_and_si256(q / 2 ? _mm256_srli_epi16(l, 4) : l, m4);
    __m256i hi2 = hi;
    switch (q) {  // shifts by immediates
      case 1:
        hi2 = _mm256_srli_epi16(hi, 2);
        break;
      case 2:
        hi2 = _mm256_srli_epi16(hi, 4);
        break;
      case 3:
        hi2 = _mm256_srli_epi16(hi, 6);
        break;
      default:
        break;
    }
    hi2 = _mm256_and_si256(hi2, _mm256_set1_epi8(3));
    return _mm256_or_si256(lo4, _mm256_slli_epi16(hi2, 4));
  }
}

// 32 unsigned bytes u against 32 int8 activations x: 8 int32 sums of 4 products each (lanes
// 0-3: the first half block, 4-7: the second).
struct avx2_dot {
  static constexpr bool kSigned = true;  // Q8_0 by sign transfer
  static __m256i unsigned_dot(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
  }
  static __m256i signed_dot(__m256i s, __m256i x) {
    return unsigned_dot(_mm256_sign_epi8(s, s), _mm256_sign_epi8(x, s));
  }
};
#if RELOKV_ENGINE_VNNI256
struct vnni_dot {
  static constexpr bool kSigned = false;  // Q8_0 as q + 128, the offset in the code
  static __m256i unsigned_dot(__m256i u, __m256i x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
  }
  static __m256i signed_dot(__m256i s, __m256i x) { return unsigned_dot(s, x); }
};
#endif

float hsum256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// One weight row against R activation rows, block by block.
template <class Dot, ggml_type T, int R>
void row_blocks(const qmatrix& w, std::int32_t r, const q8_activations& xq, std::int32_t i0,
                float* out) {
  const auto nb = static_cast<std::size_t>(w.cols / 32);
  constexpr bool sgn = Dot::kSigned && T == ggml_type::kQ8_0;
  const std::uint8_t* row = w.row(r);
  __m256 acc[R];
  float extra[R];
  for (int k = 0; k < R; ++k) {
    acc[k] = _mm256_setzero_ps();
    extra[k] = 0.0f;
  }
  const auto step = [&](std::size_t b, __m256i u, const block_code& c) {
    for (int k = 0; k < R; ++k) {
      const std::size_t i = static_cast<std::size_t>(i0 + k);
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          xq.q.data() + i * static_cast<std::size_t>(xq.cols) + b * 32));
      __m256i dp;
      if constexpr (sgn)
        dp = Dot::signed_dot(u, x);
      else
        dp = Dot::unsigned_dot(u, x);
      const float dx = xq.d[i * nb + b];
      const __m256 scale = _mm256_set_m128(_mm_set1_ps(c.sc[1] * dx), _mm_set1_ps(c.sc[0] * dx));
      acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), scale, acc[k]);
      const float* s16 = xq.s16.data() + (i * nb + b) * 2;
      extra[k] += c.o[0] * s16[0] + c.o[1] * s16[1];
    }
  };
  const std::size_t bytes = traits_of(T).block_bytes;
  if constexpr (kSuper<T>) {
    for (std::size_t sb = 0; sb < nb / 8; ++sb) {
      prefetch_ahead(row + sb * bytes, bytes);
      block_code c[8];
      super_codes<T>(row, sb, c);
      for (int s = 0; s < 8; ++s)
        step(sb * 8 + static_cast<std::size_t>(s), super_bytes<T>(row, sb, s), c[s]);
    }
  } else {
    for (std::size_t b = 0; b < nb; ++b) {
      if ((b * bytes) % 64 < bytes)  // the first block of a line (counted from the row's start)
        prefetch_ahead(row + b * bytes, 1);
      __m256i u;
      const block_code c = decode_avx2<T, sgn>(row, static_cast<std::int32_t>(b), u);
      step(b, u, c);
    }
  }
  for (int k = 0; k < R; ++k) out[k] = hsum256(acc[k]) + extra[k];
}

template <class Dot, ggml_type T>
void rows_of(const qmatrix& w, const q8_activations& xq, std::int32_t n, float* y, std::int32_t ldy,
             std::int32_t r0, std::int32_t r1) {
  const auto at = [&](std::int32_t i, std::int32_t r) {
    return y + static_cast<std::size_t>(i) * static_cast<std::size_t>(ldy) +
           static_cast<std::size_t>(r);
  };
  for (std::int32_t r = r0; r < r1; ++r) {
    std::int32_t i = 0;
    float out[4];
    for (; i + 4 <= n; i += 4) {
      row_blocks<Dot, T, 4>(w, r, xq, i, out);
      for (int k = 0; k < 4; ++k) *at(i + k, r) = out[k];
    }
    for (; i < n; ++i) {
      row_blocks<Dot, T, 1>(w, r, xq, i, out);
      *at(i, r) = out[0];
    }
  }
}

// The type, chosen once per product.
template <class Dot>
void rows_with(const qmatrix& w, const q8_activations& xq, std::int32_t n, float* y,
               std::int32_t ldy, std::int32_t r0, std::int32_t r1) {
  switch (w.type) {
    case ggml_type::kQ4_0:
      return rows_of<Dot, ggml_type::kQ4_0>(w, xq, n, y, ldy, r0, r1);
    case ggml_type::kQ4_1:
      return rows_of<Dot, ggml_type::kQ4_1>(w, xq, n, y, ldy, r0, r1);
    case ggml_type::kQ5_0:
      return rows_of<Dot, ggml_type::kQ5_0>(w, xq, n, y, ldy, r0, r1);
    case ggml_type::kQ8_0:
      return rows_of<Dot, ggml_type::kQ8_0>(w, xq, n, y, ldy, r0, r1);
    case ggml_type::kQ4_K:
      return rows_of<Dot, ggml_type::kQ4_K>(w, xq, n, y, ldy, r0, r1);
    case ggml_type::kQ6_K:
      return rows_of<Dot, ggml_type::kQ6_K>(w, xq, n, y, ldy, r0, r1);
    default:
      throw std::logic_error(std::string("qgemm: no integer decode for ") + traits_of(w.type).name);
  }
}
#endif

}  // namespace

bool has_block_decode(ggml_type t) noexcept {
  switch (t) {
    case ggml_type::kQ4_0:
    case ggml_type::kQ4_1:
    case ggml_type::kQ5_0:
    case ggml_type::kQ8_0:
    case ggml_type::kQ4_K:
    case ggml_type::kQ6_K:
      return true;
    default:
      return false;
  }
}

bool block_isa_available(block_isa isa) noexcept {
  switch (isa) {
    case block_isa::kPortable:
      return true;
    case block_isa::kAvx2:
      return RELOKV_ENGINE_AVX2 != 0 && isa_cap() >= isa_level::kAvx2;
    case block_isa::kVnni256:
      return RELOKV_ENGINE_VNNI256 != 0 && isa_cap() >= isa_level::kAvx512;
  }
  return false;
}

float block_dot_portable(const qmatrix& w, std::int32_t r, const q8_activations& xq,
                         std::int32_t i) {
  const auto nb = static_cast<std::size_t>(w.cols / 32);
  const std::int8_t* x =
      xq.q.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(xq.cols);
  float acc = 0.0f;
  std::uint8_t u[32];
  for (std::size_t b = 0; b < nb; ++b, x += 32) {
    const block_code c = decode_portable(w.type, w.row(r), static_cast<std::int32_t>(b), u);
    const std::size_t at = static_cast<std::size_t>(i) * nb + b;
    for (int h = 0; h < 2; ++h) {
      int s = 0;
      for (int j = 16 * h; j < 16 * h + 16; ++j) s += u[j] * x[j];
      acc += c.sc[h] * xq.d[at] * static_cast<float>(s) + c.o[h] * xq.s16[2 * at + h];
    }
  }
  return acc;
}

void block_rows(block_isa isa, const qmatrix& w, const q8_activations& xq, std::int32_t n, float* y,
                std::int32_t ldy, std::int32_t r0, std::int32_t r1) {
  if (!has_block_decode(w.type))
    throw std::logic_error(std::string("qgemm: no integer decode for ") + traits_of(w.type).name);
  switch (isa) {
#if RELOKV_ENGINE_VNNI256
    case block_isa::kVnni256:
      rows_with<vnni_dot>(w, xq, n, y, ldy, r0, r1);
      return;
#endif
#if RELOKV_ENGINE_AVX2
    case block_isa::kAvx2:
      rows_with<avx2_dot>(w, xq, n, y, ldy, r0, r1);
      return;
#endif
    default:
      for (std::int32_t r = r0; r < r1; ++r)
        for (std::int32_t i = 0; i < n; ++i)
          y[static_cast<std::size_t>(i) * static_cast<std::size_t>(ldy) +
            static_cast<std::size_t>(r)] = block_dot_portable(w, r, xq, i);
      return;
  }
}

}  // namespace relokv_engine
