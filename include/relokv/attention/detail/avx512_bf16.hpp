#pragma once
/// @file
/// The AVX512_BF16 path: bf16 products with fp32 sums (VDPBF16PS), decode in spans of up to
/// 64 slots, at_attention keys rotated by their slot offset with bf16 (cos, sin) pairs.
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
  for (int j0 = 0; j0 < bh.valid; j0 += 16) {
    const int vc = bh.valid - j0 < 16 ? bh.valid - j0 : 16;
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
      corrs[g] = softmax_step(x, vc, bh.mx[qh]);
      std::uint16_t* pb = pbs + 16 * g;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb),
                          __builtin_bit_cast(__m256i, _mm512_cvtneps_pbh(x)));
      // The sum of the weights as rounded, so that the normalized weights sum to one.
      load_bf16(x, pb);
      bh.sum[qh] = bh.sum[qh] * corrs[g] + simd::sum(x);
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

/// Decode on the bf16 path works on spans of up to kSpanChunks chunks of at most 16 slots (from
/// one or more blocks): the online-softmax step, a chain of dependent reductions and an exp
/// per query head, runs once per span instead of once per chunk, and the P.V accumulators stay
/// in registers over the span and are folded into the running state once. Keys are read chunk
/// by chunk for all the call's KV heads (memory order), values head by head from L2, where
/// they were prefetched while the keys were scored.
inline constexpr int kSpanChunks = 4;

static_assert(kSpanChunks <= prefetch_cursor::kMaxRanges,
              "a span's values, or the next span's keys, are one prefetch range per chunk");

/// `rows` query rows (scaled, [rows][D] from q) as bf16 into dst, rotated by qc/qs when set
/// (see load_query_rows; the rotation rows are loaded once for all rows).
template <int DC>
void bf16_query_rows(int rows, const float* q, const float* qc, const float* qs, rope_layout layout,
                     std::uint16_t* dst, prefetch_cursor& pf) {
  using simd::vf16;
  constexpr int D = 16 * DC;
  const auto store = [&](int r, const vf16(&v)[DC]) {
    for (int cb = 0; cb < DC / 2; ++cb)
      _mm512_storeu_si512(
          dst + r * D + 32 * cb,
          __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(v[2 * cb + 1], v[2 * cb])));
  };
  if (qc != nullptr && layout == rope_layout::kNeoX) {
    vf16 C[DC / 2], S[DC / 2];
    for (int c = 0; c < DC / 2; ++c) {
      C[c] = RELOKV_VLOAD(qc + 16 * c);
      S[c] = RELOKV_VLOAD(qs + 16 * c);
    }
    for (int r = 0; r < rows; ++r) {
      pf.advance();
      const float* qg = q + r * D;
      vf16 v[DC];
      for (int c = 0; c < DC / 2; ++c) {
        const vf16 x1 = RELOKV_VLOAD(qg + 16 * c), x2 = RELOKV_VLOAD(qg + 16 * (c + DC / 2));
        v[c] = x1 * C[c] - x2 * S[c];
        v[c + DC / 2] = x1 * S[c] + x2 * C[c];
      }
      store(r, v);
    }
  } else {
    for (int r = 0; r < rows; ++r) {
      pf.advance();
      vf16 v[DC];
      load_query_rows<DC>(q + r * D, qc, qs, layout, v);
      store(r, v);
    }
  }
}

