#pragma once
/// @file
/// How much attention each key receives from a set of queries: the signal question-driven
/// recompute ranks span tokens by (recompute/question_topk.hpp; A3, arXiv 2511.17560, and
/// ProphetKV, arXiv 2602.02579, rank by the question's attention).
///
/// For every query row i (at logical position m_i) and query head h of the call, the softmax
/// over the keys it sees (logical positions n <= m_i, and n > m_i - window in a windowed layer)
/// is added into mass[n]:
///   mass[n] += exp(scale * <R(m_i) q_ih, R(n) k_n> - lse_ih)
/// so each row and head adds exactly 1 in total. Keys are brought to their logical rotation
/// from any placement (pre_rotated: as stored; block_relative: R(pos0) applied to the stored
/// R(slot) k; at_attention: R(n) applied to the stored k), once per call, in fp32; the scores
/// are then plain dot products. The pass is the same arithmetic whatever the CPU: it ranks,
/// and its reference is an fp64 evaluation of the formula above (tests/attention). Cost: one
/// dot product per (row, query head, visible key), as attention's scores.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relokv/attention/detail/kernel_common.hpp"
#include "relokv/attention/kv_head_range.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// One attention_mass call: the queries of one sequence over its blocks.
template <class T>
struct attention_mass_params {
  const rope_table* rope = nullptr;
  paged_kv_view<const T> kv;
  /// The sequence's blocks, in logical order (entry pos0 and len as attention reads them).
  std::span<const block_entry> blocks;
  const float* q = nullptr;      ///< [num_tokens][num_q_heads][head_dim], unrotated
  const pos_t* q_pos = nullptr;  ///< [num_tokens] logical positions
  std::int32_t num_tokens = 0;
  std::int32_t num_q_heads = 0;
  float scale = 1.0f;
  kv_head_range heads{};  ///< the KV heads (and their query heads) this call covers
  /// Per logical position, added to (never cleared): mass[n] for every key n of `blocks`.
  std::span<float> mass;
  /// A windowed layer's sliding window, as attention_params::window: a row at m sees the keys
  /// at positions in (m - window, m] and gives the others nothing. 0: no window.
  std::int32_t window = 0;
};

