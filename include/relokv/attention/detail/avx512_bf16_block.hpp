#pragma once
/// @file
/// The AVX512_BF16 path's block kernel: one block of bf16 keys and values against a group of
/// query heads with VDPBF16PS (fp32 sums), keys rotated at attention by bf16 (cos, sin) pairs,
/// accumulators in bf16_acc_index order. detail/avx512_bf16.hpp adds decode in spans and the
/// dispatch tag.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "relokv/attention/detail/kernel_common.hpp"
#include "relokv/attention/detail/prefetch.hpp"
#include "relokv/attention/detail/simd.hpp"
#include "relokv/attention/detail/simd_f32.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

#if RELOKV_HOST_SIMD
#if RELOKV_HOST_BF16_DOT
/// Accumulator layout of bf16_block_head. P.V pairs two slots per fp32 lane: VDPBF16PS adds
/// a[2i] b[2i] + a[2i+1] b[2i+1] into lane i, so the two slots' values of one dimension must be
/// adjacent, which the 128-bit-lane unpacks give in this order: within each 32-dimension chunk,
/// lane 4L + k of the first half holds dimension 8L + k and of the second half 8L + 4 + k.
/// Returns the accumulator index of dimension d.
constexpr int bf16_acc_index(int d) {
  const int chunk = d / 32, r = d % 32, L = r / 8, k = r % 8;
  return 32 * chunk + (k < 4 ? 4 * L + k : 16 + 4 * L + (k - 4));
}

/// The inverse: the dimension held at accumulator index p.
constexpr int bf16_acc_dim(int p) {
  const int chunk = p / 32, half = (p % 32) / 16, q = p % 16;
  return 32 * chunk + 8 * (q / 4) + 4 * half + q % 4;
}

/// Keys 0 .. vc - 1 of src rotated by their slots' R(j) into dst (at_attention on the bf16
/// path, NeoX over the whole head), as bf16 products: dimension i and its partner i + D/2 are
/// paired in one fp32 lane by a 16-bit unpack, so that VDPBF16PS with the pair (cos, -sin)
/// gives rotated dimension i and with (sin, cos) dimension i + D/2. The unpacks leave the
/// rotated row in bf16_acc_index order, in which the query rows are too (a dot product does
/// not mind the order as long as both agree). tab: the first slot's row of
/// build_slot_rotations_bf16.
template <int DC, int NH = 1>
RELOKV_ALWAYS_INLINE inline void rotate_keys_bf16(const std::uint16_t* src0, int vc,
                                                  const std::uint32_t* tab0, std::uint16_t* dst0,
                                                  std::ptrdiff_t src_head = 0,
                                                  std::ptrdiff_t dst_head = 0) {
  using simd::vf16;
  constexpr int D = 16 * DC, DB = DC / 2, HB = DB / 2;  // HB: 32-element chunks per half
  const auto store_pair = [](std::uint16_t* dst, const vf16& lo, const vf16& hi) {
    _mm512_storeu_si512(dst, __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));
  };
  for (int j = 0; j < vc; ++j) {
    const std::uint32_t* tab = tab0 + static_cast<std::size_t>(j) * DB * 32;
    for (int cb = 0; cb < HB; ++cb) {
      // Group u of 16 pairs: (cos, -sin) at tab + 32 u, (sin, cos) at tab + 32 u + 16; loaded
      // once for the NH heads' keys of this slot.
      const auto t = [&](int u, int part) {
        return __builtin_bit_cast(__m512bh, _mm512_loadu_si512(tab + 32 * u + 16 * part));
      };
      const __m512bh c_lo = t(2 * cb, 0), c_hi = t(2 * cb + 1, 0);
      const __m512bh s_lo = t(2 * cb, 1), s_hi = t(2 * cb + 1, 1);
      for (int h = 0; h < NH; ++h) {
        const std::uint16_t* src = src0 + h * src_head + j * D;
        std::uint16_t* dst = dst0 + h * dst_head + j * D;
        const __m512i a = _mm512_loadu_si512(src + 32 * cb);
        const __m512i b = _mm512_loadu_si512(src + 32 * (cb + HB));
        const auto lo = __builtin_bit_cast(__m512bh, _mm512_unpacklo_epi16(a, b));
        const auto hi = __builtin_bit_cast(__m512bh, _mm512_unpackhi_epi16(a, b));
        store_pair(dst + 32 * cb, _mm512_dpbf16_ps(vf16{}, lo, c_lo),
                   _mm512_dpbf16_ps(vf16{}, hi, c_hi));
        store_pair(dst + 32 * (cb + HB), _mm512_dpbf16_ps(vf16{}, lo, s_lo),
                   _mm512_dpbf16_ps(vf16{}, hi, s_hi));
      }
    }
  }
}

