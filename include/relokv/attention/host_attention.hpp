#pragma once
/// @file
/// Host paged attention that applies RoPE where the placement says: decode (one query per
/// sequence) and prefill (many queries at arbitrary, possibly scattered positions), causal by
/// logical position; GQA/MQA; fp32, bf16 and fp16 storage with fp32 accumulation; online
/// softmax. These kernels serve CPU engines and are the oracle for the CUDA kernels.
///
/// Loop structure per query: blocks outer, KV heads inner, the query heads of a GQA group
/// innermost, so every key and value is read once per query position and group, not once per
/// query head. The inner loops (conversion, rotation, dot products, exp, V accumulation) are
/// written with fixed-width lane arrays so that they vectorize without -ffast-math. Decode on
/// the bf16 fast path goes in spans of up to 64 slots (bf16_decode_spans): scores of the span
/// for every KV head of the call, one online-softmax step per query head, then P.V, with the
/// span's values and the next span's keys prefetched meanwhile.
///
/// Threads: the kernels own none. Calls over disjoint kv_head_ranges write disjoint rows;
/// calls over disjoint parts of a sequence's blocks return each row's log-sum-exp (`lse`) and
/// merge_attention_states folds them (the split for MQA and for long single sequences).
///
/// Numerics on AVX512_BF16 hosts with bf16 storage (opt out with RELOKV_NO_BF16_DOT): products
/// of bf16 values with fp32 sums; the query and the softmax weights are rounded to bf16, and
/// at_attention (NeoX over the whole head) rotates each key by its offset in the block with
/// bf16 (cos, sin) pairs and the query by R(m - pos0) once per block, in fp32.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "relokv/attention/detail/simd.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN

/// The KV heads an attention call computes, with the query heads of their groups; the default
/// is every head. Splitting one call into calls over disjoint ranges, one per thread, gives
/// the same output (each range writes only its query heads' rows of `out`): the kernels own no
/// threads, the engine's scheduler decides how many to spend.
struct kv_head_range {
  std::int32_t begin = 0;
  std::int32_t end = std::numeric_limits<std::int32_t>::max();  ///< clamped to num_kv_heads
};

namespace detail {

inline constexpr int kLanes = 16;

/// KV heads whose chunk keys at_attention rotates together (rotate_keys_bf16 loads each slot's
/// rotation row once for all of them; their rotated keys, 4 KiB each at head_dim 128, stay in
/// L1 until scored).
inline constexpr int kRotHeads = 2;

/// e^x for x <= 0 (softmax weights): Cody-Waite reduction and a degree-6 polynomial; relative
/// error below 2e-7 on [-87, 0]; branch-free so that loops over it vectorize.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float t = x * 1.44269504088896341f;
  const int n = static_cast<int>(t - 0.5f);  // round to nearest for t <= 0
  const float fn = static_cast<float>(n);
  float r = x - fn * 0.693145751953125f;
  r = r - fn * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * bits_f32(static_cast<std::uint32_t>(n + 127) << 23);
}

