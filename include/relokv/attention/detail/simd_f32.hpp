#pragma once
/// @file
/// The SIMD fp32 path (head_dim 64, 128, 256; AVX-512 or AVX2, simd::kLanes lanes): one
/// block-head per call for decode, all the rows that see a block at once for prefill (keys
/// transposed).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "relokv/attention/detail/kernel_common.hpp"
#include "relokv/attention/detail/prefetch.hpp"
#include "relokv/attention/detail/simd.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

#if RELOKV_HOST_SIMD
/// Calls f(std::integral_constant<int, D / simd::kLanes>{}) for the fast paths' head dims
/// (64, 128, 256).
template <class F>
RELOKV_ALWAYS_INLINE inline void with_chunks(int D, F&& f) {
  constexpr int L = simd::kLanes;
  if (D == 64) {
    f(std::integral_constant<int, 64 / L>{});
  } else if (D == 128) {
    f(std::integral_constant<int, 128 / L>{});
  } else {
    f(std::integral_constant<int, 256 / L>{});
  }
}

/// One online-softmax step over kLanes scores of which lanes [first, vc) are live (first > 0
/// where a sliding window cuts the chunk): x becomes the weights e^(x - m_new) (0 in dead
/// lanes), mx the new running max; returns the correction e^(m_old - m_new) for the
/// accumulators (0 on the first block).
RELOKV_ALWAYS_INLINE inline float softmax_step(simd::vf& x, int vc, float& mx, int first = 0) {
  const float bmax = simd::live_max(x, vc, first);
  const float m_old = mx;
  const float m_new = m_old > bmax ? m_old : bmax;
  x -= m_new;
  simd::exp_nonpositive(x);
  simd::live_only(x, vc, first);
  mx = m_new;
  return exp_nonpositive(m_old - m_new);
}

/// One query head's chunks qv from its scaled row qg, rotated by the block's delta when qcos
/// is set (see block_head_t::qcos).
template <int DC>
RELOKV_ALWAYS_INLINE inline void load_query_rows(const float* qg, const float* qcos,
                                                 const float* qsin, rope_layout layout,
                                                 simd::vf (&qv)[DC]) {
  using simd::vf;
  constexpr int L = simd::kLanes;
  if (qcos != nullptr && layout == rope_layout::kNeoX) {
    // NeoX over the whole head: qcos/qsin are the per-pair rows; chunk c pairs with c+DC/2.
    for (int c = 0; c < DC / 2; ++c) {
      const vf x1 = RELOKV_VLOAD(qg + L * c), x2 = RELOKV_VLOAD(qg + L * (c + DC / 2));
      const vf C = RELOKV_VLOAD(qcos + L * c), S = RELOKV_VLOAD(qsin + L * c);
      qv[c] = x1 * C - x2 * S;
      qv[c + DC / 2] = x1 * S + x2 * C;
    }
  } else if (qcos != nullptr) {
    // GPT-J: per-element rows (expand_rotation); the partner is the neighbouring lane.
    for (int c = 0; c < DC; ++c) {
      const vf x = RELOKV_VLOAD(qg + L * c);
      vf partner;
      simd::swap_by<1>(partner, x, std::make_index_sequence<L>{});
      qv[c] = x * RELOKV_VLOAD(qcos + L * c) + partner * RELOKV_VLOAD(qsin + L * c);
    }
  } else {
    for (int c = 0; c < DC; ++c) qv[c] = RELOKV_VLOAD(qg + L * c);
  }
}

/// One query head's chunks, rotated by the block's delta on the block_relative fast path.
template <int DC, class T>
RELOKV_ALWAYS_INLINE inline void load_query(const block_head_t<T>& bh, const float* qg,
                                            simd::vf (&qv)[DC]) {
  load_query_rows<DC>(qg, bh.qcos, bh.qsin, bh.layout, qv);
}

