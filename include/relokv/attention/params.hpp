#pragma once
/// @file
/// Host attention's arguments in one struct, mirroring relokv::cuda::attention_params, the
/// check of a call against its storage (can_implement), and the one entry point the decode and
/// prefill overloads forward to (paged_attention).
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "relokv/attention/detail/amx_bf16.hpp"
#include "relokv/attention/detail/attend_group.hpp"
#include "relokv/attention/kv_head_range.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
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

/// Checks a call before any kernel reads: the pointers, the shapes against the RoPE table and
/// the storage, the head range, every block id and length of the table, and the query ranges.
template <class T>
[[nodiscard]] support can_implement(const attention_params<T>& p) {
  const auto& kv = p.kv;
  if (p.rope == nullptr) return {false, "attention: null rope table"};
  if (kv.num_kv_heads <= 0 || p.num_q_heads <= 0 || p.num_q_heads % kv.num_kv_heads != 0)
    return {false, "attention: num_q_heads (" + std::to_string(p.num_q_heads) +
                       ") must be a positive multiple of num_kv_heads (" +
                       std::to_string(kv.num_kv_heads) + ")"};
  if (kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim || kv.block_size <= 0)
    return {false, "attention: head_dim " + std::to_string(kv.head_dim) + " outside [1, " +
                       std::to_string(kMaxHeadDim) + "] or block_size " +
                       std::to_string(kv.block_size) + " not positive"};
  if (p.rope->config().head_dim != kv.head_dim)
    return {false, "attention: rope head_dim " + std::to_string(p.rope->config().head_dim) +
                       " differs from the KV head_dim " + std::to_string(kv.head_dim)};
  const std::int32_t end = std::min(p.heads.end, kv.num_kv_heads);
  if (p.heads.begin < 0 || p.heads.begin > end)
    return {false, "attention: kv_head_range [" + std::to_string(p.heads.begin) + ", " +
                       std::to_string(p.heads.end) + ") is not a range of the " +
                       std::to_string(kv.num_kv_heads) + " KV heads"};
  if (p.num_tokens < 0) return {false, "attention: negative num_tokens"};
  if (p.window < 0)
    return {false,
            "attention: window must be 0 (none) or positive, got " + std::to_string(p.window)};
  if (p.num_tokens > 0 && (p.q == nullptr || p.q_pos == nullptr || p.out == nullptr))
    return {false, "attention: null q, q_pos or out"};
  if (auto s = validate_block_table(p.table, kv.num_blocks, kv.block_size); !s) return s;
  if (p.table.num_seqs > 0 && kv.data == nullptr) return {false, "attention: null KV storage"};
  if (p.q_indptr == nullptr) {
    if (p.num_tokens != p.table.num_seqs)
      return {false, "attention: decode has one query per sequence, but num_tokens is " +
                         std::to_string(p.num_tokens) + " for " + std::to_string(p.table.num_seqs) +
                         " sequences"};
    return {};
  }
  if (p.q_indptr[0] != 0) return {false, "attention: q_indptr must start at 0"};
  for (std::int32_t s = 0; s < p.table.num_seqs; ++s)
    if (p.q_indptr[s + 1] < p.q_indptr[s])
      return {false, "attention: q_indptr decreases at sequence " + std::to_string(s)};
  if (p.q_indptr[p.table.num_seqs] != p.num_tokens)
    return {false, "attention: q_indptr ends at " + std::to_string(p.q_indptr[p.table.num_seqs]) +
                       ", not at num_tokens (" + std::to_string(p.num_tokens) + ")"};
  return {};
}

/// Paged attention on the host: decode when p.q_indptr is null, prefill otherwise.
/// @tparam P  RoPE placement the keys were written with
/// @throws error with can_implement's reason when the call cannot run; nothing is written then.
template <class P, class T>
void paged_attention(const attention_params<T>& p) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  if (auto s = can_implement(p); !s) throw error(s.reason);
  const rope_table& rope = *p.rope;
  const int hb = p.heads.begin, he = std::min(p.heads.end, p.kv.num_kv_heads);
  const std::size_t stride = static_cast<std::size_t>(p.num_q_heads) * p.kv.head_dim;
  const auto& table = p.table;
  detail::with_path(p.kv, [&](auto path) {  // the path, chosen once per call
    using Path = decltype(path);
    if (p.q_indptr == nullptr) {
      for (std::int32_t s = 0; s < table.num_seqs; ++s)
        detail::attend_group<P, Path, /*Decode=*/true>(
            rope, p.kv, table.entries + table.indptr[s], table.indptr[s + 1] - table.indptr[s],
            p.q + s * stride, p.q_pos + s, 1, p.num_q_heads, p.scale, p.out + s * stride,
            p.lse == nullptr ? nullptr : p.lse + s * p.num_q_heads, hb, he, p.window);
      return;
    }
    // Queries of a sequence in groups that share each block while it is in cache. The AMX
    // kernels (bf16 KV) pack every key tile once per group, so theirs are large: up to 1,024
    // queries (which bounds the scratch).
    std::int32_t group = 16;
    if constexpr (Path::kSimd && std::is_same_v<std::remove_const_t<T>, bf16>)
      if (detail::amx::usable(p.kv.head_dim)) group = 1024;
    for (std::int32_t s = 0; s < table.num_seqs; ++s)
      for (std::int32_t t = p.q_indptr[s]; t < p.q_indptr[s + 1]; t += group) {
        const int n = static_cast<int>(std::min(group, p.q_indptr[s + 1] - t));
        detail::attend_group<P, Path, /*Decode=*/false>(
            rope, p.kv, table.entries + table.indptr[s], table.indptr[s + 1] - table.indptr[s],
            p.q + t * stride, p.q_pos + t, n, p.num_q_heads, p.scale, p.out + t * stride,
            p.lse == nullptr ? nullptr : p.lse + t * p.num_q_heads, hb, he, p.window);
      }
  });
}

RELOKV_NAMESPACE_END
