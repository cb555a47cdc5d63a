#pragma once
/// @file
/// 16-lane float vectors (GCC/clang vector extensions) for the host attention fast path.
/// Enabled where the target has AVX-512 (16 lanes map to one register); elsewhere the portable
/// path, which compilers auto-vectorize for the target's width, is faster.
/// Vectors never cross a function boundary by value (helpers take references), so the code is
/// free of the calling-convention differences GCC warns about (-Wpsabi).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "relokv/config.hpp"

#if defined(__AVX512F__) && (defined(__GNUC__) || defined(__clang__))
#define RELOKV_HOST_SIMD 1
#else
#define RELOKV_HOST_SIMD 0
#endif

/// bf16 storage on AVX512_BF16 targets: Q.K and P.V as bf16 products with fp32 accumulation
/// (VDPBF16PS, two products per lane per instruction), the way GPU tensor-core kernels compute
/// them: the query and the softmax weights are rounded to bf16 (relative error <= 2^-9 each).
/// Define RELOKV_NO_BF16_DOT to keep fp32 queries and weights (half the throughput).
#if RELOKV_HOST_SIMD && defined(__AVX512BF16__) && !defined(RELOKV_NO_BF16_DOT)
#define RELOKV_HOST_BF16_DOT 1
#else
#define RELOKV_HOST_BF16_DOT 0
#endif

#if RELOKV_HOST_SIMD
#include <immintrin.h>

RELOKV_NAMESPACE_BEGIN
namespace detail::simd {

typedef float vf16 __attribute__((vector_size(64)));
typedef std::int32_t vi16 __attribute__((vector_size(64)));
typedef std::uint32_t vu16 __attribute__((vector_size(64)));
/// Unaligned, aliasing views for loads and stores from plain arrays.
typedef float vf16u __attribute__((vector_size(64), aligned(4), may_alias));
typedef std::uint16_t vh16u __attribute__((vector_size(32), aligned(2), may_alias));
typedef std::int32_t vi16u __attribute__((vector_size(64), aligned(4), may_alias));

#define RELOKV_VLOAD(p) (*reinterpret_cast<const ::relokv::detail::simd::vf16u*>(p))
#define RELOKV_VSTORE(p, v) (*reinterpret_cast<::relokv::detail::simd::vf16u*>(p) = (v))

/// 16 bf16 values (raw bits) to fp32.
RELOKV_ALWAYS_INLINE inline void load_bf16(vf16& out, const std::uint16_t* p) {
  const vu16 w = __builtin_convertvector(*reinterpret_cast<const vh16u*>(p), vu16) << 16;
  out = __builtin_bit_cast(vf16, w);
}

/// One level of a 16 x 16 transpose, which exchanges bit S of the row index with bit S of the
/// lane index between rows a (bit S clear) and b (bit S set): swap_lo is a's new row,
/// swap_hi is b's.
template <int S, std::size_t... I>
RELOKV_ALWAYS_INLINE inline vf16 swap_lo(const vf16& a, const vf16& b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, ((I & S) != 0 ? 16 + int(I) - S : int(I))...);
}
template <int S, std::size_t... I>
RELOKV_ALWAYS_INLINE inline vf16 swap_hi(const vf16& a, const vf16& b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, ((I & S) != 0 ? 16 + int(I) : int(I) + S)...);
}

/// Level S of the transpose over all 16 rows, in place.
template <int S>
RELOKV_ALWAYS_INLINE inline void transpose_level(vf16 (&r)[16]) {
  constexpr auto lanes = std::make_index_sequence<16>{};
  for (int i = 0; i < 16; ++i) {
    if ((i & S) != 0) continue;
    const vf16 a = r[i], b = r[i + S];
    r[i] = swap_lo<S>(a, b, lanes);
    r[i + S] = swap_hi<S>(a, b, lanes);
  }
}

