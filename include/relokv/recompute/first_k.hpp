#pragma once
/// @file
/// EPIC's LegoLink: recompute the first k tokens of every relocated span.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "relokv/concepts/recompute_strategy.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

namespace detail {
/// True when some block of segment s was reused by content (relocated).
inline bool relocated(std::span<const block_status> status, const segment& s) {
  for (std::int32_t b = s.first_block; b < s.first_block + s.num_blocks; ++b)
    if (status[static_cast<std::size_t>(b)] == block_status::kRelocatedHit) return true;
  return false;
}
inline void mark(std::span<std::uint8_t> mask, std::int32_t first, std::int32_t n) {
  if (n > 0) std::fill_n(mask.begin() + first, n, std::uint8_t{1});
}
/// Marks every token of every relocated block: the candidates of CacheBlend and question_topk.
inline void mark_relocated_blocks(const request_layout& l, std::span<const block_status> status,
                                  std::span<std::uint8_t> mask) {
  for (std::int32_t b = 0; b < l.num_blocks(); ++b)
    if (status[static_cast<std::size_t>(b)] == block_status::kRelocatedHit)
      mark(mask, l.blocks[static_cast<std::size_t>(b)].pos0,
           l.blocks[static_cast<std::size_t>(b)].len);
}
/// The tokens of relocated blocks at offsets below `seam` in their segment (the first `seam`
/// tokens of each relocated span).
inline void mark_relocated_seam(const request_layout& l, std::span<const block_status> status,
                                std::span<std::uint8_t> mask, std::int32_t seam) {
  for (std::int32_t b = 0; b < l.num_blocks(); ++b) {
    if (status[static_cast<std::size_t>(b)] != block_status::kRelocatedHit) continue;
    const block_extent& e = l.blocks[static_cast<std::size_t>(b)];
    const std::int32_t first = l.segments[static_cast<std::size_t>(e.segment)].first_token;
    const std::int32_t end = std::min<std::int32_t>(e.len, first + seam - e.pos0);
    if (end > 0) mark(mask, e.pos0, end);
  }
}
}  // namespace detail

/// Recomputes the first k tokens of every span that is reused at a new position: the tokens
/// that attend most to the (now different) text before the span (EPIC, k <= 32, default 16).
/// A span shorter than k is recomputed whole.
class first_k {
 public:
  explicit first_k(std::int32_t k = 16) : k_(k) {
    if (k < 0 || k > 32)
      throw error("first_k: k must be in [0, 32] (EPIC's range), got " + std::to_string(k));
  }
  void select(const request_layout& l, std::span<const block_status> status,
              std::span<std::uint8_t> mask) const {
    for (const segment& s : l.segments)
      if (detail::relocated(status, s))
        detail::mark(mask, s.first_token, std::min(k_, s.num_tokens));
  }
  [[nodiscard]] constexpr bool dynamic() const noexcept { return false; }
  [[nodiscard]] std::int32_t k() const noexcept { return k_; }

 private:
  std::int32_t k_;
};
static_assert(recompute_strategy<first_k>, "recompute::first_k must model recompute_strategy");

}  // namespace recompute
RELOKV_NAMESPACE_END