inline float dot(const float* RELOKV_RESTRICT a, const float* RELOKV_RESTRICT b, int n) {
  float acc[kLanes] = {};
  int d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[d + l] * b[d + l];
  float s = 0.0f;
  for (; d < n; ++d) s += a[d] * b[d];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

template <class T>
inline void to_float_row(const T* RELOKV_RESTRICT src, float* RELOKV_RESTRICT dst, int n) {
  for (int d = 0; d < n; ++d) dst[d] = to_f32(src[d]);
}

/// One prefill row: a query head of one query, with its online-softmax state.
struct group_row {
  const float* q;  ///< [head_dim], scaled and rotated as the placement needs
  float* acc;      ///< [head_dim]
  float* mx;
  float* sum;
  int valid;  ///< visible slots of the block (>= 1)
};

/// Per-thread scratch, grown on demand and reused.
struct attention_scratch {
  std::vector<float> qrot, qblock, kbuf, vbuf, kcos, ksin, acc, mx, sum, scores, cs, sn, c0, s0,
      qcos, qsin, jcos, jsin, stepc, steps;
  std::vector<std::uint16_t> kb16, wb16;         ///< bf16: rotated keys; softmax weights
  std::vector<float> corr;                       ///< bf16 path: [G] online-softmax corrections
  std::vector<float> span_sc, span_qc, span_qs;  ///< bf16 decode spans
  std::vector<std::uint16_t> qb16;               ///< bf16 decode spans: [G][head_dim] queries
  std::vector<std::uint32_t> krot;         ///< bf16 slot rotations R(j) (build_slot_rotations_bf16)
  std::vector<float> ktile;                ///< 16 keys transposed ([head_dim][16])
  std::vector<group_row> rows, live_rows;  ///< prefill rows of a block-head
};
inline attention_scratch& scratch() {
  thread_local attention_scratch s;
  return s;
}

/// One block and one KV head, for all query heads of its group: any head_dim, block size and
/// compiler. Accumulates into bh.acc/bh.mx/bh.sum.
template <class T>
struct block_head_t {
  const T* kt;  ///< [block_size][head_dim]
  const T* vt;  ///< [block_size][head_dim]
  int valid;    ///< visible slots (causal limit and padding applied)
  int h, G, D;
  rope_layout layout;
  int pairs;
  /// [num_q_heads][head_dim], multiplied by the softmax scale and rotated as the placement needs
  const float* qsrc;
  /// When set (fast path, block_relative), qsrc is unrotated and each query chunk is rotated as
  /// it is loaded. NeoX (whole head rotated): qcos/qsin are per pair ([head_dim / 2]). GPT-J:
  /// per element ([head_dim], see expand_rotation): q' = q * qcos + neighbour(q) * qsin.
  const float* qcos = nullptr;
  const float* qsin = nullptr;
  /// Online-softmax state of this query: acc [num_q_heads][head_dim], mx and sum
  /// [num_q_heads].
  float* acc = nullptr;
  float* mx = nullptr;
  float* sum = nullptr;
  /// When set (bf16 fast path, at_attention, NeoX over the whole head): each key is rotated by
  /// its slot's R(j) from these bf16 pairs (build_slot_rotations_bf16), the query by
  /// R(m - pos0) through qcos/qsin, and qsrc, qcos and qsin are in bf16_acc_index order.
  const std::uint32_t* krot = nullptr;
  /// When set (block_relative prefill, group_block_head): every key is rotated by this one
  /// pair row, R(pos0), and the queries were rotated at their own positions.
  const float* kc0 = nullptr;
  const float* ks0 = nullptr;
  /// Decode: a range to prefetch into L2 while this block-head computes (the next block's
  /// share for this head), spread over the kernel's loop (prefetch_cursor).
  const char* pf = nullptr;
  std::int32_t pf_bytes = 0;
};

/// Issues the prefetches of a few ranges a few lines at a time, `step` bytes per call of
/// advance(): a burst of prefetches stalls on the fill buffers while the kernel's own loads
/// wait behind it; spread over the kernel's loop, the next data streams in while this computes
/// (bf16 decode from DRAM: ~1000 -> ~460 ns per block and KV head). Software prefetches are
/// what keeps decode streaming here: without them the kernels get about half the bandwidth.
struct prefetch_cursor {
  static constexpr int kMaxRanges = 4;
  const char* ptr[kMaxRanges] = {};
  std::ptrdiff_t bytes[kMaxRanges] = {};
  int n = 0, i = 0;
  const char* p = nullptr;
  std::ptrdiff_t left = 0;  ///< bytes of range i from p on
  std::ptrdiff_t remaining = 0, step = 0;
  prefetch_cursor() = default;
  /// `shares` calls of advance() cover [pf, pf + bytes) (nothing when pf is null).
  prefetch_cursor(const char* pf, std::ptrdiff_t len, int shares) {
    if (pf != nullptr) add(pf, len);
    spread(shares);
  }
  void add(const void* at, std::ptrdiff_t len) {
    RELOKV_ASSERT(n < kMaxRanges, "prefetch_cursor: too many ranges");
    ptr[n] = static_cast<const char*>(at);
    bytes[n++] = len;
    remaining += len;
    if (n == 1) {
      p = ptr[0];
      left = len;
    }
  }
  /// Spreads what is left over `steps` calls of advance().
  void spread(std::int64_t steps) {
    step = static_cast<std::ptrdiff_t>((remaining / (steps > 0 ? steps : 1) + 63) / 64 * 64);
  }
  RELOKV_ALWAYS_INLINE void issue(std::ptrdiff_t budget) {
#if defined(__GNUC__) || defined(__clang__)
    while (budget > 0 && i < n) {
      for (; left > 0 && budget > 0; p += 64, left -= 64, budget -= 64, remaining -= 64)
        __builtin_prefetch(p, 0, 1);
      if (left <= 0 && ++i < n) {
        p = ptr[i];
        left = bytes[i];
      }
    }
#else
    (void)budget;
#endif
  }
  RELOKV_ALWAYS_INLINE void advance() { issue(step); }
  /// Issues everything left.
  void finish() { issue(remaining); }
};

template <class P, class T>
void portable_block_head(const block_head_t<T>& bh, attention_scratch& w) {
  prefetch_cursor(bh.pf, bh.pf_bytes, 1).finish();
  const T* kt = bh.kt;
  const T* vt = bh.vt;
  const int valid = bh.valid, h = bh.h, G = bh.G, D = bh.D, pairs = bh.pairs;
  const rope_layout layout = bh.layout;
  const float* qsrc = bh.qsrc;
  const auto hd = static_cast<std::size_t>(D);
  {
    const float* kf;
    const float* vf;
    constexpr bool direct = std::is_same_v<std::remove_const_t<T>, float>;
    if constexpr (direct && P::kind != placement_kind::kAtAttention) {
      kf = reinterpret_cast<const float*>(kt);
    } else {
      for (int j = 0; j < valid; ++j)
        to_float_row(kt + static_cast<std::ptrdiff_t>(j) * D, w.kbuf.data() + j * hd, D);
      if constexpr (P::kind == placement_kind::kAtAttention)
        for (int j = 0; j < valid; ++j)
          rotate_inplace(
              w.kbuf.data() + j * hd, layout, pairs,
              w.kcos.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs),
              w.ksin.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs));
      kf = w.kbuf.data();
    }
    if constexpr (direct) {
      vf = reinterpret_cast<const float*>(vt);
    } else {
      for (int j = 0; j < valid; ++j)
        to_float_row(vt + static_cast<std::ptrdiff_t>(j) * D, w.vbuf.data() + j * hd, D);
      vf = w.vbuf.data();
    }
    for (int g = 0; g < G; ++g) {
      const std::size_t qh = static_cast<std::size_t>(h * G + g);
      const float* qg = qsrc + qh * hd;
      float* s = w.scores.data();
      float bmax = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < valid; ++j) {
        s[j] = dot(qg, kf + static_cast<std::ptrdiff_t>(j) * D, D);
        bmax = std::max(bmax, s[j]);
      }
      const float m_old = bh.mx[qh];
      const float m_new = std::max(m_old, bmax);
      const float corr = exp_nonpositive(m_old - m_new);  // 0 on the first block
      float bsum = 0.0f;
      for (int j = 0; j < valid; ++j) {
        s[j] = exp_nonpositive(s[j] - m_new);
        bsum += s[j];
      }
      bh.mx[qh] = m_new;
      bh.sum[qh] = bh.sum[qh] * corr + bsum;
      float* acc = bh.acc + qh * hd;
      for (int d = 0; d < D; ++d) acc[d] *= corr;
      for (int j = 0; j < valid; ++j) {
        const float p = s[j];
        const float* vj = vf + static_cast<std::ptrdiff_t>(j) * D;
        for (int d = 0; d < D; ++d) acc[d] += p * vj[d];
      }
    }
  }
}

/// Slots of block entry e that a query at logical position m sees (causal; 0 for none).
inline int visible_slots(const block_entry& e, pos_t m) {
  return e.pos0 > m || e.len <= 0
             ? 0
             : static_cast<int>(std::min<std::int64_t>(e.len, std::int64_t{m} - e.pos0 + 1));
}