/// In-place transpose of 16 rows of 16 lanes.
RELOKV_ALWAYS_INLINE inline void transpose16(vf16 (&r)[16]) {
  transpose_level<1>(r);
  transpose_level<2>(r);
  transpose_level<4>(r);
  transpose_level<8>(r);
}

/// op over each of 16 vectors into one lane each: out[j] = op(a[j][0], ..., a[j][15]). The
/// transpose's levels, combining the two halves of each swap instead of keeping both: each
/// level halves the number of vectors and doubles the number of rows a vector holds partial
/// results for.
template <class Op>
RELOKV_ALWAYS_INLINE inline void transpose_reduce(const vf16* a, vf16& out, Op op) {
  constexpr auto lanes = std::make_index_sequence<16>{};
  vf16 l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; ++i)
    l1[i] =
        op(swap_lo<1>(a[2 * i], a[2 * i + 1], lanes), swap_hi<1>(a[2 * i], a[2 * i + 1], lanes));
  for (int i = 0; i < 4; ++i)
    l2[i] = op(swap_lo<2>(l1[2 * i], l1[2 * i + 1], lanes),
               swap_hi<2>(l1[2 * i], l1[2 * i + 1], lanes));
  for (int i = 0; i < 2; ++i)
    l3[i] = op(swap_lo<4>(l2[2 * i], l2[2 * i + 1], lanes),
               swap_hi<4>(l2[2 * i], l2[2 * i + 1], lanes));
  out = op(swap_lo<8>(l3[0], l3[1], lanes), swap_hi<8>(l3[0], l3[1], lanes));
}

/// Sum of each of 16 vectors into one lane each: out[j] = sum(a[j]).
RELOKV_ALWAYS_INLINE inline void transpose_sum(const vf16* a, vf16& out) {
  transpose_reduce(a, out, [](const vf16& x, const vf16& y) { return x + y; });
}

/// op over all 16 lanes (log-step reduction, the result in every lane; GCC 12's AVX-512 reduce
/// and max intrinsics draw -Wmaybe-uninitialized through _mm512_undefined_ps).
template <class Op>
RELOKV_ALWAYS_INLINE inline float reduce16(vf16 x, Op op) {
  x = op(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  x = op(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return x[0];
}

/// The largest of the first `live` lanes (1 <= live <= 16).
RELOKV_ALWAYS_INLINE inline float live_max(const vf16& x, int live) {
  const auto m = static_cast<__mmask16>((1u << live) - 1u);
  const vf16 y = _mm512_mask_blend_ps(m, _mm512_set1_ps(-__builtin_inff()), x);
  return reduce16(y, [](const vf16& a, const vf16& b) { return a > b ? a : b; });  // vmaxps
}

/// The sum of all lanes.
RELOKV_ALWAYS_INLINE inline float sum(const vf16& x) {
  return reduce16(x, [](const vf16& a, const vf16& b) { return a + b; });
}

/// Zeroes the lanes from `live` on.
RELOKV_ALWAYS_INLINE inline void live_only(vf16& x, int live) {
  x = _mm512_maskz_mov_ps(static_cast<__mmask16>((1u << live) - 1u), x);
}

/// x = e^x lane-wise for x <= 0; see detail::exp_nonpositive for the method and accuracy.
RELOKV_ALWAYS_INLINE inline void exp_nonpositive(vf16& x) {
  const vf16 lo = vf16{} - 87.0f;
  const vf16 xc = lo > x ? lo : x;  // vmaxps; NaN stays NaN
  const vf16 t = xc * 1.44269504088896341f - 0.5f;
  const vi16 n = __builtin_convertvector(t, vi16);  // truncation == round-to-nearest here
  const vf16 fn = __builtin_convertvector(n, vf16);
  vf16 r = xc - fn * 0.693145751953125f;
  r = r - fn * 1.428606765330187045e-06f;
  vf16 p = r * (1.0f / 720.0f) + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vi16 e = (n + 127) << 23;
  x = p * __builtin_bit_cast(vf16, e);
}

}  // namespace detail::simd
RELOKV_NAMESPACE_END
#endif