/// The keys of one chunk (vc visible rows of each of nr <= kRotHeads heads, the first at kb,
/// the next tile_elems further) rotated by their slots' R(j) into dst ([nr][16][D]); four
/// slots at a time, one prefetch step per head and four slots (rot_steps of bf16_decode_spans).
template <int DC>
void rotate_span_keys(const std::uint16_t* kb, std::ptrdiff_t tile_elems, int nr, int vc,
                      const std::uint32_t* krot, std::uint16_t* dst, prefetch_cursor& pf) {
  constexpr int D = 16 * DC, DB = DC / 2;
  static_assert(kRotHeads == 2, "rotate_span_keys handles one or two heads");
  for (int j = 0; j < 16; j += 4) {
    for (int h = 0; h < nr; ++h) pf.advance();
    if (j >= vc) continue;
    const int n = vc - j < 4 ? vc - j : 4;
    const std::uint32_t* tab = krot + static_cast<std::size_t>(j) * DB * 32;
    if (nr == 2) {
      rotate_keys_bf16<DC, 2>(kb + j * D, n, tab, dst + j * D, tile_elems, 16 * D);
    } else {
      rotate_keys_bf16<DC, 1>(kb + j * D, n, tab, dst + j * D);
    }
  }
}

/// Scores of one chunk of keys (kb: 16 rows, at_attention's already rotated by their slots'
/// R(j), see rotate_span_keys) for the G query heads of one KV head: qb holds their bf16 rows
/// ([G][D]), score row g goes to sc + g * SL (16 lanes; lanes past the chunk's visible slots
/// hold anything).
template <int DC>
void bf16_span_scores(const std::uint16_t* kb, const std::uint16_t* qb16, float* sc, int G,
                      prefetch_cursor& pf) {
  using namespace simd;
  constexpr int D = 16 * DC, DB = DC / 2, SL = 16 * kSpanChunks;
  for (int g = 0; g < G; ++g) {
    pf.advance();
    __m512bh qb[DB];
    for (int cb = 0; cb < DB; ++cb)
      qb[cb] = __builtin_bit_cast(__m512bh, _mm512_loadu_si512(qb16 + g * D + 32 * cb));
    const auto kload = [&](int j, int cb) {
      return __builtin_bit_cast(__m512bh, _mm512_loadu_si512(kb + j * D + 32 * cb));
    };
    // Key rows in address order (each row's DB loads in turn); sixteen independent chains
    // keep the dot-product units busy.
    vf16 part[16];
    for (int j = 0; j < 16; ++j) {
      part[j] = _mm512_dpbf16_ps(vf16{}, kload(j, 0), qb[0]);
      for (int cb = 1; cb < DB; ++cb) part[j] = _mm512_dpbf16_ps(part[j], kload(j, cb), qb[cb]);
    }
    vf16 x;
    transpose_sum(part, x);
    RELOKV_VSTORE(sc + g * SL, x);
  }
}

/// One softmax step over a span for `rows` query heads: scores sc ([rows][SL], lanes past
/// vcs[c] of chunk c dead, possibly garbage: left out of the max, weight 0), state mx/sum
/// ([rows]); the weights go to pbs ([rows][SL], bf16), the corrections to corr ([rows]).
/// Sixteen rows at a time: their maxima and sums are reduced together by a transpose and
/// their corrections are one vector exp, so no row waits on its own chain of reductions.
inline void bf16_span_softmax(int rows, int n, const int* vcs, const float* sc, float* mx,
                              float* sum, std::uint16_t* pbs, float* corr, prefetch_cursor& pf) {
  using namespace simd;
  constexpr int SL = 16 * kSpanChunks;
  const vf16 ninf = vf16{} - __builtin_inff();
  const auto vmax = [](const vf16& a, const vf16& b) { return a > b ? a : b; };
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const int nr = rows - r0 < 16 ? rows - r0 : 16;
    const auto live_rows = static_cast<__mmask16>((1u << nr) - 1u);
    vf16 part[16];
    for (int i = 0; i < 16; ++i) {
      part[i] = ninf;
      if (i >= nr) continue;
      const float* xs = sc + (r0 + i) * SL;
      for (int c = 0; c < n; ++c) {
        const auto live = static_cast<__mmask16>((1u << vcs[c]) - 1u);
        part[i] = vmax(part[i], _mm512_mask_blend_ps(live, ninf, RELOKV_VLOAD(xs + 16 * c)));
      }
    }
    vf16 bmax;
    transpose_reduce(part, bmax, simd::max_op{});
    const vf16 m_old = _mm512_mask_loadu_ps(ninf, live_rows, mx + r0);
    const vf16 m_new = vmax(m_old, bmax);
    vf16 cr = m_old - m_new;
    exp_nonpositive(cr);  // 0 on the first span
    alignas(64) float mrow[16];
    RELOKV_VSTORE(mrow, m_new);
    for (int i = 0; i < 16; ++i) {
      part[i] = vf16{};
      if (i >= nr) continue;
      pf.advance();
      const float* xs = sc + (r0 + i) * SL;
      for (int c = 0; c < n; ++c) {
        vf16 x = RELOKV_VLOAD(xs + 16 * c) - mrow[i];
        exp_nonpositive(x);
        live_only(x, vcs[c]);
        std::uint16_t* pb = pbs + (r0 + i) * SL + 16 * c;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb),
                            __builtin_bit_cast(__m256i, _mm512_cvtneps_pbh(x)));
        load_bf16(x, pb);  // the weights as rounded, so that the normalized weights sum to one
        part[i] += x;
      }
    }
    vf16 bsum;
    transpose_sum(part, bsum);
    const vf16 s_old = _mm512_maskz_loadu_ps(live_rows, sum + r0);
    _mm512_mask_storeu_ps(sum + r0, live_rows, s_old * cr + bsum);
    _mm512_mask_storeu_ps(mx + r0, live_rows, m_new);
    _mm512_mask_storeu_ps(corr + r0, live_rows, cr);
  }
}