/// Per-element form of a rotation: x' = x * cosE + partner(x) * sinE (see block_head_t).
inline void expand_rotation(rope_layout layout, int pairs, int D, const float* cs, const float* sn,
                            float* cosE, float* sinE) {
  for (int d = 0; d < D; ++d) {
    cosE[d] = 1.0f;
    sinE[d] = 0.0f;
  }
  for (int i = 0; i < pairs; ++i) {
    std::int32_t a, b;
    pair_index(layout, pairs, i, a, b);
    cosE[a] = cosE[b] = cs[i];
    sinE[a] = -sn[i];
    sinE[b] = sn[i];
  }
}

#if RELOKV_HOST_SIMD
/// Calls f(std::integral_constant<int, D / 16>{}) for the fast paths' head dims (64, 128, 256).
template <class F>
RELOKV_ALWAYS_INLINE inline void with_chunks(int D, F&& f) {
  if (D == 64) {
    f(std::integral_constant<int, 4>{});
  } else if (D == 128) {
    f(std::integral_constant<int, 8>{});
  } else {
    f(std::integral_constant<int, 16>{});
  }
}

/// One online-softmax step over 16 scores of which the first vc are live: x becomes the
/// weights e^(x - m_new) (0 in dead lanes), mx the new running max; returns the correction
/// e^(m_old - m_new) for the accumulators (0 on the first block).
RELOKV_ALWAYS_INLINE inline float softmax_step(simd::vf16& x, int vc, float& mx) {
  const float bmax = simd::live_max(x, vc);
  const float m_old = mx;
  const float m_new = m_old > bmax ? m_old : bmax;
  x -= m_new;
  simd::exp_nonpositive(x);
  simd::live_only(x, vc);
  mx = m_new;
  return exp_nonpositive(m_old - m_new);
}

/// One query head's chunks qv from its scaled row qg, rotated by the block's delta when qcos
/// is set (see block_head_t::qcos).
template <int DC>
RELOKV_ALWAYS_INLINE inline void load_query_rows(const float* qg, const float* qcos,
                                                 const float* qsin, rope_layout layout,
                                                 simd::vf16 (&qv)[DC]) {
  using simd::vf16;
  if (qcos != nullptr && layout == rope_layout::kNeoX) {
    // NeoX over the whole head: qcos/qsin are the per-pair rows; chunk c pairs with c+DC/2.
    for (int c = 0; c < DC / 2; ++c) {
      const vf16 x1 = RELOKV_VLOAD(qg + 16 * c), x2 = RELOKV_VLOAD(qg + 16 * (c + DC / 2));
      const vf16 C = RELOKV_VLOAD(qcos + 16 * c), S = RELOKV_VLOAD(qsin + 16 * c);
      qv[c] = x1 * C - x2 * S;
      qv[c + DC / 2] = x1 * S + x2 * C;
    }
  } else if (qcos != nullptr) {
    // GPT-J: per-element rows (expand_rotation); the partner is the neighbouring lane.
    for (int c = 0; c < DC; ++c) {
      const vf16 x = RELOKV_VLOAD(qg + 16 * c);
      const vf16 partner =
          __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
      qv[c] = x * RELOKV_VLOAD(qcos + 16 * c) + partner * RELOKV_VLOAD(qsin + 16 * c);
    }
  } else {
    for (int c = 0; c < DC; ++c) qv[c] = RELOKV_VLOAD(qg + 16 * c);
  }
}

/// One query head's chunks, rotated by the block's delta on the block_relative fast path.
template <int DC, class T>
RELOKV_ALWAYS_INLINE inline void load_query(const block_head_t<T>& bh, const float* qg,
                                            simd::vf16 (&qv)[DC]) {
  load_query_rows<DC>(qg, bh.qcos, bh.qsin, bh.layout, qv);
}