/// Adds each key's received attention into p.mass (see the file comment).
/// @tparam P the placement the keys were written with
/// @throws error naming the problem (null pointers, shapes against the table and the storage, a
///         block id or length outside the view, a key position outside `mass`); nothing is
///         added then.
template <class P, class T>
void attention_mass(const attention_mass_params<T>& p) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  const auto& kv = p.kv;
  if (p.rope == nullptr) throw error("attention_mass: null rope table");
  if (kv.num_kv_heads <= 0 || p.num_q_heads <= 0 || p.num_q_heads % kv.num_kv_heads != 0)
    throw error("attention_mass: num_q_heads (" + std::to_string(p.num_q_heads) +
                ") must be a positive multiple of num_kv_heads (" +
                std::to_string(kv.num_kv_heads) + ")");
  if (kv.head_dim <= 0 || kv.head_dim != p.rope->config().head_dim)
    throw error("attention_mass: head_dim " + std::to_string(kv.head_dim) +
                " differs from the rope table's");
  if (p.num_tokens < 0) throw error("attention_mass: negative num_tokens");
  if (p.window < 0) throw error("attention_mass: negative window");
  if (p.num_tokens > 0 && (p.q == nullptr || p.q_pos == nullptr))
    throw error("attention_mass: null q or q_pos");
  const std::int32_t hb = p.heads.begin, he = std::min(p.heads.end, kv.num_kv_heads);
  if (hb < 0 || hb > he) throw error("attention_mass: kv_head_range is not a range of the heads");
  std::int64_t keys = 0;
  for (std::size_t i = 0; i < p.blocks.size(); ++i) {
    const block_entry& e = p.blocks[i];
    if (e.block < 0 || e.block >= kv.num_blocks || e.len < 0 || e.len > kv.block_size)
      throw error("attention_mass: block entry " + std::to_string(i) + " {block " +
                  std::to_string(e.block) + ", len " + std::to_string(e.len) +
                  "} outside the view of " + std::to_string(kv.num_blocks) + " blocks of " +
                  std::to_string(kv.block_size));
    if (e.len > 0 && (e.pos0 < 0 || static_cast<std::size_t>(e.pos0) + e.len > p.mass.size()))
      throw error("attention_mass: block entry " + std::to_string(i) + " covers positions [" +
                  std::to_string(e.pos0) + ", " + std::to_string(e.pos0 + e.len) +
                  "), outside the " + std::to_string(p.mass.size()) + " of mass");
    keys += e.len;
  }
  if (keys > 0 && kv.data == nullptr) throw error("attention_mass: null KV storage");
  if (keys == 0 || p.num_tokens == 0 || hb == he) return;

  const int D = kv.head_dim, G = p.num_q_heads / kv.num_kv_heads;
  const auto hd = static_cast<std::size_t>(D);
  const auto nkeys = static_cast<std::size_t>(keys);
  // Keys of the covered heads at their logical rotation: [head][key][D], key order = blocks'.
  thread_local std::vector<float> kf, qf, s;
  thread_local std::vector<pos_t> kpos;
  kf.resize(static_cast<std::size_t>(he - hb) * nkeys * hd);
  kpos.resize(nkeys);
  std::size_t j = 0;
  for (const block_entry& e : p.blocks)
    for (std::int32_t slot = 0; slot < e.len; ++slot, ++j) {
      const pos_t n = e.pos0 + slot;
      kpos[j] = n;
      for (std::int32_t h = hb; h < he; ++h) {
        float* dst = kf.data() + (static_cast<std::size_t>(h - hb) * nkeys + j) * hd;
        const T* src = kv.k(e.block, h) + static_cast<std::size_t>(slot) * hd;
        detail::to_float_row(src, dst, D);
        if constexpr (P::kind == placement_kind::kAtAttention)
          p.rope->rotate(dst, n);
        else if constexpr (P::kind == placement_kind::kBlockRelative)
          p.rope->rotate(dst, e.pos0, /*unit=*/true);  // R(slot) is in the stored key
      }
    }
  qf.resize(hd);
  s.resize(nkeys);
  for (std::int32_t i = 0; i < p.num_tokens; ++i) {
    const pos_t m = p.q_pos[i];
    for (std::int32_t h = hb; h < he; ++h)
      for (int g = 0; g < G; ++g) {
        const std::size_t qh = static_cast<std::size_t>(h) * G + g;
        std::copy_n(p.q + (static_cast<std::size_t>(i) * p.num_q_heads + qh) * hd, D, qf.data());
        p.rope->rotate(qf.data(), m);
        const float* kh = kf.data() + static_cast<std::size_t>(h - hb) * nkeys * hd;
        float mx = -INFINITY;
        for (std::size_t t = 0; t < nkeys; ++t) {
          if (kpos[t] > m || (p.window > 0 && kpos[t] <= std::int64_t{m} - p.window)) {
            s[t] = -INFINITY;
            continue;
          }
          s[t] = detail::dot(qf.data(), kh + t * hd, D) * p.scale;
          mx = std::max(mx, s[t]);
        }
        if (mx == -INFINITY) continue;  // no key visible to this row
        double sum = 0;
        for (std::size_t t = 0; t < nkeys; ++t)
          if (s[t] != -INFINITY) {
            s[t] = detail::exp_nonpositive(s[t] - mx);
            sum += s[t];
          }
        const auto inv = static_cast<float>(1.0 / sum);
        for (std::size_t t = 0; t < nkeys; ++t)
          if (s[t] != -INFINITY) p.mass[static_cast<std::size_t>(kpos[t])] += s[t] * inv;
      }
  }
}

RELOKV_NAMESPACE_END