/// P.V of a span for the G query heads of one KV head, HP heads at a time, as in
/// bf16_block_head: slots t and t + 1 interleaved per dimension in registers (a missing
/// partner is zero); the products start from zero, stay in registers over the span's n chunks
/// (v[c]: chunk c's first value row, vcs[c] visible slots) and are folded into acc ([G][D],
/// bf16_acc_index order) as acc * corr[g] + P.V. pw: the weights ([G][SL]).
template <int DC>
void bf16_span_pv(int n, const std::uint16_t* const* v, const int* vcs, const std::uint16_t* pw,
                  const float* corr, float* acc_g, int G, prefetch_cursor& pf) {
  using namespace simd;
  constexpr int D = 16 * DC, SL = 16 * kSpanChunks;
  constexpr int HP = bf16_pv_heads(DC);
  const auto pv = [&](int g0, auto heads) {
    constexpr int N = decltype(heads)::value;
    vf16 a[N][DC];
    for (int gi = 0; gi < N; ++gi)
      for (int c = 0; c < DC; ++c) a[gi][c] = vf16{};
    const auto step = [&](const std::uint16_t* vb, const std::uint16_t* pc, int t, bool pair) {
      pf.advance();
      bf16_pv_step<DC, N>(vb + t * D, pair, pc + g0 * SL + t, SL, a);
    };
    for (int c = 0; c < n; ++c) {
      const int vc = vcs[c];
      int t = 0;
      for (; t + 1 < vc; t += 2) step(v[c], pw + 16 * c, t, true);
      if (t < vc) step(v[c], pw + 16 * c, t, false);
    }
    for (int gi = 0; gi < N; ++gi) {
      float* acc = acc_g + static_cast<std::size_t>(g0 + gi) * D;
      const float f = corr[g0 + gi];
      for (int c = 0; c < DC; ++c)
        RELOKV_VSTORE(acc + 16 * c, RELOKV_VLOAD(acc + 16 * c) * f + a[gi][c]);
    }
  };
  int g0 = 0;
  for (; g0 + HP <= G; g0 += HP) pv(g0, std::integral_constant<int, HP>{});
  for (; g0 < G; ++g0) pv(g0, std::integral_constant<int, 1>{});
}

