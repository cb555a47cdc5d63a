#pragma once
/// @file
/// Recompute nothing but the tokens of missed blocks.
#include <cstdint>
#include <span>

#include "relokv/concepts/recompute_strategy.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// Naive PIC; exact for exact hits, and for Block-Attention models trained to read spans that
/// never saw each other.
struct none {
  void select(const request_layout&, std::span<const block_status>,
              std::span<std::uint8_t>) const noexcept {}
  [[nodiscard]] constexpr bool dynamic() const noexcept { return false; }
};
static_assert(recompute_strategy<none>, "recompute::none must model recompute_strategy");

}  // namespace recompute
RELOKV_NAMESPACE_END
