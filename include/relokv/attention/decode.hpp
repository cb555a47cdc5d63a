#pragma once
/// @file
/// Host decode attention: one query per sequence (see host_attention.hpp), in positional
/// arguments that forward to paged_attention (params.hpp).
#include <cstdint>
#include <type_traits>

#include "relokv/attention/kv_head_range.hpp"
#include "relokv/attention/params.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN

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
  paged_attention<P>(attention_params<T>{&rope, kv, table, q, q_pos, nullptr, table.num_seqs,
                                         num_q_heads, scale, out, lse, heads});
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

RELOKV_NAMESPACE_END
