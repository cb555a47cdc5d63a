#pragma once
/// @file
/// Host prefill attention: many queries per sequence at scattered positions (see
/// host_attention.hpp).
#include <cstdint>
#include <type_traits>

#include "relokv/attention/detail/attend_group.hpp"
#include "relokv/attention/kv_head_range.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN

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
/// so this forwards what `storage.layer(l)` of a non-const pool gives.
template <class P, class T>
requires(!std::is_const_v<T>) void prefill_attention(
    const rope_table& rope, paged_kv_view<T> kv, block_table_view table, const float* q,
    const pos_t* q_pos, const std::int32_t* q_indptr, std::int32_t num_q_heads, float scale,
    float* out, kv_head_range heads = {}, float* lse = nullptr) {
  prefill_attention<P>(rope, paged_kv_view<const T>(kv), table, q, q_pos, q_indptr, num_q_heads,
                       scale, out, heads, lse);
}

RELOKV_NAMESPACE_END
