#pragma once
/// @file
/// Float vectors of the target's native width (GCC/clang vector extensions) for the host
/// attention fast path: 16 lanes where the target has AVX-512, 8 where it has AVX2 with FMA
/// (kLanes), the portable path elsewhere. A vector is always one register: GCC keeps a 16-lane
/// vector on an AVX2 target in memory and lowers its shuffles and selects lane by lane
/// (2.4x slower than the portable path, docs/design-changes.md).
/// Vectors never cross a function boundary by value (helpers take references and write their
/// results through them), so the code is free of the calling-convention differences GCC warns
/// about (-Wpsabi).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "relokv/config.hpp"

#if (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))) && \
    (defined(__GNUC__) || defined(__clang__))
#define RELOKV_HOST_SIMD 1
#else
#define RELOKV_HOST_SIMD 0
#endif

/// bf16 storage on AVX512_BF16 targets: Q.K and P.V as bf16 products with fp32 accumulation
/// (VDPBF16PS, two products per lane per instruction), the way GPU tensor-core kernels compute
/// them: the query and the softmax weights are rounded to bf16 (relative error <= 2^-9 each).
/// Define RELOKV_NO_BF16_DOT to keep fp32 queries and weights (half the throughput).
#if RELOKV_HOST_SIMD && defined(__AVX512F__) && defined(__AVX512BF16__) && \
    !defined(RELOKV_NO_BF16_DOT)
#define RELOKV_HOST_BF16_DOT 1
#else
#define RELOKV_HOST_BF16_DOT 0
#endif

#if RELOKV_HOST_SIMD
#include <immintrin.h>