/// Keys j0 .. j0 + 15 of a block-head as fp32 rows of 16 * DC (in place for fp32 storage
/// that needs no rotation, else converted and/or rotated into w.kbuf). Rows from vc on may hold
/// anything: the kernels mask their scores.
template <int DC, class P, class T>
RELOKV_ALWAYS_INLINE inline const float* key_rows(const block_head_t<T>& bh, int j0, int vc,
                                                  attention_scratch& w) {
  using namespace simd;
  constexpr int D = 16 * DC;
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
  for (int j = 0; j < 16 && fused_rotate; ++j) {
    if (j >= vc) break;  // masked slots: their scores never count
    const U* src = bh.kt + (j0 + j) * D;
    float* dst = kb + j * D;
    const float* cs = cbase + row_of(j);
    const float* sn = sbase + row_of(j);
    for (int c = 0; c < DC / 2; ++c) {
      vf16 x1, x2;
      if constexpr (is_bf16) {
        load_bf16(x1, reinterpret_cast<const std::uint16_t*>(src) + 16 * c);
        load_bf16(x2, reinterpret_cast<const std::uint16_t*>(src) + 16 * (c + DC / 2));
      } else {
        x1 = RELOKV_VLOAD(reinterpret_cast<const float*>(src) + 16 * c);
        x2 = RELOKV_VLOAD(reinterpret_cast<const float*>(src) + 16 * (c + DC / 2));
      }
      const vf16 C = RELOKV_VLOAD(cs + 16 * c), S = RELOKV_VLOAD(sn + 16 * c);
      RELOKV_VSTORE(dst + 16 * c, x1 * C - x2 * S);
      RELOKV_VSTORE(dst + 16 * (c + DC / 2), x1 * S + x2 * C);
    }
  }
  for (int j = 0; j < 16 && !fused_rotate; ++j) {
    const U* src = bh.kt + (j0 + j) * D;
    float* dst = kb + j * D;
    if constexpr (is_bf16) {
      for (int c = 0; c < DC; ++c) {
        vf16 x;
        load_bf16(x, reinterpret_cast<const std::uint16_t*>(src) + 16 * c);
        RELOKV_VSTORE(dst + 16 * c, x);
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
  constexpr int D = 16 * DC;
  using U = std::remove_const_t<T>;
  constexpr bool is_f32 = std::is_same_v<U, float>;
  constexpr bool is_bf16 = std::is_same_v<U, bf16>;
  if constexpr (is_f32) {
    return bh.vt + j0 * D;
  } else if constexpr (is_bf16) {  // convert V once per block and head, not once per query head
    const auto* vs = reinterpret_cast<const std::uint16_t*>(bh.vt) + j0 * D;
    for (int j = 0; j < vc; ++j)
      for (int c = 0; c < DC; ++c) {
        vf16 x;
        load_bf16(x, vs + j * D + 16 * c);
        RELOKV_VSTORE(w.vbuf.data() + j * D + 16 * c, x);
      }
    return w.vbuf.data();
  } else {
    for (int j = 0; j < vc; ++j) to_float_row(bh.vt + (j0 + j) * D, w.vbuf.data() + j * D, D);
    return w.vbuf.data();
  }
}

/// The same as portable_block_head for head_dim = 16 * DC and block sizes that are multiples
/// of 16: keys in chunks of 16, query heads' chunks held in registers, scores reduced with a
/// transpose-sum, one vector exp per chunk, and V accumulated chunk-wise in registers.
template <int DC, class P, class T>
void fast_block_head(const block_head_t<T>& bh, attention_scratch& w) {
  using namespace simd;
  constexpr int D = 16 * DC;
  prefetch_cursor pf(bh.pf, bh.pf_bytes, bh.G);
  for (int j0 = 0; j0 < bh.valid; j0 += 16) {
    const int vc = bh.valid - j0 < 16 ? bh.valid - j0 : 16;
    const float* kf = key_rows<DC, P>(bh, j0, vc, w);
    const float* vfp = value_rows<DC>(bh, j0, vc, w);
    for (int g = 0; g < bh.G; ++g) {
      pf.advance();
      const std::size_t qh = static_cast<std::size_t>(bh.h * bh.G + g);
      const float* qg = bh.qsrc + qh * D;
      vf16 qv[DC];
      load_query<DC>(bh, qg, qv);
      // Chunk-outer, key-inner: sixteen independent accumulators keep the FMA units busy.
      vf16 part[16];
      for (int j = 0; j < 16; ++j) part[j] = RELOKV_VLOAD(kf + j * D) * qv[0];
      for (int c = 1; c < DC; ++c)
        for (int j = 0; j < 16; ++j) part[j] += RELOKV_VLOAD(kf + j * D + 16 * c) * qv[c];
      vf16 x;
      transpose_sum(part, x);
      const float corr = softmax_step(x, vc, bh.mx[qh]);
      alignas(64) float pr[16];
      RELOKV_VSTORE(pr, x);
      const float bsum = simd::sum(x);
      bh.sum[qh] = bh.sum[qh] * corr + bsum;
      float* acc = bh.acc + qh * D;
      vf16 a[DC];
      // P.V from zero, folded into the rescaled accumulators at the end: the correction (a
      // scalar exp after the max) stays off the chain of dependent P.V steps.
      for (int c = 0; c < DC; ++c) a[c] = vf16{};
      for (int j = 0; j < vc; ++j) {
        const float p = pr[j];
        const float* vr = vfp + j * D;
        for (int c = 0; c < DC; ++c) a[c] += RELOKV_VLOAD(vr + 16 * c) * p;
      }
      for (int c = 0; c < DC; ++c)
        RELOKV_VSTORE(acc + 16 * c, RELOKV_VLOAD(acc + 16 * c) * corr + a[c]);
    }
  }
  pf.finish();
}

/// R rows against one chunk of 16 keys: kt holds the keys transposed ([head_dim][16], so that
/// a row's 16 scores are one vector of FMAs without a horizontal sum), vf the values' rows.
/// Each row's arithmetic is the same whatever R and its neighbours are, so results do not
/// depend on how queries are grouped.
template <int DC, int R>
RELOKV_ALWAYS_INLINE inline void group_rows(const float* kt, const float* vf, const group_row* rows,
                                            int j0) {
  using namespace simd;
  constexpr int D = 16 * DC;
  vf16 s0[R], s1[R];  // even and odd dimensions: two FMA chains per row
  for (int r = 0; r < R; ++r) s0[r] = s1[r] = vf16{};
  for (int d = 0; d < D; d += 2) {
    const vf16 k0 = RELOKV_VLOAD(kt + 16 * d), k1 = RELOKV_VLOAD(kt + 16 * (d + 1));
    for (int r = 0; r < R; ++r) {
      s0[r] += k0 * rows[r].q[d];
      s1[r] += k1 * rows[r].q[d + 1];
    }
  }
  alignas(64) float p[R][16];
  float corr[R];
  int vmax = 0;
  for (int r = 0; r < R; ++r) {
    const int vc = rows[r].valid - j0 < 16 ? rows[r].valid - j0 : 16;
    vmax = vc > vmax ? vc : vmax;
    vf16 x = s0[r] + s1[r];
    corr[r] = softmax_step(x, vc, *rows[r].mx);
    RELOKV_VSTORE(p[r], x);
    *rows[r].sum = *rows[r].sum * corr[r] + simd::sum(x);
  }
  vf16 a[R][DC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < DC; ++c) a[r][c] = vf16{};  // folded in at the end, as above
  // Slots up to the longest row's limit hold real values; a shorter row's weight there is 0.
  for (int j = 0; j < vmax; ++j)
    for (int c = 0; c < DC; ++c) {
      const vf16 v = RELOKV_VLOAD(vf + j * D + 16 * c);
      for (int r = 0; r < R; ++r) a[r][c] += v * p[r][j];
    }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < DC; ++c)
      RELOKV_VSTORE(rows[r].acc + 16 * c, RELOKV_VLOAD(rows[r].acc + 16 * c) * corr[r] + a[r][c]);
}

/// Prefill over one block-head: every row of `rows` (all query heads of the head's group for
/// the queries that see the block) against each chunk of 16 keys, the keys transposed once per
/// chunk and shared by all rows. bh gives the block-head (its valid is the longest row's).
template <int DC, class P, class T>
void group_block_head(const block_head_t<T>& bh, group_row* rows, int nrows, attention_scratch& w) {
  using namespace simd;
  constexpr int D = 16 * DC;
  constexpr int R = DC <= 4 ? 4 : DC <= 8 ? 2 : 1;  // R * DC accumulators in registers
  float* kt = w.ktile.data();
  for (int j0 = 0; j0 < bh.valid; j0 += 16) {
    const int vc = bh.valid - j0 < 16 ? bh.valid - j0 : 16;
    const float* kf = key_rows<DC, P>(bh, j0, vc, w);
    const float* vf = value_rows<DC>(bh, j0, vc, w);
    for (int c = 0; c < DC; ++c) {
      vf16 t[16];
      for (int j = 0; j < 16; ++j) t[j] = RELOKV_VLOAD(kf + j * D + 16 * c);
      transpose16(t);
      for (int d = 0; d < 16; ++d) RELOKV_VSTORE(kt + 16 * (16 * c + d), t[d]);
    }
    // Rows that see this chunk: all of them in the first (valid >= 1), the longer ones after.
    const group_row* live = rows;
    int n = nrows;
    if (j0 > 0) {
      n = 0;
      for (int i = 0; i < nrows; ++i)
        if (rows[i].valid > j0) w.live_rows[static_cast<std::size_t>(n++)] = rows[i];
      live = w.live_rows.data();
    }
    int i = 0;
    for (; i + R <= n; i += R) group_rows<DC, R>(kt, vf, live + i, j0);
    for (; i < n; ++i) group_rows<DC, 1>(kt, vf, live + i, j0);
  }
}

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
    transpose_reduce(part, bmax, vmax);
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
#endif
#endif

/// Attention of a group of queries of one sequence (each with all its query heads) over the
/// sequence's blocks. Blocks are the outer loop, so a block's K/V are read once per group while
/// they sit in cache, and per-block work (key rotations for at_attention) is shared.
/// q: [nq][num_q_heads][head_dim], unrotated; m: [nq]; out: [nq][num_q_heads][head_dim].
template <class P, class T>
void attend_group(const rope_table& rope, paged_kv_view<const T> kv, const block_entry* blocks,
                  std::int32_t num_blocks, const float* q, const pos_t* m, int nq,
                  std::int32_t num_q_heads, float scale, float* out, float* lse, bool decode,
                  int h_begin, int h_end) {
  const int D = kv.head_dim, H = kv.num_kv_heads, G = num_q_heads / H, bs = kv.block_size;
  const int pairs = rope.pairs();
  const rope_layout layout = rope.config().layout;
  const float mag = static_cast<float>(rope.magnitude_factor());
  attention_scratch& w = scratch();
  const auto hq = static_cast<std::size_t>(num_q_heads), hd = static_cast<std::size_t>(D);
  const auto nqs = static_cast<std::size_t>(nq);
  w.qrot.resize(nqs * hq * hd);
  w.qblock.resize(hq * hd);
  w.kbuf.resize(static_cast<std::size_t>(bs) * hd);
  w.vbuf.resize(static_cast<std::size_t>(bs) * hd);
  w.kcos.resize(static_cast<std::size_t>(bs) * static_cast<std::size_t>(pairs));
  w.ksin.resize(w.kcos.size());
  w.acc.assign(nqs * hq * hd, 0.0f);
  w.mx.assign(nqs * hq, -std::numeric_limits<float>::infinity());
  w.sum.assign(nqs * hq, 0.0f);
  w.scores.resize(static_cast<std::size_t>(bs));
  w.cs.resize(static_cast<std::size_t>(pairs));
  w.sn.resize(static_cast<std::size_t>(pairs));
  w.c0.resize(static_cast<std::size_t>(pairs));
  w.s0.resize(static_cast<std::size_t>(pairs));

  // The fast path can fuse the per-block query rotation (block_relative) when pairs never
  // straddle a 16-lane chunk: GPT-J always, NeoX when the whole head rotates.
  const bool fast = RELOKV_HOST_SIMD && bs % 16 == 0 && (D == 64 || D == 128 || D == 256);
  const bool fused_q = fast && (layout == rope_layout::kGPTJ || rope.config().rotary_dim == D);
  w.qcos.resize(hd);
  w.qsin.resize(hd);
  // bf16 with VDPBF16PS: accumulators in bf16_acc_index order, restored at the end.
  constexpr bool is_bf16 = std::is_same_v<std::remove_const_t<T>, bf16>;
  const bool bf16_dot = RELOKV_HOST_BF16_DOT && is_bf16 && fast;
  // Prefill on the fast path: all rows that see a block-head at once (group_block_head).
  const bool grouped = !decode && fast && !bf16_dot;
  if (grouped) {
    w.ktile.resize(16 * hd);
    w.rows.resize(nqs * hq);
    w.live_rows.resize(nqs * hq);
  }
  if (bf16_dot) {
    w.kb16.resize(kRotHeads * 16 * hd);
    w.wb16.resize(16 * static_cast<std::size_t>(G));
    w.corr.resize(static_cast<std::size_t>(G));
  }

  // at_attention on the bf16 path, NeoX over the whole head: keys rotated with VDPBF16PS from
  // bf16 (cos, sin) pairs, query rows in bf16_acc_index order (see bf16_block_head).
  const bool rot_bf16 = P::kind == placement_kind::kAtAttention && bf16_dot &&
                        layout == rope_layout::kNeoX && 2 * pairs == D;
  // Unit rotations R(j) of the slots of a block, for composing R(pos0 + j) = R(pos0) R(j).
  if constexpr (P::kind == placement_kind::kAtAttention) {
    w.jcos.resize(w.kcos.size());
    w.jsin.resize(w.kcos.size());
    for (int j = 0; j < bs; ++j)
      rope.angles(j, w.jcos.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs),
                  w.jsin.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs),
                  /*unit=*/true);
#if RELOKV_HOST_BF16_DOT
    if (rot_bf16) {
      w.krot.resize(2 * w.kcos.size());
      build_slot_rotations_bf16(bs, pairs, mag, w.jcos.data(), w.jsin.data(), w.krot.data());
    }
#endif
  }

  // Queries times the softmax scale (once, not per block), rotated at their positions for the
  // placements whose keys carry absolute rotations.
  for (std::size_t i = 0; i < nqs * hq * hd; ++i) w.qrot[i] = q[i] * scale;
  if ((P::kind != placement_kind::kBlockRelative || grouped) && !rot_bf16) {
    for (std::size_t i = 0; i < nqs; ++i) {
      rope.angles(m[i], w.cs.data(), w.sn.data());
      for (std::size_t h = 0; h < hq; ++h)
        rotate_inplace(w.qrot.data() + (i * hq + h) * hd, layout, pairs, w.cs.data(), w.sn.data());
    }
  }
#if RELOKV_HOST_BF16_DOT
  if (rot_bf16) {
    for (std::size_t r = 0; r < nqs * hq; ++r) {
      float* row = w.qrot.data() + r * hd;
      std::copy(row, row + hd, w.kbuf.begin());
      to_acc_order(D, w.kbuf.data(), row);
    }
  }
#endif
  const pos_t m_max = *std::max_element(m, m + nq);

  // R(m - pos0) for the placements that rotate the query per block, into w.cs/w.sn. Decode
  // walks blocks that usually follow each other: then R(m - pos0 - bs) = R(m - pos0) R(-bs) is
  // composed in fp32 instead of read from the table (a cache miss per block), re-read every
  // kChain blocks so that the error stays within a few ulp.
  constexpr int kChain = 8;
  int chain = kChain;
  pos_t chain_pos0 = 0;
  if (P::kind == placement_kind::kBlockRelative || rot_bf16) {
    w.stepc.resize(static_cast<std::size_t>(pairs));
    w.steps.resize(static_cast<std::size_t>(pairs));
    rope.angles(bs, w.stepc.data(), w.steps.data(), /*unit=*/true);
  }
  const auto query_angles = [&](std::int32_t bi, pos_t pos0, pos_t mq) {
    if (nq == 1 && chain < kChain && std::int64_t{pos0} - chain_pos0 == bs) {
      float* RELOKV_RESTRICT c = w.cs.data();
      float* RELOKV_RESTRICT sn = w.sn.data();
      const float* RELOKV_RESTRICT cb = w.stepc.data();
      const float* RELOKV_RESTRICT sb = w.steps.data();
      for (int i = 0; i < pairs; ++i) {
        const float ci = c[i], si = sn[i];
        c[i] = ci * cb[i] + si * sb[i];
        sn[i] = si * cb[i] - ci * sb[i];
      }
      ++chain;
    } else {
      rope.angles(std::int64_t{mq} - pos0, w.cs.data(), w.sn.data());
      chain = 0;
    }
    chain_pos0 = pos0;
    if (nq == 1 && bi + 1 < num_blocks &&
        (chain + 1 >= kChain || std::int64_t{blocks[bi + 1].pos0} - pos0 != bs))
      rope.prefetch(std::int64_t{mq} - blocks[bi + 1].pos0);
  };

#if RELOKV_HOST_BF16_DOT
  // Decode on the bf16 path: spans of up to kSpanChunks chunks per kernel call.
  if constexpr (is_bf16) {
    const bool spans = bf16_dot && decode && nq == 1 &&
                       (P::kind == placement_kind::kPreRotated || rot_bf16 ||
                        (P::kind == placement_kind::kBlockRelative && fused_q));
    if (spans) {
      bf16_decode_spans<P>(kv, blocks, num_blocks, m[0], G, h_begin, h_end, layout, pairs, rot_bf16,
                           query_angles, w);
      num_blocks = 0;  // all done; the output loop below normalizes
    }
  }
#endif
  for (std::int32_t bi = 0; bi < num_blocks; ++bi) {
    const block_entry e = blocks[bi];
    if (e.pos0 > m_max || e.len <= 0) continue;
    if (P::kind == placement_kind::kAtAttention && !rot_bf16) {
      // R(pos0 + j) = R(pos0) R(j): one table row per block, composed per slot, shared by all
      // KV heads and queries.
      const int rows = visible_slots(e, m_max);
      rope.angles(e.pos0, w.c0.data(), w.s0.data(), /*unit=*/true);
      if (nq == 1 && bi + 1 < num_blocks) rope.prefetch(blocks[bi + 1].pos0);
      const float* c0 = w.c0.data();
      const float* s0 = w.s0.data();
      for (int j = 0; j < rows; ++j) {
        const std::size_t row = static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs);
        const float* cj = w.jcos.data() + row;
        const float* sj = w.jsin.data() + row;
        float* kc = w.kcos.data() + row;
        float* ks = w.ksin.data() + row;
        for (int i = 0; i < pairs; ++i) {
          kc[i] = mag * (c0[i] * cj[i] - s0[i] * sj[i]);
          ks[i] = mag * (s0[i] * cj[i] + c0[i] * sj[i]);
        }
      }
    }
#if RELOKV_HOST_SIMD
    if (grouped) {
      // block_relative: (R(m) q) . (R(pos0) R(j) k), the queries rotated once per call and each
      // block's keys by R(pos0) as they are loaded: a block has fewer keys than a prefill
      // group has query rows.
      const float* qsrc = w.qrot.data();
      if constexpr (P::kind == placement_kind::kBlockRelative)
        rope.angles(e.pos0, w.c0.data(), w.s0.data(), /*unit=*/true);
      for (int h = h_begin; h < h_end; ++h) {
        int n = 0, vmax = 0;
        for (int qi = 0; qi < nq; ++qi) {
          if (e.pos0 > m[qi]) continue;
          const int valid = visible_slots(e, m[qi]);
          vmax = std::max(vmax, valid);
          for (int g = 0; g < G; ++g) {
            const std::size_t r =
                static_cast<std::size_t>(qi) * hq + static_cast<std::size_t>(h * G + g);
            w.rows[static_cast<std::size_t>(n++)] = {qsrc + r * hd, w.acc.data() + r * hd,
                                                     w.mx.data() + r, w.sum.data() + r, valid};
          }
        }
        if (n == 0) continue;
        block_head_t<T> bh{kv.k(e.block, h), kv.v(e.block, h), vmax, h, G, D, layout, pairs,
                           nullptr};
        if constexpr (P::kind == placement_kind::kBlockRelative) {
          bh.kc0 = w.c0.data();
          bh.ks0 = w.s0.data();
        }
        with_chunks(
            D, [&](auto dc) { group_block_head<decltype(dc)::value, P>(bh, w.rows.data(), n, w); });
      }
      continue;
    }
#endif
    for (int qi = 0; qi < nq; ++qi) {
      const pos_t mq = m[qi];
      if (e.pos0 > mq) continue;
      const int valid = visible_slots(e, mq);
      const auto qoff = static_cast<std::size_t>(qi) * hq;
      // Scaled query rows; unrotated for block_relative, which rotates them per block below.
      const float* qsrc = w.qrot.data() + qoff * hd;
      const float* qcos = nullptr;
      const float* qsin = nullptr;
      if constexpr (P::kind == placement_kind::kBlockRelative) {
        // (R(m) q) . (R(pos0 + j) k) = (R(m - pos0) q) . (R(j) k): one rotation per block. The
        // fast path rotates each query chunk as it loads it; otherwise rotate a copy here.
        query_angles(bi, e.pos0, mq);
        if (fused_q && layout == rope_layout::kNeoX) {  // the pair rows as they are
          qcos = w.cs.data();
          qsin = w.sn.data();
        } else if (fused_q) {
          expand_rotation(layout, pairs, D, w.cs.data(), w.sn.data(), w.qcos.data(), w.qsin.data());
          qcos = w.qcos.data();
          qsin = w.qsin.data();
        } else {
          std::copy(qsrc, qsrc + hq * hd, w.qblock.begin());
          for (std::size_t h = 0; h < hq; ++h)
            rotate_inplace(w.qblock.data() + h * hd, layout, pairs, w.cs.data(), w.sn.data());
          qsrc = w.qblock.data();
        }
      } else if (rot_bf16) {
#if RELOKV_HOST_BF16_DOT
        // The same per-block query rotation, its pair rows in the query's bf16_acc_index order
        // (which keeps pair (i, i + D/2) at positions (p, p + D/2), p < D/2).
        query_angles(bi, e.pos0, mq);
        to_acc_order(pairs, w.cs.data(), w.qcos.data());
        to_acc_order(pairs, w.sn.data(), w.qsin.data());
        qcos = w.qcos.data();
        qsin = w.qsin.data();
#endif
      }
      for (int h = h_begin; h < h_end; ++h) {
        block_head_t<T> bh{
            kv.k(e.block, h), kv.v(e.block, h), valid, h, G, D, layout, pairs, qsrc, qcos, qsin};
        bh.acc = w.acc.data() + qoff * hd;
        bh.mx = w.mx.data() + qoff;
        bh.sum = w.sum.data() + qoff;
        if (rot_bf16) bh.krot = w.krot.data();
        // Decode: the next block's share for this head streams in while this one computes.
        if (decode && qi == 0 && bi + 1 < num_blocks) {
          const std::size_t slice = 2 * static_cast<std::size_t>(kv.tile_elems()) * sizeof(T);
          bh.pf = reinterpret_cast<const char*>(kv.k(blocks[bi + 1].block, 0)) +
                  slice * static_cast<std::size_t>(h);
          bh.pf_bytes = static_cast<std::int32_t>(slice);
        }
#if RELOKV_HOST_BF16_DOT
        if constexpr (is_bf16) {
          if (bf16_dot) {
            with_chunks(D, [&](auto dc) { bf16_block_head<decltype(dc)::value, P>(bh, w); });
            continue;
          }
        }
#endif
#if RELOKV_HOST_SIMD
        if (fast) {
          with_chunks(D, [&](auto dc) { fast_block_head<decltype(dc)::value, P>(bh, w); });
          continue;
        }
#endif
        portable_block_head<P>(bh, w);
      }
    }
  }
  for (std::size_t i = 0; i < nqs * hq; ++i) {
    const auto head = static_cast<int>(i % hq);
    if (head < h_begin * G || head >= h_end * G) continue;       // another call's share
    const float inv = w.sum[i] > 0.0f ? 1.0f / w.sum[i] : 0.0f;  // no visible key: zeros
    if (lse != nullptr)
      lse[i] =
          w.sum[i] > 0.0f ? w.mx[i] + std::log(w.sum[i]) : -std::numeric_limits<float>::infinity();
    const float* acc = w.acc.data() + i * hd;
    if (bf16_dot) {
#if RELOKV_HOST_BF16_DOT
      for (int d = 0; d < D; ++d)
        out[i * hd + static_cast<std::size_t>(d)] = acc[bf16_acc_index(d)] * inv;
#endif
    } else {
      for (std::size_t d = 0; d < hd; ++d) out[i * hd + d] = acc[d] * inv;
    }
  }
}

