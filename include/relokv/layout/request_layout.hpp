#pragma once
/// @file
/// The laid-out request: segments, block-aligned padding and per-block logical extents.
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// Largest block size a layout, a cache or a pool accepts (tokens per block).
inline constexpr std::int32_t kMaxBlockSize = 1 << 12;
/// Largest dependency window: a block's segment tag holds it in 22 bits (see block_tag).
inline constexpr std::int32_t kMaxDepWindow = (1 << 22) - 1;

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
  /// When set, the tokens the spans were computed behind, instead of the prefix: a
  /// sink-absorbing compile (EPIC's LegoLink-0, MEPIC) caches a span behind a few neutral
  /// tokens, as `layout_builder(bs).prefix(absorber).span(doc)`, so that the absorber, not the
  /// span's first tokens, takes the attention sink, and any request naming the same absorber
  /// reuses the span whatever its own prefix. Spans' content keys and identities bind to it.
  std::optional<std::vector<token_t>> span_context;
  /// Nonzero when the layout reads learned rows (span links, layout_builder::links): the
  /// identity of the adapter that gives them (a hash of its file). The cache folds it into every
  /// key of the request (extra_keys::adapter_id), so that blocks computed under one adapter are
  /// never served to a request under another, or under none.
  std::uint64_t adapter_id = 0;

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
  /// What the spans were computed behind: span_context when set, else the prefix.
  [[nodiscard]] std::span<const token_t> span_context_tokens() const noexcept {
    if (span_context) return *span_context;
    return prefix_tokens();
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
  kMalformedLayout,
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
      return "empty segment (a marker opened a segment that no token follows before the next "
             "marker or the end)";
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
    case layout_rule::kMalformedLayout:
      return "request_layout breaks an invariant (build it with layout_builder or parse_markers)";
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

/// Checks every invariant the builder and the marker parser establish, so that a hand-built
/// layout cannot make the cache read or write outside a block: block_size a power of two up to
/// kMaxBlockSize; at least one token, none negative; segments contiguous, non-empty, each
/// starting on a fresh block, a prefix only first, windows only on dependent segments and at
/// most kMaxDepWindow; blocks contiguous, each of 1..block_size tokens inside its segment, and
/// every block but the last sealed (and the last when it is full).
/// @throws layout_error (rule kMalformedLayout) whose offset is the index of the offending
/// segment or block and whose message names the field.
inline void check_layout(const request_layout& l) {
  // Messages are built only on failure: plan() runs this on every request.
  auto fail = [](std::int64_t at, const std::string& what) {
    throw layout_error(at, layout_rule::kMalformedLayout, what);
  };
  auto name = [](const char* array, std::int64_t i, const char* field) {
    return std::string(array) + "[" + std::to_string(i) + "]." + field + " ";
  };
  const std::int32_t bs = l.block_size;
  if (bs <= 0 || bs > kMaxBlockSize || (bs & (bs - 1)) != 0)
    fail(0, "block_size " + std::to_string(bs) + " is not a power of two in [1, " +
                std::to_string(kMaxBlockSize) + "]");
  if (l.tokens.empty()) fail(0, "tokens is empty");
  if (l.tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    fail(0, "tokens holds more than 2^31 - 1 tokens");
  token_t lowest = 0;
  for (const token_t t : l.tokens) lowest = t < lowest ? t : lowest;  // vectorizes
  if (lowest < 0)
    for (std::size_t i = 0; i < l.tokens.size(); ++i)
      if (l.tokens[i] < 0)
        fail(static_cast<std::int64_t>(i),
             "tokens[" + std::to_string(i) + "] = " + std::to_string(l.tokens[i]) + " is negative");
  if (l.span_context)
    for (std::size_t i = 0; i < l.span_context->size(); ++i)
      if ((*l.span_context)[i] < 0)
        fail(static_cast<std::int64_t>(i), "span_context[" + std::to_string(i) +
                                               "] = " + std::to_string((*l.span_context)[i]) +
                                               " is negative");
  if (l.segments.empty()) fail(0, "segments is empty");
  const auto nb = static_cast<std::int64_t>(l.blocks.size());
  std::int64_t next_token = 0, next_block = 0;
  for (std::size_t si = 0; si < l.segments.size(); ++si) {
    const segment& s = l.segments[si];
    const auto at = static_cast<std::int64_t>(si);
    if (s.kind != segment_kind::kPrefix && s.kind != segment_kind::kSpan &&
        s.kind != segment_kind::kDependent)
      fail(at, name("segments", at, "kind") + std::to_string(static_cast<int>(s.kind)) +
                   " is not a segment_kind");
    if (s.kind == segment_kind::kPrefix && si != 0)
      fail(at, name("segments", at, "kind") + "prefix: a prefix must come first");
    if (s.first_token != next_token)
      fail(at, name("segments", at, "first_token") + std::to_string(s.first_token) + " should be " +
                   std::to_string(next_token));
    if (s.first_block != next_block)
      fail(at, name("segments", at, "first_block") + std::to_string(s.first_block) + " should be " +
                   std::to_string(next_block));
    if (s.num_tokens <= 0)
      fail(at, name("segments", at, "num_tokens") + std::to_string(s.num_tokens) + " <= 0");
    if (s.num_blocks <= 0 || next_block + s.num_blocks > nb)
      fail(at, name("segments", at, "num_blocks") + std::to_string(s.num_blocks) + " not in [1, " +
                   std::to_string(nb - next_block) + "]");
    if (s.dep_window < 0 || s.dep_window > kMaxDepWindow ||
        (s.dep_window != 0 && s.kind != segment_kind::kDependent))
      fail(at, name("segments", at, "dep_window") + std::to_string(s.dep_window) +
                   " (only dependent segments have one, in [0, " + std::to_string(kMaxDepWindow) +
                   "])");
    std::int64_t seg_tokens = 0;
    for (std::int64_t b = next_block; b < next_block + s.num_blocks; ++b) {
      const block_extent& e = l.blocks[static_cast<std::size_t>(b)];
      if (e.segment != static_cast<std::int32_t>(si))
        fail(b, name("blocks", b, "segment") + std::to_string(e.segment) + " should be " +
                    std::to_string(si));
      if (e.pos0 != next_token + seg_tokens)
        fail(b, name("blocks", b, "pos0") + std::to_string(e.pos0) + " should be " +
                    std::to_string(next_token + seg_tokens));
      if (e.len <= 0 || e.len > bs)
        fail(b, name("blocks", b, "len") + std::to_string(e.len) + " not in [1, block_size " +
                    std::to_string(bs) + "]");
      if (!e.sealed && (b != nb - 1 || e.len == bs))
        fail(b, name("blocks", b, "sealed") +
                    "is false (only the last block may be open, and only when not full)");
      seg_tokens += e.len;
    }
    if (seg_tokens != s.num_tokens)
      fail(at, name("segments", at, "num_tokens") + std::to_string(s.num_tokens) +
                   " differs from its blocks' " + std::to_string(seg_tokens));
    next_token += s.num_tokens;
    next_block += s.num_blocks;
  }
  if (next_block != nb)
    fail(next_block, "blocks: " + std::to_string(nb - next_block) + " outside every segment");
  if (next_token != static_cast<std::int64_t>(l.tokens.size()))
    fail(0, "tokens holds " + std::to_string(l.tokens.size()) + " tokens, the segments " +
                std::to_string(next_token));
}

RELOKV_NAMESPACE_END