/// Query heads per P.V set of the bf16 kernels (HP * DC accumulators in registers).
constexpr int bf16_pv_heads(int DC) { return DC <= 4 ? 4 : DC <= 8 ? 2 : 1; }

/// One step of the bf16 kernels' P.V for N query heads: the values of slots t and t + 1 (row
/// vt, and vt + D when `pair`; else zero, so that garbage in an unused slot never meets a zero
/// weight) interleaved per dimension in registers (bf16_acc_index order), times each head's
/// pair of weights (head gi's at wt + gi * wstride), added into a[gi].
template <int DC, int N>
RELOKV_ALWAYS_INLINE inline void bf16_pv_step(const std::uint16_t* vt, bool pair,
                                              const std::uint16_t* wt, int wstride,
                                              simd::vf16 (&a)[N][DC]) {
  constexpr int D = 16 * DC;
  __m512bh pp[N];
  for (int gi = 0; gi < N; ++gi) {
    std::uint32_t wpair;
    std::memcpy(&wpair, wt + gi * wstride, sizeof wpair);
    pp[gi] = __builtin_bit_cast(__m512bh, _mm512_set1_epi32(static_cast<std::int32_t>(wpair)));
  }
  for (int cb = 0; cb < DC / 2; ++cb) {
    const __m512i v0 = _mm512_loadu_si512(vt + 32 * cb);
    const __m512i v1 = pair ? _mm512_loadu_si512(vt + D + 32 * cb) : _mm512_setzero_si512();
    const auto lo = __builtin_bit_cast(__m512bh, _mm512_unpacklo_epi16(v0, v1));
    const auto hi = __builtin_bit_cast(__m512bh, _mm512_unpackhi_epi16(v0, v1));
    for (int gi = 0; gi < N; ++gi) {
      a[gi][2 * cb] = _mm512_dpbf16_ps(a[gi][2 * cb], lo, pp[gi]);
      a[gi][2 * cb + 1] = _mm512_dpbf16_ps(a[gi][2 * cb + 1], hi, pp[gi]);
    }
  }
}