template <class T>
void check_shapes(const rope_table& rope, const paged_kv_view<const T>& kv,
                  std::int32_t num_q_heads, kv_head_range& heads) {
  heads.end = std::min(heads.end, kv.num_kv_heads);
  if (heads.begin < 0 || heads.begin > heads.end)
    throw error("attention: kv_head_range [" + std::to_string(heads.begin) + ", " +
                std::to_string(heads.end) + ") is not a range of the " +
                std::to_string(kv.num_kv_heads) + " KV heads");
  if (kv.num_kv_heads <= 0 || num_q_heads % kv.num_kv_heads != 0)
    throw error("attention: num_q_heads (" + std::to_string(num_q_heads) +
                ") must be a positive multiple of num_kv_heads (" +
                std::to_string(kv.num_kv_heads) + ")");
  if (rope.config().head_dim != kv.head_dim)
    throw error("attention: rope head_dim " + std::to_string(rope.config().head_dim) +
                " differs from the KV head_dim " + std::to_string(kv.head_dim));
}

}  // namespace detail

/// Decode attention: one query per sequence.
/// @tparam P  RoPE placement the keys were written with
/// @param q      [num_seqs][num_q_heads][head_dim], unrotated
/// @param q_pos  [num_seqs] logical position of each query
/// @param out    [num_seqs][num_q_heads][head_dim]
/// @param heads  the share of the KV heads this call computes (see kv_head_range)
/// @param lse    optional [num_seqs][num_q_heads]: the natural log of each row's softmax
///               denominator over the scaled scores, -inf where no key is visible (its `out`
///               row is zeros); like `out`, only the rows of `heads`' query heads are
///               written. With it, calls over disjoint parts of a sequence's blocks (one
///               per thread: the split that serves MQA models and long single sequences, which
///               kv_head_range cannot share out) merge exactly with merge_attention_states.
template <class P, class T>
void decode_attention(const rope_table& rope, paged_kv_view<const T> kv, block_table_view table,
                      const float* q, const pos_t* q_pos, std::int32_t num_q_heads, float scale,
                      float* out, kv_head_range heads = {}, float* lse = nullptr) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  detail::check_shapes(rope, kv, num_q_heads, heads);
  check_block_table(table, kv.num_blocks, kv.block_size);
  const std::size_t stride = static_cast<std::size_t>(num_q_heads) * kv.head_dim;
  for (std::int32_t s = 0; s < table.num_seqs; ++s)
    detail::attend_group<P>(
        rope, kv, table.entries + table.indptr[s], table.indptr[s + 1] - table.indptr[s],
        q + s * stride, q_pos + s, 1, num_q_heads, scale, out + s * stride,
        lse == nullptr ? nullptr : lse + s * num_q_heads, /*decode=*/true, heads.begin, heads.end);
}

