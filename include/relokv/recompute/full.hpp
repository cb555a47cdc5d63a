#pragma once
/// @file
/// Recompute every token: the exact reference.
#include <algorithm>
#include <cstdint>
#include <span>

#include "relokv/concepts/recompute_strategy.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// Every token is computed; the output equals running without any cache.
struct full {
  void select(const request_layout&, std::span<const block_status>,
              std::span<std::uint8_t> mask) const noexcept {
    std::fill(mask.begin(), mask.end(), std::uint8_t{1});
  }
  [[nodiscard]] constexpr bool dynamic() const noexcept { return false; }
};
static_assert(recompute_strategy<full>, "recompute::full must model recompute_strategy");

}  // namespace recompute
RELOKV_NAMESPACE_END
