#pragma once
/// @file
/// The laid-out request: segments, block-aligned padding and per-block logical extents.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// What a segment may be reused as.
enum class segment_kind : std::uint8_t {
  kPrefix,     ///< shared prefix at position 0: reused by exact (context) key only
  kSpan,       ///< independent span: relocatable, keyed by its tokens and its context (the prefix)
  kDependent,  ///< prompt-dependent: bound to all (or the last n) tokens before it
};

/// One segment of a request. Every segment starts on a block boundary.
struct segment {
  segment_kind kind = segment_kind::kPrefix;
  std::int32_t first_token = 0;  ///< logical position of its first token
  std::int32_t num_tokens = 0;
  std::int32_t first_block = 0;
  std::int32_t num_blocks = 0;
  /// kDependent only: 0 binds to every token before the segment, n > 0 to the last n.
  std::int32_t dep_window = 0;
  friend bool operator==(const segment&, const segment&) = default;
};

/// One block of a request: logical positions pos0 .. pos0+len-1 in slots 0 .. len-1; slots
/// len .. block_size-1 are padding, masked and never attended.
struct block_extent {
  pos_t pos0 = 0;
  std::int32_t len = 0;
  std::int32_t segment = 0;  ///< index into request_layout::segments
  /// Sealed blocks are complete (full, closed by padding before the next segment, or the end
  /// of a span) and may be cached; only the request's last block can be unsealed (decode
  /// appends to it). Decode never appends to a sealed block: its next token starts a new one.
  bool sealed = false;
  friend bool operator==(const block_extent&, const block_extent&) = default;
};

/// A request after the MiniPIC primitives are applied. Padding does not consume positions:
/// token i of `tokens` sits at logical position i, exactly where it would be without caching.
struct request_layout {
  std::int32_t block_size = 16;
  std::vector<token_t> tokens;  ///< real tokens in logical order (markers removed)
  std::vector<segment> segments;
  std::vector<block_extent> blocks;

  [[nodiscard]] std::int32_t num_tokens() const noexcept {
    return static_cast<std::int32_t>(tokens.size());
  }
  [[nodiscard]] std::int32_t num_blocks() const noexcept {
    return static_cast<std::int32_t>(blocks.size());
  }
  /// Tokens held by block b.
  [[nodiscard]] std::span<const token_t> block_tokens(std::int32_t b) const noexcept {
    const block_extent& e = blocks[static_cast<std::size_t>(b)];
    return std::span<const token_t>(tokens).subspan(static_cast<std::size_t>(e.pos0),
                                                    static_cast<std::size_t>(e.len));
  }
  /// Tokens of the shared prefix (empty when the request has none): the context of its spans.
  [[nodiscard]] std::span<const token_t> prefix_tokens() const noexcept {
    if (segments.empty() || segments.front().kind != segment_kind::kPrefix) return {};
    return std::span<const token_t>(tokens).first(
        static_cast<std::size_t>(segments.front().num_tokens));
  }
  friend bool operator==(const request_layout&, const request_layout&) = default;
};

/// Rules a request can break; layout_error names the one broken.
enum class layout_rule : std::uint8_t {
  kEmptyRequest,
  kTokenOutOfVocabulary,
  kSeparatorAtEnd,
  kEmptySegment,
  kNestedDependency,
  kUnterminatedDependency,
  kUnmatchedDependencyEnd,
  kBadDependencyWindow,
  kSeparatorInDependency,
  kSpanTooLong,
  kBadConfiguration,
  kBuilderOrder,
};

/// Human-readable statement of a rule.
[[nodiscard]] inline const char* describe(layout_rule r) noexcept {
  switch (r) {
    case layout_rule::kEmptyRequest:
      return "a request needs at least one token";
    case layout_rule::kTokenOutOfVocabulary:
      return "token id outside the vocabulary";
    case layout_rule::kSeparatorAtEnd:
      return "span separator at the very end (a separator must be followed by a span)";
    case layout_rule::kEmptySegment:
      return "empty segment (two markers with no tokens between them)";
    case layout_rule::kNestedDependency:
      return "nested dependency (a dependency opened inside another; close it first)";
    case layout_rule::kUnterminatedDependency:
      return "unterminated dependency (no dependency-end marker before the end)";
    case layout_rule::kUnmatchedDependencyEnd:
      return "dependency-end marker without an open dependency";
    case layout_rule::kBadDependencyWindow:
      return "dependency window must be followed by a count in 1..max_dep_window";
    case layout_rule::kSeparatorInDependency:
      return "span separator inside a dependent segment";
    case layout_rule::kSpanTooLong:
      return "segment longer than the configured max_segment_tokens";
    case layout_rule::kBadConfiguration:
      return "invalid configuration";
    case layout_rule::kBuilderOrder:
      return "builder calls out of order (prefix first, question last)";
  }
  return "unknown rule";
}

/// Thrown for a malformed request: names the offset in the input and the rule broken.
class layout_error : public error {
 public:
  layout_error(std::int64_t offset, layout_rule rule, const std::string& detail = {})
      : error("malformed request at offset " + std::to_string(offset) + ": " + describe(rule) +
              (detail.empty() ? std::string() : " (" + detail + ")")),
        offset_(offset),
        rule_(rule) {}
  /// Offset in the marker stream (or index of the builder call) where the rule broke.
  [[nodiscard]] std::int64_t offset() const noexcept { return offset_; }
  [[nodiscard]] layout_rule rule() const noexcept { return rule_; }

 private:
  std::int64_t offset_;
  layout_rule rule_;
};

RELOKV_NAMESPACE_END