/// Prefill attention: sequence s has queries q_indptr[s] .. q_indptr[s+1], each at its own
/// logical position (they need not be contiguous: recomputed tokens are scattered), causal by
/// logical position over the sequence's blocks.
/// @param q      [num_tokens][num_q_heads][head_dim], unrotated
/// @param q_pos  [num_tokens]
/// @param out    [num_tokens][num_q_heads][head_dim]
/// @param heads  the share of the KV heads this call computes (see kv_head_range)
/// @param lse    optional [num_tokens][num_q_heads], as for decode_attention
template <class P, class T>
void prefill_attention(const rope_table& rope, paged_kv_view<const T> kv, block_table_view table,
                       const float* q, const pos_t* q_pos, const std::int32_t* q_indptr,
                       std::int32_t num_q_heads, float scale, float* out, kv_head_range heads = {},
                       float* lse = nullptr) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  detail::check_shapes(rope, kv, num_q_heads, heads);
  check_block_table(table, kv.num_blocks, kv.block_size);
  const std::size_t stride = static_cast<std::size_t>(num_q_heads) * kv.head_dim;
  // Queries of a sequence in groups that share each block while it is in cache.
  constexpr std::int32_t kGroup = 16;
  for (std::int32_t s = 0; s < table.num_seqs; ++s)
    for (std::int32_t t = q_indptr[s]; t < q_indptr[s + 1]; t += kGroup) {
      const int n = static_cast<int>(std::min(kGroup, q_indptr[s + 1] - t));
      detail::attend_group<P>(rope, kv, table.entries + table.indptr[s],
                              table.indptr[s + 1] - table.indptr[s], q + t * stride, q_pos + t, n,
                              num_q_heads, scale, out + t * stride,
                              lse == nullptr ? nullptr : lse + t * num_q_heads, /*decode=*/false,
                              heads.begin, heads.end);
    }
}