/// Decode of one query over a sequence's blocks on the bf16 path, in spans (kSpanChunks) for
/// the KV heads [h_begin, h_end). query_angles(bi, pos0, m) leaves R(m - pos0) in w.cs/w.sn
/// (attend_group's decode chain); the query's scaled rows are w.qrot (rotated at m for
/// pre_rotated, in bf16_acc_index order for rot_bf16), its state w.acc/w.mx/w.sum.
template <class P, class Angles>
void bf16_decode_spans(const paged_kv_view<const bf16>& kv, const block_entry* blocks,
                       std::int32_t num_blocks, pos_t mq, int G, int h_begin, int h_end,
                       rope_layout layout, int pairs, bool rot_bf16, Angles&& query_angles,
                       attention_scratch& w) {
  const int D = kv.head_dim, nh = h_end - h_begin;
  if (nh <= 0) return;
  constexpr int SL = 16 * kSpanChunks;
  const auto hd = static_cast<std::size_t>(D);
  constexpr bool rotates_q = P::kind != placement_kind::kPreRotated;
  const rope_layout qlayout = rot_bf16 ? rope_layout::kNeoX : layout;
  w.span_qc.resize(kSpanChunks * hd);
  w.span_qs.resize(kSpanChunks * hd);
  w.span_sc.resize(static_cast<std::size_t>(nh * G) * SL);
  w.wb16.resize(w.span_sc.size());
  w.qb16.resize(static_cast<std::size_t>(nh * G) * hd);
  w.corr.resize(static_cast<std::size_t>(nh * G));
  const auto kp = [&](block_id b, int h, int j0) {
    return reinterpret_cast<const std::uint16_t*>(kv.k(b, h)) + static_cast<std::ptrdiff_t>(j0) * D;
  };
  const auto vp = [&](block_id b, int h, int j0) {
    return reinterpret_cast<const std::uint16_t*>(kv.v(b, h)) + static_cast<std::ptrdiff_t>(j0) * D;
  };
  // The keys (or values) of a chunk for all heads of the call: one range in memory.
  const std::ptrdiff_t tile = kv.tile_elems() * static_cast<std::ptrdiff_t>(sizeof(bf16));
  const auto heads_bytes = [&](int vc) {
    return (nh - 1) * tile + static_cast<std::ptrdiff_t>(vc) * D * std::ptrdiff_t{2};
  };
  int n = 0;
  block_id cblock[kSpanChunks] = {};
  int cj0[kSpanChunks] = {}, cvc[kSpanChunks] = {};
  bool new_q[kSpanChunks] = {};
  // Computes the span for every head: the scores of each chunk for all heads (keys in memory
  // order), one softmax step for all query rows (independent chains, so they overlap), then
  // P.V head by head. (next_bi, next_j0): where the next span starts; its keys and values
  // stream in meanwhile.
  const auto run = [&](std::int32_t next_bi, int next_j0) {
    // While the keys are scored, this span's values stream in; while the values are summed,
    // the next span's keys.
    prefetch_cursor pf, pf2;
    for (int c = 0; c < n; ++c) pf.add(vp(cblock[c], h_begin, cj0[c]), heads_bytes(cvc[c]));
    for (std::int32_t b = next_bi, j = next_j0, k = 0; b < num_blocks && k < kSpanChunks;
         ++b, j = 0)
      for (const int valid = visible_slots(blocks[b], mq); j < valid && k < kSpanChunks;
           j += 16, ++k)
        pf2.add(kp(blocks[b].block, h_begin, j), heads_bytes(std::min(16, valid - j)));
    const int HP = bf16_pv_heads(D / 16);
    int npairs = 0;
    for (int c = 0; c < n; ++c) npairs += (cvc[c] + 1) / 2;
    int nq = 0;
    for (int c = 0; c < n; ++c) nq += new_q[c] ? 1 : 0;
    // Steps that advance each: query rows, key rotations and scores; softmax rows and P.V
    // pairs.
    constexpr int rot_steps = P::kind == placement_kind::kAtAttention ? 4 : 0;
    pf.spread(std::int64_t{nh} * (G * (n + nq) + rot_steps * n));
    pf2.spread(std::int64_t{nh} * (G + (G / HP + G % HP) * npairs));
    for (int c = 0; c < n; ++c) {
      if (new_q[c]) {  // the query rows of every head, rotated for this block, as bf16
        const float* qc = rotates_q ? w.span_qc.data() + static_cast<std::size_t>(c) * hd : nullptr;
        const float* qs = w.span_qs.data() + static_cast<std::size_t>(c) * hd;
        with_chunks(D, [&](auto dc) {
          bf16_query_rows<decltype(dc)::value>(
              nh * G, w.qrot.data() + static_cast<std::size_t>(h_begin * G) * hd, qc, qs, qlayout,
              w.qb16.data(), pf);
        });
      }
      for (int h0 = h_begin; h0 < h_end; h0 += kRotHeads) {
        const int nr = std::min(kRotHeads, h_end - h0);
        with_chunks(D, [&](auto dc) {
          constexpr int DC = decltype(dc)::value;
          const std::uint16_t* keys = kp(cblock[c], h0, cj0[c]);
          std::ptrdiff_t stride = kv.tile_elems();
          if constexpr (P::kind == placement_kind::kAtAttention) {
            // rows past the visible ones hold stale data; their scores are masked later
            rotate_span_keys<DC>(keys, stride, nr, cvc[c],
                                 w.krot.data() + static_cast<std::size_t>(cj0[c]) * (DC / 2) * 32,
                                 w.kb16.data(), pf);
            keys = w.kb16.data();
            stride = 16 * D;
          }
          for (int i = 0; i < nr; ++i) {
            const int r = (h0 + i - h_begin) * G;
            bf16_span_scores<DC>(
                keys + i * stride, w.qb16.data() + static_cast<std::size_t>(r) * hd,
                w.span_sc.data() + static_cast<std::size_t>(r) * SL + 16 * c, G, pf);
          }
        });
      }
    }
    pf.finish();
    bf16_span_softmax(nh * G, n, cvc, w.span_sc.data(), w.mx.data() + h_begin * G,
                      w.sum.data() + h_begin * G, w.wb16.data(), w.corr.data(), pf2);
    const std::uint16_t* vrow[kSpanChunks] = {};
    for (int h = h_begin; h < h_end; ++h) {
      const int r = (h - h_begin) * G;
      for (int c = 0; c < n; ++c) vrow[c] = vp(cblock[c], h, cj0[c]);
      with_chunks(D, [&](auto dc) {
        bf16_span_pv<decltype(dc)::value>(
            n, vrow, cvc, w.wb16.data() + static_cast<std::size_t>(r) * SL, w.corr.data() + r,
            w.acc.data() + static_cast<std::size_t>(h * G) * hd, G, pf2);
      });
    }
    pf2.finish();
    n = 0;
  };
  for (std::int32_t bi = 0; bi < num_blocks; ++bi) {
    const block_entry e = blocks[bi];
    const int valid = visible_slots(e, mq);
    for (int j0 = 0; j0 < valid; j0 += 16) {
      if (n == kSpanChunks) run(bi, j0);
      const int c = n++;
      cblock[c] = e.block;
      cj0[c] = j0;
      cvc[c] = std::min(16, valid - j0);
      new_q[c] = c == 0 || (rotates_q && j0 == 0);
      if constexpr (rotates_q) {
        // w.cs/w.sn keep R(m - pos0) of the current block from its first chunk on; only a
        // chunk that rotates the query rows (new_q) needs them in its own row.
        if (j0 == 0) query_angles(bi, e.pos0, mq);
        if (new_q[c]) {
          float* rc = w.span_qc.data() + static_cast<std::size_t>(c) * hd;
          float* rs = w.span_qs.data() + static_cast<std::size_t>(c) * hd;
          if (rot_bf16) {
            to_acc_order(pairs, w.cs.data(), rc);
            to_acc_order(pairs, w.sn.data(), rs);
          } else if (layout == rope_layout::kNeoX) {
            std::copy(w.cs.begin(), w.cs.begin() + pairs, rc);
            std::copy(w.sn.begin(), w.sn.begin() + pairs, rs);
          } else {
            expand_rotation(layout, pairs, D, w.cs.data(), w.sn.data(), rc, rs);
          }
        }
      }
    }
  }
  if (n > 0) run(num_blocks, 0);
}

