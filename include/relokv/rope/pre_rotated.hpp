#pragma once
/// @file
/// RoPE placement: keys stored rotated at their absolute position (the usual engine layout).
#include "relokv/concepts/rope_placement.hpp"

RELOKV_NAMESPACE_BEGIN

/// Keys stored as R(pos) k. Attention reads them as they are; relocating a block to another
/// pos0 needs a delta rotation R(new - old) into a private copy (the LMCache/CacheBlend way).
struct pre_rotated {
  static constexpr placement_kind kind = placement_kind::kPreRotated;
  static constexpr bool relocation_rotates_keys = true;
  RELOKV_HOST_DEVICE static constexpr pos_t stored_position(pos_t pos,
                                                            std::int32_t /*slot*/) noexcept {
    return pos;
  }
};
static_assert(rope_placement<pre_rotated>, "pre_rotated must model rope_placement");

RELOKV_NAMESPACE_END
