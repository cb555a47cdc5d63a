#pragma once
/// @file
/// Attention state of parts of a sequence's keys, and merging them exactly.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "relokv/attention/softmax.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

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
    float fa = 0.0f, fb = 0.0f;
    softmax_merge(
        la, lb, fa, fb, lse[r], [](float x) { return std::exp(x); },
        [](float x) { return std::log(x); });
    for (std::size_t d = 0; d < hd; ++d) o[d] = fa * o[d] + fb * ob[d];
  }
}

RELOKV_NAMESPACE_END