/// The rotations R(j) of a block's slots j < bs (times the magnitude factor) as
/// rotate_keys_bf16 reads them: for slot j and each group of 16 pairs in bf16_acc_index order
/// of the head's first half (the order the key's 16-bit unpacks leave its pairs in), 16
/// (cos, -sin) then 16 (sin, cos) bf16 pairs, the first of each in the low half. jcos/jsin:
/// [bs][pairs] unit rotations; out: [bs][2 * pairs]. Built once per call: at_attention's keys
/// are rotated by their offset in the block, the query by the block's position
/// (R(m) q . R(pos0 + j) k = R(m - pos0) q . R(j) k).
inline void build_slot_rotations_bf16(int bs, int pairs, float mag, const float* jcos,
                                      const float* jsin, std::uint32_t* out) {
  using simd::vf16;
  // Word l of the low vector next to word l of the high one: (lo_l, hi_l) in dword l.
  alignas(64) std::uint16_t idx[32];
  for (int l = 0; l < 16; ++l) {
    idx[2 * l] = static_cast<std::uint16_t>(l);
    idx[2 * l + 1] = static_cast<std::uint16_t>(16 + l);
  }
  const __m512i interleave = _mm512_load_si512(idx);
  const auto pairs_of = [&](const vf16& lo, const vf16& hi) {
    return _mm512_permutexvar_epi16(interleave,
                                    __builtin_bit_cast(__m512i, _mm512_cvtne2ps_pbh(hi, lo)));
  };
  for (int j = 0; j < bs; ++j)
    for (int u = 0; u < pairs / 16; ++u) {
      alignas(64) float c[16], sn[16];
      for (int l = 0; l < 16; ++l) {
        const std::size_t i = static_cast<std::size_t>(j * pairs + bf16_acc_dim(16 * u + l));
        c[l] = mag * jcos[i];
        sn[l] = mag * jsin[i];
      }
      const vf16 C = RELOKV_VLOAD(c), S = RELOKV_VLOAD(sn);
      std::uint32_t* dst = out + static_cast<std::size_t>(2 * j * pairs + 32 * u);
      _mm512_storeu_si512(dst, pairs_of(C, -S));
      _mm512_storeu_si512(dst + 16, pairs_of(S, C));
    }
}

