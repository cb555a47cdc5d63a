#pragma once
/// @file
/// MiniPIC request primitives as marker tokens inside a token stream.
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "relokv/layout/detail/assembler.hpp"
#include "relokv/layout/request_layout.hpp"

RELOKV_NAMESPACE_BEGIN

/// Marker token ids, as the engine configures them. A marker id may lie inside the vocabulary
/// (a reserved special token) or outside it; set an unused marker to kNoMarker.
///
/// Grammar (markers are removed, they never reach the model):
///   stream    := prefix? (SEP span | DEP body DEP_END | DEP_LAST n body DEP_END)* tail?
///   - tokens before the first marker form the shared prefix (context of every span);
///   - SEP starts an independent span: the hash chain restarts, what follows is relocatable;
///   - DEP ... DEP_END is a prompt-dependent segment bound to every token before it;
///     DEP_LAST n ... DEP_END binds to the last n tokens only (n is the next stream element);
///   - tokens after DEP_END form a dependent segment bound to everything before (a question);
///   - PAD seals the current block: the next token starts a new block.
/// Every segment starts on a block boundary (block-aligned padding).
struct marker_config {
  static constexpr token_t kNoMarker = std::numeric_limits<token_t>::min();
  token_t separator = kNoMarker;
  token_t dep_begin = kNoMarker;
  token_t dep_begin_last_n = kNoMarker;
  token_t dep_end = kNoMarker;
  token_t pad = kNoMarker;
  std::int64_t vocab_size = std::numeric_limits<token_t>::max();
  std::int32_t block_size = 16;
  std::int32_t max_segment_tokens = 1 << 20;
  std::int32_t max_dep_window = 1 << 20;  ///< at most kMaxDepWindow
};

/// Parses a marker stream into a request_layout.
/// @throws layout_error naming the offset and the rule for a malformed stream.
[[nodiscard]] inline request_layout parse_markers(std::span<const token_t> stream,
                                                  const marker_config& cfg) {
  using K = marker_config;
  const token_t markers[] = {cfg.separator, cfg.dep_begin, cfg.dep_begin_last_n, cfg.dep_end,
                             cfg.pad};
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j)
      if (markers[i] != K::kNoMarker && markers[i] == markers[j])
        throw layout_error(0, layout_rule::kBadConfiguration,
                           "marker id " + std::to_string(markers[i]) + " is used twice");
  if ((cfg.dep_begin != K::kNoMarker || cfg.dep_begin_last_n != K::kNoMarker) &&
      cfg.dep_end == K::kNoMarker)
    throw layout_error(0, layout_rule::kBadConfiguration, "dependency markers need dep_end");
  if (cfg.max_dep_window < 1 || cfg.max_dep_window > kMaxDepWindow)
    throw layout_error(0, layout_rule::kBadConfiguration,
                       "max_dep_window " + std::to_string(cfg.max_dep_window) + " not in [1, " +
                           std::to_string(kMaxDepWindow) + "]");

  detail::layout_assembler a(cfg.block_size, cfg.vocab_size, cfg.max_segment_tokens);
  const auto n = static_cast<std::int64_t>(stream.size());
  bool in_dep = false;
  std::int64_t dep_open_at = 0;
  bool segment_open = false;  // a segment was begun and may still be empty
  bool after_dep = false;     // a dependency closed: the next token opens the tail segment

  auto check_nonempty = [&](std::int64_t at) {
    if (segment_open && a.current_segment_tokens() == 0)
      throw layout_error(at, layout_rule::kEmptySegment,
                         "segment opened at offset " + std::to_string(a.segment_offset()));
  };

  for (std::int64_t i = 0; i < n; ++i) {
    const token_t t = stream[static_cast<std::size_t>(i)];
    if (t == K::kNoMarker) {
      a.push(t, i);  // reports the out-of-vocabulary id
    } else if (t == cfg.separator) {
      if (in_dep) throw layout_error(i, layout_rule::kSeparatorInDependency);
      if (i == n - 1) throw layout_error(i, layout_rule::kSeparatorAtEnd);
      check_nonempty(i);
      a.begin_segment(segment_kind::kSpan, 0, i);
      segment_open = true;
    } else if (t == cfg.dep_begin || t == cfg.dep_begin_last_n) {
      if (in_dep)
        throw layout_error(i, layout_rule::kNestedDependency,
                           "outer dependency opened at offset " + std::to_string(dep_open_at));
      check_nonempty(i);
      std::int32_t window = 0;
      const std::int64_t at = i;
      if (t == cfg.dep_begin_last_n) {
        if (i + 1 >= n) throw layout_error(i, layout_rule::kBadDependencyWindow, "no count");
        const token_t w = stream[static_cast<std::size_t>(++i)];
        if (w < 1 || w > cfg.max_dep_window)
          throw layout_error(i, layout_rule::kBadDependencyWindow, "count " + std::to_string(w));
        window = w;
      }
      in_dep = true;
      dep_open_at = at;
      a.begin_segment(segment_kind::kDependent, window, at);
      segment_open = true;
    } else if (t == cfg.dep_end) {
      if (!in_dep) throw layout_error(i, layout_rule::kUnmatchedDependencyEnd);
      check_nonempty(i);
      in_dep = false;
      segment_open = false;
      // Tokens after a dependency form a segment bound to everything before it (a question),
      // opened by its first token: padding in between is padding, as it is after a span.
      after_dep = true;
    } else if (t == cfg.pad) {
      a.pad();
    } else {
      if (!segment_open) {
        a.begin_segment(after_dep ? segment_kind::kDependent : segment_kind::kPrefix, 0, i);
        segment_open = true;
      }
      a.push(t, i);
    }
  }
  if (in_dep)
    throw layout_error(n, layout_rule::kUnterminatedDependency,
                       "opened at offset " + std::to_string(dep_open_at));
  check_nonempty(n);
  return std::move(a).finish(n);
}

RELOKV_NAMESPACE_END
