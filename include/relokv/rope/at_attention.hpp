#pragma once
/// @file
/// RoPE placement: keys stored unrotated; attention rotates each key at its logical position.
#include "relokv/concepts/rope_placement.hpp"

RELOKV_NAMESPACE_BEGIN

/// Keys stored as k (MiniPIC). Any block is valid at any pos0; attention pays one rotation per
/// key and query group.
struct at_attention {
  static constexpr placement_kind kind = placement_kind::kAtAttention;
  static constexpr bool relocation_rotates_keys = false;
  RELOKV_HOST_DEVICE static constexpr pos_t stored_position(pos_t /*pos*/,
                                                            std::int32_t /*slot*/) noexcept {
    return 0;
  }
};
static_assert(rope_placement<at_attention>, "at_attention must model rope_placement");

RELOKV_NAMESPACE_END
