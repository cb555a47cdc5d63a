#pragma once
/// @file
/// KVBoost's seam window: recompute the tokens next to every seam.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "relokv/recompute/first_k.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// A seam is a segment boundary where a relocated span meets text it was not computed with.
/// Recomputes the last `before` tokens of a relocated span ahead of every seam (the tokens that
/// what follows attends to most, whose cached values saw another context) and, optionally, the
/// first `after` tokens of a relocated span behind a seam (default before = 16, after = 0).
/// Exact and missed segments are left alone: the former are right, the latter are computed
/// anyway. This is KVBoost's selective repair alone; KVBoost itself adds CacheBlend for
/// approximate (content-key) matches, which every relocated span is: recompute::kvboost()
/// (deviation_topk.hpp) is the whole of it.
class seam_window {
 public:
  explicit seam_window(std::int32_t before = 16, std::int32_t after = 0)
      : before_(before), after_(after) {
    if (before < 0 || after < 0)
      throw error("seam_window: window sizes must be non-negative, got " + std::to_string(before) +
                  " and " + std::to_string(after));
  }
  void select(const request_layout& l, std::span<const block_status> status,
              std::span<std::uint8_t> mask) const {
    for (std::size_t i = 1; i < l.segments.size(); ++i) {
      const segment& prev = l.segments[i - 1];
      const segment& next = l.segments[i];
      if (detail::relocated(status, prev)) {
        const std::int32_t n = std::min(before_, prev.num_tokens);
        detail::mark(mask, prev.first_token + prev.num_tokens - n, n);
      }
      if (detail::relocated(status, next))
        detail::mark(mask, next.first_token, std::min(after_, next.num_tokens));
    }
  }
  [[nodiscard]] constexpr bool dynamic() const noexcept { return false; }
  [[nodiscard]] std::int32_t before() const noexcept { return before_; }
  [[nodiscard]] std::int32_t after() const noexcept { return after_; }

 private:
  std::int32_t before_, after_;
};
static_assert(recompute_strategy<seam_window>,
              "recompute::seam_window must model recompute_strategy");

}  // namespace recompute
RELOKV_NAMESPACE_END
