#pragma once
/// @file
/// Grouped attention with a temperature and a scale per group: APE's attention for the tokens
/// that read independently encoded spans (Adaptive Parallel Encoding, Yang, Chen and Chen,
/// ICLR 2025, arXiv 2502.05431).
///
/// A sequence's blocks are cut into consecutive groups (APE: the shared prefix, the spans, the
/// reader's own tokens). Each group g is attended on its own with its scores divided by T_g,
/// giving the state (o_g, lse_g) where lse_g = LSE(s / T_g); the group's log-weight in the merge
/// is T_g * lse_g + log S_g, and the result is
///   out = sum_g exp(L_g) o_g / sum_g exp(L_g),   L_g = T_g * lse_g + log S_g.
/// With every T and S equal to 1 this is plain attention over all the blocks (up to the
/// rounding of the merge). APE sharpens the spans' scores (T < 1) and scales their total weight
/// (S), so that the reader's attention to many spans encoded in parallel looks like its
/// attention to one sequence. Departures from APE: relokv places the spans one after another
/// (relocated), not all at the position after the prefix; T and S are per call, not per layer.
///
/// The groups are computed by paged_attention (so every placement and host path serves them)
/// and merged with the softmax_merge arithmetic of state.hpp.
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relokv/attention/params.hpp"
#include "relokv/attention/state.hpp"
#include "relokv/attention_group.hpp"

RELOKV_NAMESPACE_BEGIN

/// Checks the groups against a one-sequence call (validate_group_cover on its table).
[[nodiscard]] inline support validate_groups(block_table_view table,
                                             std::span<const attention_group> groups) {
  if (table.num_seqs != 1)
    return {false,
            "grouped_attention: one sequence per call, got " + std::to_string(table.num_seqs)};
  return validate_group_cover(table.indptr[1] - table.indptr[0], groups);
}

/// Grouped attention of p's queries (decode's one or a prefill's, one sequence): see the file
/// comment. p.lse, when set, receives the merged log-weights (log sum_g exp(L_g)).
/// @throws error with can_implement's or validate_groups' reason; nothing is written then.
template <class P, class T>
void grouped_attention(const attention_params<T>& p, std::span<const attention_group> groups) {
  if (auto s = can_implement(p); !s) throw error(s.reason);
  if (auto s = validate_groups(p.table, groups); !s) throw error(s.reason);
  const std::int32_t Hq = p.num_q_heads, D = p.kv.head_dim;
  const std::int32_t G = Hq / p.kv.num_kv_heads;
  const std::int32_t hb = p.heads.begin, he = std::min(p.heads.end, p.kv.num_kv_heads);
  const auto rows = static_cast<std::size_t>(p.num_tokens) * static_cast<std::size_t>(Hq);
  const auto hd = static_cast<std::size_t>(D);
  thread_local std::vector<float> acc, acc_lse, part, part_lse;
  acc.assign(rows * hd, 0.0f);
  acc_lse.assign(rows, -INFINITY);
  part.resize(rows * hd);
  part_lse.resize(rows);
  const block_entry* entries = p.table.entries + p.table.indptr[0];
  for (const attention_group& g : groups) {
    if (g.num_blocks == 0) continue;
    const std::int32_t ind[2] = {0, g.num_blocks};
    attention_params<T> q = p;
    q.table = {entries + g.first_block, ind, 1};
    q.scale = p.scale / g.temperature;
    q.out = part.data();
    q.lse = part_lse.data();
    paged_attention<P>(q);
    const float log_s = std::log(g.scale);
    for (std::int32_t t = 0; t < p.num_tokens; ++t) {
      const auto r0 = static_cast<std::size_t>(t) * Hq + static_cast<std::size_t>(hb) * G;
      const auto n = static_cast<std::size_t>(he - hb) * G;
      for (std::size_t r = r0; r < r0 + n; ++r)
        if (part_lse[r] != -INFINITY) part_lse[r] = g.temperature * part_lse[r] + log_s;
      merge_attention_states(n, D, acc.data() + r0 * hd, acc_lse.data() + r0, part.data() + r0 * hd,
                             part_lse.data() + r0);
    }
  }
  for (std::int32_t t = 0; t < p.num_tokens; ++t) {
    const auto r0 = static_cast<std::size_t>(t) * Hq + static_cast<std::size_t>(hb) * G;
    const auto n = static_cast<std::size_t>(he - hb) * G;
    std::copy_n(acc.data() + r0 * hd, n * hd, p.out + r0 * hd);
    if (p.lse != nullptr) std::copy_n(acc_lse.data() + r0, n, p.lse + r0);
  }
}

RELOKV_NAMESPACE_END