RELOKV_NAMESPACE_BEGIN
namespace detail::simd {

#if defined(__AVX512F__)
inline constexpr int kLanes = 16;
#else
inline constexpr int kLanes = 8;
#endif
/// Vector registers the kernels may hold accumulators in (half the register file).
inline constexpr int kAccRegs = kLanes;

typedef float vf __attribute__((vector_size(4 * kLanes)));
typedef std::int32_t vi __attribute__((vector_size(4 * kLanes)));
typedef std::uint32_t vu __attribute__((vector_size(4 * kLanes)));
/// Unaligned, aliasing views for loads and stores from plain arrays.
typedef float vfu __attribute__((vector_size(4 * kLanes), aligned(4), may_alias));
typedef std::uint16_t vhu __attribute__((vector_size(2 * kLanes), aligned(2), may_alias));
typedef std::int32_t viu __attribute__((vector_size(4 * kLanes), aligned(4), may_alias));

#if defined(__AVX512F__)
/// The AVX-512 kernels' names for the same types (16 lanes).
typedef vf vf16;
typedef vi vi16;
typedef vu vu16;
typedef vfu vf16u;
typedef vhu vh16u;
typedef viu vi16u;
#endif

#define RELOKV_VLOAD(p) (*reinterpret_cast<const ::relokv::detail::simd::vfu*>(p))
#define RELOKV_VSTORE(p, v) (*reinterpret_cast<::relokv::detail::simd::vfu*>(p) = (v))

/// kLanes bf16 values (raw bits) to fp32.
RELOKV_ALWAYS_INLINE inline void load_bf16(vf& out, const std::uint16_t* p) {
  const vu w = __builtin_convertvector(*reinterpret_cast<const vhu*>(p), vu) << 16;
  out = __builtin_bit_cast(vf, w);
}

/// One level of a kLanes x kLanes transpose, which exchanges bit S of the row index with bit
/// S of the lane index between rows a (bit S clear) and b (bit S set): swap_lo is a's new row,
/// swap_hi is b's.
template <int S, std::size_t... I>
RELOKV_ALWAYS_INLINE inline void swap_lo(vf& out, const vf& a, const vf& b,
                                         std::index_sequence<I...>) {
  out = __builtin_shufflevector(a, b, ((I & S) != 0 ? kLanes + int(I) - S : int(I))...);
}
template <int S, std::size_t... I>
RELOKV_ALWAYS_INLINE inline void swap_hi(vf& out, const vf& a, const vf& b,
                                         std::index_sequence<I...>) {
  out = __builtin_shufflevector(a, b, ((I & S) != 0 ? kLanes + int(I) : int(I) + S)...);
}

/// Level S of the transpose over all kLanes rows, in place.
template <int S>
RELOKV_ALWAYS_INLINE inline void transpose_level(vf (&r)[kLanes]) {
  constexpr auto lanes = std::make_index_sequence<kLanes>{};
  for (int i = 0; i < kLanes; ++i) {
    if ((i & S) != 0) continue;
    const vf a = r[i], b = r[i + S];
    swap_lo<S>(r[i], a, b, lanes);
    swap_hi<S>(r[i + S], a, b, lanes);
  }
}

/// In-place transpose of kLanes rows of kLanes lanes.
RELOKV_ALWAYS_INLINE inline void transpose(vf (&r)[kLanes]) {
  transpose_level<1>(r);
  transpose_level<2>(r);
  transpose_level<4>(r);
  if constexpr (kLanes == 16) transpose_level<8>(r);
}
#if defined(__AVX512F__)
RELOKV_ALWAYS_INLINE inline void transpose16(vf16 (&r)[16]) { transpose(r); }
#endif

/// Lane-wise combinations for the reductions: out = op(a, b).
struct add_op {
  RELOKV_ALWAYS_INLINE void operator()(vf& out, const vf& a, const vf& b) const { out = a + b; }
};
struct max_op {
  RELOKV_ALWAYS_INLINE void operator()(vf& out, const vf& a, const vf& b) const {
    out = a > b ? a : b;  // vmaxps
  }
};

/// Level S of a transpose_reduce: out = op(swap_lo(a, b), swap_hi(a, b)).
template <int S, class Op>
RELOKV_ALWAYS_INLINE inline void reduce_level(vf& out, const vf& a, const vf& b, Op op) {
  constexpr auto lanes = std::make_index_sequence<kLanes>{};
  vf lo, hi;
  swap_lo<S>(lo, a, b, lanes);
  swap_hi<S>(hi, a, b, lanes);
  op(out, lo, hi);
}

/// op over each of kLanes vectors into one lane each: out[j] = op(a[j][0], a[j][1], ...). The
/// transpose's levels, combining the two halves of each swap instead of keeping both: each
/// level halves the number of vectors and doubles the number of rows a vector holds partial
/// results for.
template <class Op>
RELOKV_ALWAYS_INLINE inline void transpose_reduce(const vf* a, vf& out, Op op) {
  vf l1[kLanes / 2], l2[kLanes / 4], l3[2];
  for (int i = 0; i < kLanes / 2; ++i) reduce_level<1>(l1[i], a[2 * i], a[2 * i + 1], op);
  for (int i = 0; i < kLanes / 4; ++i) reduce_level<2>(l2[i], l1[2 * i], l1[2 * i + 1], op);
  if constexpr (kLanes == 16) {
    for (int i = 0; i < 2; ++i) reduce_level<4>(l3[i], l2[2 * i], l2[2 * i + 1], op);
    reduce_level<8>(out, l3[0], l3[1], op);
  } else {
    reduce_level<4>(out, l2[0], l2[1], op);
  }
}

/// Sum of each of kLanes vectors into one lane each: out[j] = sum(a[j]).
RELOKV_ALWAYS_INLINE inline void transpose_sum(const vf* a, vf& out) {
  transpose_reduce(a, out, add_op{});
}

/// x with lane i taken from lane i ^ S.
template <int S, std::size_t... I>
RELOKV_ALWAYS_INLINE inline void swap_by(vf& out, const vf& x, std::index_sequence<I...>) {
  out = __builtin_shufflevector(x, x, int(I ^ S)...);
}

/// op over all lanes (log-step reduction; GCC 12's AVX-512 reduce and max intrinsics draw
/// -Wmaybe-uninitialized through _mm512_undefined_ps).
template <class Op>
RELOKV_ALWAYS_INLINE inline float reduce(const vf& v, Op op) {
  constexpr auto lanes = std::make_index_sequence<kLanes>{};
  vf x = v, s;
  if constexpr (kLanes == 16) {
    swap_by<8>(s, x, lanes);
    op(x, x, s);
  }
  swap_by<4>(s, x, lanes);
  op(x, x, s);
  swap_by<2>(s, x, lanes);
  op(x, x, s);
  swap_by<1>(s, x, lanes);
  op(x, x, s);
  return x[0];
}

/// All ones in lanes [first, live), zeros elsewhere (first > 0: a window cuts the chunk).
RELOKV_ALWAYS_INLINE inline void live_lanes(vi& out, int live, int first = 0) {
  vi lane;
  for (int i = 0; i < kLanes; ++i) lane[i] = i;
  out = (lane < live) & (lane >= first);
}

#if defined(__AVX512F__)
/// The same as a lane mask.
RELOKV_ALWAYS_INLINE inline __mmask16 live_mask(int live, int first) {
  return static_cast<__mmask16>(((1u << live) - 1u) & ~((1u << first) - 1u));
}
#endif

/// The largest of lanes [first, live) (0 <= first < live <= kLanes).
RELOKV_ALWAYS_INLINE inline float live_max(const vf& x, int live, int first = 0) {
#if defined(__AVX512F__)
  const vf y = _mm512_mask_blend_ps(live_mask(live, first), _mm512_set1_ps(-__builtin_inff()), x);
#else
  vi keep;
  live_lanes(keep, live, first);
  const vf y = keep != 0 ? x : vf{} - __builtin_inff();
#endif
  return reduce(y, max_op{});
}

/// The sum of all lanes.
RELOKV_ALWAYS_INLINE inline float sum(const vf& x) { return reduce(x, add_op{}); }

/// Zeroes the lanes outside [first, live).
RELOKV_ALWAYS_INLINE inline void live_only(vf& x, int live, int first = 0) {
#if defined(__AVX512F__)
  x = _mm512_maskz_mov_ps(live_mask(live, first), x);
#else
  vi keep;
  live_lanes(keep, live, first);
  x = __builtin_bit_cast(vf, __builtin_bit_cast(vi, x) & keep);
#endif
}

/// x = e^x lane-wise for x <= 0; see detail::exp_nonpositive for the method and accuracy.
RELOKV_ALWAYS_INLINE inline void exp_nonpositive(vf& x) {
  const vf lo = vf{} - 87.0f;
  const vf xc = lo > x ? lo : x;  // vmaxps; NaN stays NaN
  const vf t = xc * 1.44269504088896341f - 0.5f;
  const vi n = __builtin_convertvector(t, vi);  // truncation == round-to-nearest here
  const vf fn = __builtin_convertvector(n, vf);
  vf r = xc - fn * 0.693145751953125f;
  r = r - fn * 1.428606765330187045e-06f;
  vf p = r * (1.0f / 720.0f) + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vi e = (n + 127) << 23;
  x = p * __builtin_bit_cast(vf, e);
}

}  // namespace detail::simd
RELOKV_NAMESPACE_END
#endif
