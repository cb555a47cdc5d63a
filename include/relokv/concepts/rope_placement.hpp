#pragma once
/// @file
/// The RoPE application-point policy axis.
#include <concepts>
#include <cstdint>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

enum class placement_kind : std::uint8_t { kPreRotated, kAtAttention, kBlockRelative };

/// Where RoPE is applied to keys.
///
/// Requirements:
///  - `P::kind`: its placement_kind;
///  - `P::relocation_rotates_keys`: whether a block reused at another pos0 needs its keys
///    rotated (into a private copy) before attention can read it;
///  - `P::stored_position(pos, slot)`: the position a key at logical `pos`, in slot `slot` of
///    its block, is rotated by when it is written (0 means stored unrotated).
template <class P>
concept rope_placement = requires(pos_t pos, std::int32_t slot) {
  { P::kind } -> std::convertible_to<placement_kind>;
  { P::relocation_rotates_keys } -> std::convertible_to<bool>;
  { P::stored_position(pos, slot) } -> std::same_as<pos_t>;
};

RELOKV_NAMESPACE_END