/// Keys j0 .. j0 + kLanes - 1 of a block-head as fp32 rows of L * DC (in place for fp32 storage
/// that needs no rotation, else converted and/or rotated into w.kbuf). Rows from vc on may hold
/// anything: the kernels mask their scores.
template <int DC, class P, class T>
RELOKV_ALWAYS_INLINE inline const float* key_rows(const block_head_t<T>& bh, int j0, int vc,
                                                  attention_scratch& w) {
  using namespace simd;
  constexpr int L = simd::kLanes, D = L * DC;
  using U = std::remove_const_t<T>;
  constexpr bool is_f32 = std::is_same_v<U, float>;
  constexpr bool is_bf16 = std::is_same_v<U, bf16>;
  constexpr bool rotate_keys = P::kind == placement_kind::kAtAttention;
  // Per-slot rotations (at_attention) or one for the whole block (block_relative prefill).
  const bool block_rot = P::kind == placement_kind::kBlockRelative && bh.kc0 != nullptr;
  if constexpr (is_f32 && !rotate_keys) {
    if (!block_rot) return reinterpret_cast<const float*>(bh.kt) + j0 * D;
  }
  const bool rotate = rotate_keys || block_rot;
  const float* cbase = block_rot ? bh.kc0 : w.kcos.data();
  const float* sbase = block_rot ? bh.ks0 : w.ksin.data();
  const auto row_of = [&](int j) {
    return block_rot ? std::size_t{0} : static_cast<std::size_t>(j0 + j) * bh.pairs;
  };
  float* kb = w.kbuf.data();
  // NeoX over the whole head (the common case): convert and rotate in one pass, pair chunks c
  // and c + DC/2 straight from the cos/sin rows.
  const bool fused_rotate =
      rotate && !std::is_same_v<U, fp16> && bh.layout == rope_layout::kNeoX && 2 * bh.pairs == D;
  for (int j = 0; j < L && fused_rotate; ++j) {
    if (j >= vc) break;  // masked slots: their scores never count
    const U* src = bh.kt + (j0 + j) * D;
    float* dst = kb + j * D;
    const float* cs = cbase + row_of(j);
    const float* sn = sbase + row_of(j);
    for (int c = 0; c < DC / 2; ++c) {
      vf x1, x2;
      if constexpr (is_bf16) {
        load_bf16(x1, reinterpret_cast<const std::uint16_t*>(src) + L * c);
        load_bf16(x2, reinterpret_cast<const std::uint16_t*>(src) + L * (c + DC / 2));
      } else {
        x1 = RELOKV_VLOAD(reinterpret_cast<const float*>(src) + L * c);
        x2 = RELOKV_VLOAD(reinterpret_cast<const float*>(src) + L * (c + DC / 2));
      }
      const vf C = RELOKV_VLOAD(cs + L * c), S = RELOKV_VLOAD(sn + L * c);
      RELOKV_VSTORE(dst + L * c, x1 * C - x2 * S);
      RELOKV_VSTORE(dst + L * (c + DC / 2), x1 * S + x2 * C);
    }
  }
  for (int j = 0; j < L && !fused_rotate; ++j) {
    const U* src = bh.kt + (j0 + j) * D;
    float* dst = kb + j * D;
    if constexpr (is_bf16) {
      for (int c = 0; c < DC; ++c) {
        vf x;
        load_bf16(x, reinterpret_cast<const std::uint16_t*>(src) + L * c);
        RELOKV_VSTORE(dst + L * c, x);
      }
    } else {
      to_float_row(src, dst, D);
    }
    if (rotate && j < vc)
      rotate_inplace(dst, bh.layout, bh.pairs, cbase + row_of(j), sbase + row_of(j));
  }
  return kb;
}

/// Values j0 .. j0 + vc - 1 of a block-head as fp32 rows (in place for fp32 storage).
template <int DC, class T>
RELOKV_ALWAYS_INLINE inline const float* value_rows(const block_head_t<T>& bh, int j0, int vc,
                                                    attention_scratch& w) {
  using namespace simd;
  constexpr int L = simd::kLanes, D = L * DC;
  using U = std::remove_const_t<T>;
  constexpr bool is_f32 = std::is_same_v<U, float>;
  constexpr bool is_bf16 = std::is_same_v<U, bf16>;
  if constexpr (is_f32) {
    return bh.vt + j0 * D;
  } else if constexpr (is_bf16) {  // convert V once per block and head, not once per query head
    const auto* vs = reinterpret_cast<const std::uint16_t*>(bh.vt) + j0 * D;
    for (int j = 0; j < vc; ++j)
      for (int c = 0; c < DC; ++c) {
        vf x;
        load_bf16(x, vs + j * D + L * c);
        RELOKV_VSTORE(w.vbuf.data() + j * D + L * c, x);
      }
    return w.vbuf.data();
  } else {
    for (int j = 0; j < vc; ++j) to_float_row(bh.vt + (j0 + j) * D, w.vbuf.data() + j * D, D);
    return w.vbuf.data();
  }
}