/// The AVX512_BF16 path as attend_group's dispatch tag (bf16 storage, the fast path's shapes):
/// VDPBF16PS products with fp32 sums, accumulators in bf16_acc_index order, decode in spans.
struct avx512_bf16_path {
  static constexpr bool kSimd = true;
  static constexpr bool kBf16Dot = true;
  template <class P>
  static void block_head(const block_head_t<bf16>& bh, attention_scratch& w) {
    with_chunks(bh.D, [&](auto dc) { bf16_block_head<decltype(dc)::value, P>(bh, w); });
  }
  /// Prefill's rows that see a block-head at once: the fp32 path's group kernel, the block's
  /// keys and values converted once per block and head and shared by every row.
  template <class P>
  static void group(const block_head_t<bf16>& bh, group_row* rows, int n, attention_scratch& w) {
    simd_f32_path::group<P>(bh, rows, n, w);
  }
  template <class P, class... Args>
  static void decode_spans(Args&&... args) {
    bf16_decode_spans<P>(std::forward<Args>(args)...);
  }
  static int acc_index(int d) { return bf16_acc_index(d); }
  static void acc_order(int n, const float* src, float* dst) { to_acc_order(n, src, dst); }
  static void slot_rotations(int bs, int pairs, float mag, const float* jcos, const float* jsin,
                             std::uint32_t* out) {
    build_slot_rotations_bf16(bs, pairs, mag, jcos, jsin, out);
  }
};
#endif
#endif  // RELOKV_HOST_SIMD

}  // namespace detail
RELOKV_NAMESPACE_END