/// Mutable views: template arguments do not deduce through the conversion to a read-only view,
/// so these forward what `storage.layer(l)` of a non-const pool gives.
template <class P, class T>
requires(!std::is_const_v<T>) void decode_attention(const rope_table& rope, paged_kv_view<T> kv,
                                                    block_table_view table, const float* q,
                                                    const pos_t* q_pos, std::int32_t num_q_heads,
                                                    float scale, float* out,
                                                    kv_head_range heads = {},
                                                    float* lse = nullptr) {
  decode_attention<P>(rope, paged_kv_view<const T>(kv), table, q, q_pos, num_q_heads, scale, out,
                      heads, lse);
}

template <class P, class T>
requires(!std::is_const_v<T>) void prefill_attention(
    const rope_table& rope, paged_kv_view<T> kv, block_table_view table, const float* q,
    const pos_t* q_pos, const std::int32_t* q_indptr, std::int32_t num_q_heads, float scale,
    float* out, kv_head_range heads = {}, float* lse = nullptr) {
  prefill_attention<P>(rope, paged_kv_view<const T>(kv), table, q, q_pos, q_indptr, num_q_heads,
                       scale, out, heads, lse);
}

/// Folds attention state (out_b, lse_b) into (out, lse): the two are the same query rows
/// attending over disjoint sets of keys (for example decode_attention over the first and the
/// second half of a sequence's blocks, on two threads); the result is the attention over their
/// union, as one call over all the keys would give it up to rounding. A row with lse -inf has
/// no visible key: it contributes nothing, and the merged row stays zeros with lse -inf when
/// neither part has one. Merging parts one by one into an accumulator gives the same result in
/// any order, up to rounding. A NaN log-sum-exp is an error, reported before any row changes.
/// @param rows      query rows (tokens x query heads)
/// @param head_dim  elements of a row of out
/// @param out, lse  [rows][head_dim] and [rows]: the accumulator, updated in place
/// @param out_b, lse_b  the other part, read only
inline void merge_attention_states(std::size_t rows, std::int32_t head_dim, float* out, float* lse,
                                   const float* out_b, const float* lse_b) {
  if (head_dim <= 0)
    throw error("merge_attention_states: head_dim " + std::to_string(head_dim) +
                " must be positive");
  if (rows > 0 && (out == nullptr || lse == nullptr || out_b == nullptr || lse_b == nullptr))
    throw error("merge_attention_states: null output or log-sum-exp array");
  const auto hd = static_cast<std::size_t>(head_dim);
  for (std::size_t r = 0; r < rows; ++r)  // before any row is written
    if (std::isnan(lse[r]) || std::isnan(lse_b[r]))
      throw error("merge_attention_states: log-sum-exp of row " + std::to_string(r) + " is NaN");
  const float ninf = -std::numeric_limits<float>::infinity();
  for (std::size_t r = 0; r < rows; ++r) {
    const float la = lse[r], lb = lse_b[r];
    if (lb == ninf) continue;  // b saw no key
    float* o = out + r * hd;
    const float* ob = out_b + r * hd;
    if (la == ninf) {  // a saw no key: b as it is
      std::copy(ob, ob + hd, o);
      lse[r] = lb;
      continue;
    }
    const float mx = std::max(la, lb);
    const float wa = std::exp(la - mx), wb = std::exp(lb - mx), total = wa + wb;
    const float fa = wa / total, fb = wb / total;
    for (std::size_t d = 0; d < hd; ++d) o[d] = fa * o[d] + fb * ob[d];
    lse[r] = mx + std::log(total);
  }
}

RELOKV_NAMESPACE_END