/// The same as portable_block_head for head_dim = L * DC (L = kLanes) and block sizes that are
/// multiples of 16: keys in chunks of L, query heads' chunks held in registers, scores reduced with
/// a transpose-sum, one vector exp per chunk, and V accumulated chunk-wise in registers.
template <int DC, class P, class T>
void fast_block_head(const block_head_t<T>& bh, attention_scratch& w) {
  using namespace simd;
  constexpr int L = simd::kLanes, D = L * DC;
  prefetch_cursor pf(bh.pf, bh.pf_bytes, bh.G);
  for (int j0 = bh.first / L * L; j0 < bh.valid; j0 += L) {
    const int vc = bh.valid - j0 < L ? bh.valid - j0 : L;
    const int cut = bh.first > j0 ? bh.first - j0 : 0;  // lanes before a window's start
    const float* kf = key_rows<DC, P>(bh, j0, vc, w);
    const float* vfp = value_rows<DC>(bh, j0, vc, w);
    for (int g = 0; g < bh.G; ++g) {
      pf.advance();
      const std::size_t qh = static_cast<std::size_t>(bh.h * bh.G + g);
      const float* qg = bh.qsrc + qh * D;
      vf qv[DC];
      load_query<DC>(bh, qg, qv);
      // Chunk-outer, key-inner: L independent accumulators keep the FMA units busy.
      vf part[L];
      for (int j = 0; j < L; ++j) part[j] = RELOKV_VLOAD(kf + j * D) * qv[0];
      for (int c = 1; c < DC; ++c)
        for (int j = 0; j < L; ++j) part[j] += RELOKV_VLOAD(kf + j * D + L * c) * qv[c];
      vf x;
      transpose_sum(part, x);
      const float corr = softmax_step(x, vc, bh.sm.mx[qh], cut);
      alignas(64) float pr[L];
      RELOKV_VSTORE(pr, x);
      const float bsum = simd::sum(x);
      bh.sm.fold(qh, corr, bsum);
      float* acc = bh.acc + qh * D;
      vf a[DC];
      // P.V from zero, folded into the rescaled accumulators at the end: the correction (a
      // scalar exp after the max) stays off the chain of dependent P.V steps.
      for (int c = 0; c < DC; ++c) a[c] = vf{};
      for (int j = 0; j < vc; ++j) {
        const float p = pr[j];
        const float* vr = vfp + j * D;
        for (int c = 0; c < DC; ++c) a[c] += RELOKV_VLOAD(vr + L * c) * p;
      }
      for (int c = 0; c < DC; ++c)
        RELOKV_VSTORE(acc + L * c, RELOKV_VLOAD(acc + L * c) * corr + a[c]);
    }
  }
  pf.finish();
}

/// R rows against one chunk of L = kLanes keys: kt holds the keys transposed ([head_dim][L],
/// so that a row's L scores are one vector of FMAs without a horizontal sum), vals the
/// values' rows.
/// Each row's arithmetic is the same whatever R and its neighbours are, so results do not
/// depend on how queries are grouped.
template <int DC, int R>
RELOKV_ALWAYS_INLINE inline void group_rows(const float* kt, const float* vals,
                                            const group_row* rows, int j0) {
  using namespace simd;
  constexpr int L = simd::kLanes, D = L * DC;
  vf s0[R], s1[R];  // even and odd dimensions: two FMA chains per row
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = vf{};
  for (int d = 0; d < D; d += 2) {
    const vf k0 = RELOKV_VLOAD(kt + L * d), k1 = RELOKV_VLOAD(kt + L * (d + 1));
    for (int r = 0; r < R; ++r) {
      s0[r] += k0 * rows[r].q[d];
      s1[r] += k1 * rows[r].q[d + 1];
    }
  }
  alignas(64) float p[R][L];
  float corr[R];
  int vmax = 0;
  for (int r = 0; r < R; ++r) {
    const int vc = rows[r].valid - j0 < L ? rows[r].valid - j0 : L;
    vmax = vc > vmax ? vc : vmax;
    vf x = s0[r] + s1[r];
    corr[r] = softmax_step(x, vc, rows[r].sm.mx[0], rows[r].first > j0 ? rows[r].first - j0 : 0);
    RELOKV_VSTORE(p[r], x);
    rows[r].sm.fold(0, corr[r], simd::sum(x));
  }
  vf a[R][DC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < DC; ++c) a[r][c] = vf{};  // folded in at the end, as above
  // Slots up to the longest row's limit hold real values; a shorter row's weight there is 0.
  for (int j = 0; j < vmax; ++j)
    for (int c = 0; c < DC; ++c) {
      const vf v = RELOKV_VLOAD(vals + j * D + L * c);
      for (int r = 0; r < R; ++r) a[r][c] += v * p[r][j];
    }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < DC; ++c)
      RELOKV_VSTORE(rows[r].acc + L * c, RELOKV_VLOAD(rows[r].acc + L * c) * corr[r] + a[r][c]);
}

