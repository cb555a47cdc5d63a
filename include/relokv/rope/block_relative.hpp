#pragma once
/// @file
/// RoPE placement: keys stored rotated by their offset inside their block.
#include "relokv/concepts/rope_placement.hpp"

RELOKV_NAMESPACE_BEGIN

/// Keys stored as R(slot) k. Since (R(m) q) . (R(pos0 + j) k) = (R(m - pos0) q) . (R(j) k),
/// attention rotates the query once per block by m - pos0 and reads keys as stored: relocation
/// at block granularity is free, and rotation cost drops by the block size.
struct block_relative {
  static constexpr placement_kind kind = placement_kind::kBlockRelative;
  static constexpr bool relocation_rotates_keys = false;
  RELOKV_HOST_DEVICE static constexpr pos_t stored_position(pos_t /*pos*/,
                                                            std::int32_t slot) noexcept {
    return slot;
  }
};
static_assert(rope_placement<block_relative>, "block_relative must model rope_placement");

RELOKV_NAMESPACE_END
