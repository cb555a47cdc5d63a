#pragma once
/// @file
/// Host attention's arguments in one struct, mirroring relokv::cuda::attention_params: what
/// paged_attention (attention/params.hpp) takes, and what each group of queries is computed from.
#include <cstdint>

#include "relokv/attention/kv_head_range.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// One host attention call: decode when q_indptr is null (token t is sequence t, so
/// num_tokens == table.num_seqs), prefill otherwise (sequence s has the queries
/// q_indptr[s] .. q_indptr[s+1], each at its own logical position, scattered or not).
/// Causal by logical position over each sequence's blocks, and windowed where `window` > 0.
template <class T>
struct attention_params {
  const rope_table* rope = nullptr;
  paged_kv_view<const T> kv;
  block_table_view table;
  const float* q = nullptr;                ///< [num_tokens][num_q_heads][head_dim], unrotated
  const pos_t* q_pos = nullptr;            ///< [num_tokens] logical positions
  const std::int32_t* q_indptr = nullptr;  ///< [num_seqs + 1], or nullptr for decode
  std::int32_t num_tokens = 0;
  std::int32_t num_q_heads = 0;
  float scale = 1.0f;
  float* out = nullptr;  ///< [num_tokens][num_q_heads][head_dim]
  /// Optional [num_tokens][num_q_heads]: the natural log of each row's softmax denominator
  /// over the scaled scores, -inf where no key is visible (its `out` row is zeros). Calls over
  /// disjoint parts of a sequence's blocks merge exactly with merge_attention_states.
  float* lse = nullptr;
  /// The share of the KV heads this call computes; only their query heads' rows of `out` and
  /// `lse` are written.
  kv_head_range heads{};
  /// Sliding window (Gemma, Mistral): a query at logical position m sees the keys at logical
  /// positions in (m - window, m], by the reading request's positions, so a relocated block is
  /// windowed where it now stands. 0: no window (a global layer).
  std::int32_t window = 0;
};

RELOKV_NAMESPACE_END