/// Prefill over one block-head: every row of `rows` (all query heads of the head's group for
/// the queries that see the block) against each chunk of kLanes keys, the keys transposed once per
/// chunk and shared by all rows. bh gives the block-head (its valid is the longest row's).
template <int DC, class P, class T>
void group_block_head(const block_head_t<T>& bh, group_row* rows, int nrows, attention_scratch& w) {
  using namespace simd;
  constexpr int L = simd::kLanes, D = L * DC;
  constexpr int R = DC <= simd::kAccRegs / 4   ? 4
                    : DC <= simd::kAccRegs / 2 ? 2
                                               : 1;  // R * DC accumulators
  float* kt = w.ktile.data();
  // A window that cuts the block for some row: a row sees a chunk only from its first slot on.
  bool cut = false;
  for (int i = 0; i < nrows; ++i) cut = cut || rows[i].first > 0;
  for (int j0 = bh.first / L * L; j0 < bh.valid; j0 += L) {
    const int vc = bh.valid - j0 < L ? bh.valid - j0 : L;
    const float* kf = key_rows<DC, P>(bh, j0, vc, w);
    const float* vals = value_rows<DC>(bh, j0, vc, w);
    for (int c = 0; c < DC; ++c) {
      vf t[L];
      for (int j = 0; j < L; ++j) t[j] = RELOKV_VLOAD(kf + j * D + L * c);
      transpose(t);
      for (int d = 0; d < L; ++d) RELOKV_VSTORE(kt + L * (L * c + d), t[d]);
    }
    // Rows that see this chunk: all of them in the first (valid >= 1), the longer ones after;
    // under a window, those whose window starts before the chunk ends.
    const group_row* live = rows;
    int n = nrows;
    if (j0 > 0 || cut) {
      n = 0;
      for (int i = 0; i < nrows; ++i)
        if (rows[i].valid > j0 && rows[i].first < j0 + L)
          w.live_rows[static_cast<std::size_t>(n++)] = rows[i];
      live = w.live_rows.data();
    }
    int i = 0;
    for (; i + R <= n; i += R) group_rows<DC, R>(kt, vals, live + i, j0);
    for (; i < n; ++i) group_rows<DC, 1>(kt, vals, live + i, j0);
  }
}
/// The SIMD fp32 path as attend_group's dispatch tag (head_dim 64, 128 or 256, block size
/// a multiple of 16): fast_block_head for decode and prefill rows one at a time,
/// group_block_head for prefill's rows that see a block-head at once.
struct simd_f32_path {
  static constexpr bool kSimd = true;
  static constexpr bool kBf16Dot = false;
  template <class P, class T>
  static void block_head(const block_head_t<T>& bh, attention_scratch& w) {
    with_chunks(bh.D, [&](auto dc) { fast_block_head<decltype(dc)::value, P>(bh, w); });
  }
  template <class P, class T>
  static void group(const block_head_t<T>& bh, group_row* rows, int n, attention_scratch& w) {
    with_chunks(bh.D, [&](auto dc) { group_block_head<decltype(dc)::value, P>(bh, rows, n, w); });
  }
};
#endif  // RELOKV_HOST_SIMD

}  // namespace detail
RELOKV_NAMESPACE_END
