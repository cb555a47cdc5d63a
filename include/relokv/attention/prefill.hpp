#pragma once
/// @file
/// Host prefill attention: many queries per sequence at scattered positions (see
/// host_attention.hpp), in positional arguments that forward to paged_attention (params.hpp).
#include <cstdint>
#include <type_traits>

#include "relokv/attention/kv_head_range.hpp"
#include "relokv/attention/params.hpp"
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
  if (table.num_seqs > 0 && q_indptr == nullptr) throw error("prefill_attention: null q_indptr");
  const std::int32_t num_tokens = table.num_seqs > 0 ? q_indptr[table.num_seqs] : 0;
  paged_attention<P>(attention_params<T>{&rope, kv, table, q, q_pos, q_indptr, num_tokens,
                                         num_q_heads, scale, out, lse, heads});
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