/// fast_block_head for bf16 storage with VDPBF16PS: keys and values are read as stored (no
/// conversion), the query and the softmax weights are rounded to bf16, accumulation is fp32.
/// bh.acc holds the online-softmax accumulators in bf16_acc_index order.
template <int DC, class P>
void bf16_block_head(const block_head_t<bf16>& bh, attention_scratch& w) {
  using namespace simd;
  constexpr int D = 16 * DC, DB = DC / 2;  // DB chunks of 32 bf16
  static_assert(DC % 4 == 0, "the fused key rotation packs pairs of chunks from each half");
  constexpr bool rotate_keys = P::kind == placement_kind::kAtAttention;
  const auto* kraw = reinterpret_cast<const std::uint16_t*>(bh.kt);
  const auto* vraw = reinterpret_cast<const std::uint16_t*>(bh.vt);
  const auto bh512 = [](const std::uint16_t* p) {
    return __builtin_bit_cast(__m512bh, _mm512_loadu_si512(p));
  };
  const auto store_pair = [](std::uint16_t* dst, const vf16& lo, const vf16& hi) {
    _mm512_storeu_si512(dst, __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));
  };
  constexpr int HP = bf16_pv_heads(DC);
  // One share per query head's scores and per slot pair of each set of heads in the P.V loop.
  prefetch_cursor pf(bh.pf, bh.pf_bytes, bh.G + 8 * (bh.G / HP + bh.G % HP));
  for (int j0 = bh.first / 16 * 16; j0 < bh.valid; j0 += 16) {
    const int vc = bh.valid - j0 < 16 ? bh.valid - j0 : 16;
    const int cut = bh.first > j0 ? bh.first - j0 : 0;  // lanes before a window's start
    const std::uint16_t* kb = kraw + j0 * D;
    if constexpr (rotate_keys) {
      std::uint16_t* dst0 = w.kb16.data();
      if (bh.krot != nullptr) {
        rotate_keys_bf16<DC>(kb, vc, bh.krot + static_cast<std::size_t>(j0) * DB * 32, dst0);
        kb = dst0;  // rows >= vc hold stale data; their scores are masked below
      } else {
        // Rotate the visible keys in fp32 and round them back to bf16.
        const bool fused = bh.layout == rope_layout::kNeoX && 2 * bh.pairs == D;
        for (int j = 0; j < vc; ++j) {
          const std::uint16_t* src = kraw + (j0 + j) * D;
          std::uint16_t* dst = dst0 + j * D;
          const float* cs = w.kcos.data() + static_cast<std::size_t>(j0 + j) * bh.pairs;
          const float* sn = w.ksin.data() + static_cast<std::size_t>(j0 + j) * bh.pairs;
          if (fused) {
            for (int c = 0; c < DC / 2; c += 2) {  // chunks c, c+1 and their partners
              vf16 x1a, x1b, x2a, x2b;
              load_bf16(x1a, src + 16 * c);
              load_bf16(x1b, src + 16 * (c + 1));
              load_bf16(x2a, src + 16 * (c + DC / 2));
              load_bf16(x2b, src + 16 * (c + 1 + DC / 2));
              const vf16 Ca = RELOKV_VLOAD(cs + 16 * c), Sa = RELOKV_VLOAD(sn + 16 * c);
              const vf16 Cb = RELOKV_VLOAD(cs + 16 * (c + 1)), Sb = RELOKV_VLOAD(sn + 16 * (c + 1));
              store_pair(dst + 16 * c, x1a * Ca - x2a * Sa, x1b * Cb - x2b * Sb);
              store_pair(dst + 16 * (c + DC / 2), x1a * Sa + x2a * Ca, x1b * Sb + x2b * Cb);
            }
          } else {
            float* row = w.kbuf.data();
            for (int c = 0; c < DC; ++c) {
              vf16 x;
              load_bf16(x, src + 16 * c);
              RELOKV_VSTORE(row + 16 * c, x);
            }
            rotate_inplace(row, bh.layout, bh.pairs, cs, sn);
            for (int c = 0; c < DC; c += 2) {
              const vf16 lo = RELOKV_VLOAD(row + 16 * c), hi = RELOKV_VLOAD(row + 16 * (c + 1));
              store_pair(dst + 16 * c, lo, hi);
            }
          }
        }
        kb = dst0;
      }
    }
    const int npairs = (vc + 1) / 2;
    // Scores and softmax steps of every query head first; the weights wait in scratch.
    std::uint16_t* pbs = w.wb16.data();
    float* corrs = w.corr.data();
    for (int g = 0; g < bh.G; ++g) {
      pf.advance();
      const std::size_t qh = static_cast<std::size_t>(bh.h * bh.G + g);
      __m512bh qb[DB];
      {
        vf16 qv[DC];
        load_query<DC>(bh, bh.qsrc + qh * D, qv);
        for (int cb = 0; cb < DB; ++cb) qb[cb] = _mm512_cvtne2ps_pbh(qv[2 * cb + 1], qv[2 * cb]);
      }
      vf16 part[16];
      for (int j = 0; j < 16; ++j) part[j] = _mm512_dpbf16_ps(vf16{}, bh512(kb + j * D), qb[0]);
      for (int cb = 1; cb < DB; ++cb)
        for (int j = 0; j < 16; ++j)
          part[j] = _mm512_dpbf16_ps(part[j], bh512(kb + j * D + 32 * cb), qb[cb]);
      vf16 x;
      transpose_sum(part, x);
      corrs[g] = softmax_step(x, vc, bh.sm.mx[qh], cut);
      std::uint16_t* pb = pbs + 16 * g;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb),
                          __builtin_bit_cast(__m256i, _mm512_cvtneps_pbh(x)));
      // The sum of the weights as rounded, so that the normalized weights sum to one.
      load_bf16(x, pb);
      bh.sm.fold(qh, corrs[g], simd::sum(x));
    }
    // P.V for HP heads at a time: the values of slots t and t+1 are interleaved per dimension
    // (bf16_acc_index order) in registers and serve every head of the set. A missing partner
    // slot is zero, so that garbage in unused slots never meets a zero weight. The products
    // start from zero and are folded into the rescaled accumulators at the end, which keeps
    // the correction (a scalar exp after the max) off the chain of dependent P.V steps. Heads
    // left over after the full sets go one at a time.
    const auto pv = [&](int g0, auto heads) {
      constexpr int N = decltype(heads)::value;
      vf16 a[N][DC];
      for (int gi = 0; gi < N; ++gi)
        for (int c = 0; c < DC; ++c) a[gi][c] = vf16{};
      for (int tp = 0; tp < npairs; ++tp) {
        pf.advance();
        const int t = 2 * tp;
        bf16_pv_step<DC, N>(vraw + (j0 + t) * D, t + 1 < vc, pbs + 16 * g0 + t, 16, a);
      }
      for (int gi = 0; gi < N; ++gi) {
        float* acc = bh.acc + static_cast<std::size_t>(bh.h * bh.G + g0 + gi) * D;
        for (int c = 0; c < DC; ++c)
          RELOKV_VSTORE(acc + 16 * c, RELOKV_VLOAD(acc + 16 * c) * corrs[g0 + gi] + a[gi][c]);
      }
    };
    int g0 = 0;
    for (; g0 + HP <= bh.G; g0 += HP) pv(g0, std::integral_constant<int, HP>{});
    for (; g0 < bh.G; ++g0) pv(g0, std::integral_constant<int, 1>{});
  }
  pf.finish();
}

/// dst[bf16_acc_index(i)] = src[i] for i < n (a multiple of 32), with two lane permutes per
/// 32 elements.
RELOKV_ALWAYS_INLINE inline void to_acc_order(int n, const float* src, float* dst) {
  alignas(64) static constexpr auto dims = [] {
    std::array<std::int32_t, 32> a{};
    for (int p = 0; p < 32; ++p) a[static_cast<std::size_t>(p)] = bf16_acc_dim(p);
    return a;
  }();
  const __m512i ilo = _mm512_load_si512(dims.data()), ihi = _mm512_load_si512(dims.data() + 16);
  for (int c = 0; c < n; c += 32) {
    const __m512 x0 = _mm512_loadu_ps(src + c), x1 = _mm512_loadu_ps(src + c + 16);
    _mm512_storeu_ps(dst + c, _mm512_permutex2var_ps(x0, ilo, x1));
    _mm512_storeu_ps(dst + c + 16, _mm512_permutex2var_ps(x0, ihi, x1));
  }
}
#endif
#endif  // RELOKV_HOST_SIMD

}  // namespace detail
RELOKV_NAMESPACE_END
