#pragma once
/// @file
/// The check of a host attention call against its storage (can_implement), and the one entry
/// point the decode and prefill overloads forward to (paged_attention). The call itself,
/// attention_params, is in attention/call.hpp.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "relokv/attention/call.hpp"
#include "relokv/attention/detail/amx_bf16.hpp"
#include "relokv/attention/detail/attend_group.hpp"
#include "relokv/attention/kv_head_range.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

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
  const auto& table = p.table;
  detail::with_path(p.kv, [&](auto path) {  // the path, chosen once per call
    using Path = decltype(path);
    if (p.q_indptr == nullptr) {
      for (std::int32_t s = 0; s < table.num_seqs; ++s)
        detail::attend_group<P, Path, /*Decode=*/true>(p, s, s, 1);
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
        detail::attend_group<P, Path, /*Decode=*/false>(p, s, t, n);
      }
  });
}

RELOKV_NAMESPACE_END
