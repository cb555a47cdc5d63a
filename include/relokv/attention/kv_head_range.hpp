#pragma once
/// @file
/// The share of the KV heads one attention call computes.
#include <cstdint>
#include <limits>

#include "relokv/config.hpp"

RELOKV_NAMESPACE_BEGIN

/// The KV heads an attention call computes, with the query heads of their groups; the default
/// is every head. Splitting one call into calls over disjoint ranges, one per thread, gives
/// the same output (each range writes only its query heads' rows of `out`): the kernels own no
/// threads, the engine's scheduler decides how many to spend.
struct kv_head_range {
  std::int32_t begin = 0;
  std::int32_t end = std::numeric_limits<std::int32_t>::max();  ///< clamped to num_kv_heads
};

RELOKV_NAMESPACE_END
