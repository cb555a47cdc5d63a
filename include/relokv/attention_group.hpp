#pragma once
/// @file
/// A group of grouped attention (APE; attention/grouped.hpp, cuda/grouped_attention.cuh) and
/// the check that groups cut a table into consecutive parts: shared by the host and device
/// forms, free of either's kernels.
#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// Blocks [first_block, first_block + num_blocks) of the sequence's table, scores divided by
/// `temperature` (> 0), total weight multiplied by `scale` (> 0).
struct attention_group {
  std::int32_t first_block = 0;
  std::int32_t num_blocks = 0;
  float temperature = 1.0f;
  float scale = 1.0f;
};

/// Checks that the groups are consecutive, in order, cover all `blocks` blocks of a table, and
/// have finite positive temperatures and scales.
[[nodiscard]] inline support validate_group_cover(std::int32_t blocks,
                                                  std::span<const attention_group> groups) {
  std::int32_t next = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const attention_group& a = groups[g];
    if (a.first_block != next || a.num_blocks < 0)
      return {false, "grouped_attention: group " + std::to_string(g) + " starts at block " +
                         std::to_string(a.first_block) + " with " + std::to_string(a.num_blocks) +
                         " blocks; it must start at " + std::to_string(next)};
    if (!(a.temperature > 0.0f) || !std::isfinite(a.temperature) || !(a.scale > 0.0f) ||
        !std::isfinite(a.scale))
      return {false, "grouped_attention: group " + std::to_string(g) +
                         " needs a finite temperature and scale > 0"};
    next += a.num_blocks;
  }
  if (next != blocks)
    return {false, "grouped_attention: the groups cover " + std::to_string(next) + " of the " +
                       std::to_string(blocks) + " blocks"};
  return {};
}

RELOKV_NAMESPACE_END
