#pragma once
/// @file
/// APE (Adaptive Parallel Encoding, arXiv 2502.05431) as a request option: nothing of the
/// relocated spans is recomputed; instead, the tokens after the last span (the question and the
/// answer) attend with grouped attention (attention/grouped.hpp): the prefix, the spans and
/// their own tokens as three groups, the spans' scores divided by a temperature and their total
/// weight multiplied by a scale. Cost: naive PIC's work plus one merge per group.
///
/// Engine protocol: select() is none's (the missed blocks only); groups(layout, table_blocks)
/// gives the three groups of a table whose first blocks are the layout's, and query_start() the
/// first position that attends by them. Positions before it attend plainly.
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "relokv/attention_group.hpp"
#include "relokv/concepts/recompute_strategy.hpp"

RELOKV_NAMESPACE_BEGIN
namespace recompute {

/// APE's attention for the reader of relocated spans (see the file comment).
class ape {
 public:
  /// @param temperature divides the spans' scores at the reader's tokens, (0, 4]
  /// @param scale       multiplies the spans' total attention weight, (0, 4]
  explicit ape(float temperature = 0.9f, float scale = 0.9f) : t_(temperature), s_(scale) {
    if (!(temperature > 0.0f && temperature <= 4.0f) || !(scale > 0.0f && scale <= 4.0f))
      throw error("ape: temperature and scale must be in (0, 4], got " +
                  std::to_string(temperature) + " and " + std::to_string(scale));
  }
  /// Nothing beyond the missed blocks.
  void select(const request_layout&, std::span<const block_status>, std::span<std::uint8_t>) const {
  }
  [[nodiscard]] constexpr bool dynamic() const noexcept { return false; }
  [[nodiscard]] float temperature() const noexcept { return t_; }
  [[nodiscard]] float scale() const noexcept { return s_; }

  /// The first position after the layout's last span (the reader's own tokens: the question
  /// and whatever follows it). A layout without a span has nothing to group, and a layout that
  /// ends with a span has no reader tokens in its prompt: in both every prompt position
  /// attends plainly (num_tokens; decode then attends by the groups).
  [[nodiscard]] static pos_t query_start(const request_layout& l) {
    const std::int32_t last = last_span(l);
    if (last < 0 || static_cast<std::size_t>(last) + 1 == l.segments.size()) return l.num_tokens();
    return l.segments[static_cast<std::size_t>(last) + 1].first_token;
  }
  /// The groups of a table of `table_blocks` blocks whose first ones are the layout's (decode
  /// appends after them), by the segments' kinds: the blocks before the first span (the prefix
  /// and anything else before it; none when the layout starts with a span), the blocks from
  /// the first span to the end of the last (at temperature and scale), and the rest (the
  /// reader's own). Without a span: one group of weight 1, plain attention.
  /// @throws error when the table is shorter than the layout
  [[nodiscard]] std::array<attention_group, 3> groups(const request_layout& l,
                                                      std::int32_t table_blocks) const {
    if (table_blocks < l.num_blocks())
      throw error("ape::groups: a table of " + std::to_string(table_blocks) +
                  " blocks for a layout of " + std::to_string(l.num_blocks()));
    std::int32_t a = 0, b = 0;
    if (const std::int32_t last = last_span(l); last >= 0) {
      std::size_t first = 0;
      while (l.segments[first].kind != segment_kind::kSpan) ++first;
      const segment& end = l.segments[static_cast<std::size_t>(last)];
      a = l.segments[first].first_block;
      b = end.first_block + end.num_blocks;
    }
    return {attention_group{0, a, 1.0f, 1.0f}, attention_group{a, b - a, t_, s_},
            attention_group{b, table_blocks - b, 1.0f, 1.0f}};
  }

 private:
  /// The index of the layout's last span segment, or -1.
  static std::int32_t last_span(const request_layout& l) noexcept {
    for (std::size_t i = l.segments.size(); i-- > 0;)
      if (l.segments[i].kind == segment_kind::kSpan) return static_cast<std::int32_t>(i);
    return -1;
  }

  float t_, s_;
};
static_assert(recompute_strategy<ape>, "recompute::ape must model recompute_strategy");

}  // namespace recompute
RELOKV_NAMESPACE_END
