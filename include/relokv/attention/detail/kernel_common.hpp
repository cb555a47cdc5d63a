#pragma once
/// @file
/// What every host attention path shares: lane width, the exp polynomial, the per-thread
/// scratch, one block-head's arguments (block_head_t), causal visibility and rotations.
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
#include "relokv/attention/softmax.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
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

/// exp_nonpositive and std::log as the functors of softmax.hpp's shared state arithmetic.
struct host_exp {
  float operator()(float x) const noexcept { return exp_nonpositive(x); }
};
struct host_log {
  float operator()(float x) const noexcept { return std::log(x); }
};

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
  const float* q;   ///< [head_dim], scaled and rotated as the placement needs
  float* acc;       ///< [head_dim]
  softmax_rows sm;  ///< its online-softmax state (row 0 of the view)
  int valid;        ///< visible slots of the block (>= 1)
  int first = 0;    ///< first visible slot (> 0 where a sliding window cuts the block)
};

/// Per-thread scratch, grown on demand and reused.
struct attention_scratch {
  std::vector<float> qrot, qblock, kbuf, vbuf, kcos, ksin, acc, mx, sum, scores, cs, sn, c0, s0,
      qcos, qsin, jcos, jsin, stepc, steps;
  /// n rows' online-softmax state in mx and sum, reset (before any score).
  softmax_rows softmax(std::size_t n) {
    mx.resize(n);
    sum.resize(n);
    const softmax_rows st{mx.data(), sum.data()};
    st.reset(n);
    return st;
  }
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
/// compiler. Accumulates into bh.acc and bh.sm.
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
  /// Online-softmax state of this query: acc [num_q_heads][head_dim], sm [num_q_heads].
  float* acc = nullptr;
  softmax_rows sm{};
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
  /// First visible slot: > 0 where a sliding window starts inside the block (slots before it
  /// are out of the window). Prefill on the grouped path: the smallest of its rows'.
  int first = 0;
};

/// Slots of block entry e that a query at logical position m sees (causal; 0 for none).
inline int visible_slots(const block_entry& e, pos_t m) {
  return e.pos0 > m || e.len <= 0
             ? 0
             : static_cast<int>(std::min<std::int64_t>(e.len, std::int64_t{m} - e.pos0 + 1));
}

/// The first slot of block entry e inside the sliding window of a query at logical position m:
/// the window holds the keys at positions > m - window (window 0: no window, slot 0). A result
/// >= visible_slots(e, m) means the query sees nothing of the block.
inline int window_first(const block_entry& e, pos_t m, std::int32_t window) {
  if (window <= 0) return 0;
  const std::int64_t lo = std::int64_t{m} - window + 1 - e.pos0;
  return lo <= 0 ? 0 : static_cast<int>(std::min<std::int64_t>(lo, e.len));
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

}  // namespace detail
RELOKV_NAMESPACE_END
