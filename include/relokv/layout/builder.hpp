#pragma once
/// @file
/// MiniPIC request primitives as builder calls; produces the same request_layout as the markers.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "relokv/layout/detail/assembler.hpp"
#include "relokv/layout/request_layout.hpp"

RELOKV_NAMESPACE_BEGIN

/// Learned rows an adapter adds to a request (span links, docs/strategies.md "Links"): ids past
/// the model's vocabulary that the engine reads as the adapter's embedding rows.
struct link_rows {
  /// Identity of the adapter (a hash of its file, nonzero): the layout carries it and the cache
  /// keys every block of the request under it (request_layout::adapter_id).
  std::uint64_t adapter_id = 0;
  /// The id of the adapter's row 0: the model's vocabulary size.
  token_t first_id = 0;
  /// Rows placed before each span's tokens: computed when the span is compiled and cached and
  /// relocated with it (ids first_id .. first_id + header - 1).
  std::int32_t header = 0;
  /// Rows placed before the question and computed in every request, attending to every span
  /// before them (ids first_id + header + trailer .. + before_question - 1).
  std::int32_t before_question = 0;
  /// Rows placed after each span's tokens, compiled, cached and relocated with it like the
  /// header (ids first_id + header .. first_id + header + trailer - 1).
  std::int32_t trailer = 0;
  friend bool operator==(const link_rows&, const link_rows&) = default;
};

/// Builds a request_layout segment by segment:
/// @code
///   auto layout = relokv::layout_builder(16, vocab)
///                     .prefix(system_prompt)   // shared prefix, the spans' context
///                     .span(doc_a)             // relocatable
///                     .span(doc_b)
///                     .question(question)      // bound to everything before it
///                     .build();
/// @endcode
/// Errors carry the index of the offending call as their offset.
class layout_builder {
 public:
  explicit layout_builder(std::int32_t block_size = 16,
                          std::int64_t vocab_size = std::numeric_limits<token_t>::max(),
                          std::int32_t max_segment_tokens = 1 << 20)
      : block_size_(block_size), vocab_size_(vocab_size), max_segment_(max_segment_tokens) {}

  /// The shared prefix. Must come first, at most once.
  layout_builder& prefix(std::span<const token_t> tokens) {
    if (!parts_.empty()) throw layout_error(calls(), layout_rule::kBuilderOrder, "prefix");
    return add(segment_kind::kPrefix, tokens, 0);
  }
  /// An independent, relocatable span computed in the context of the prefix.
  layout_builder& span(std::span<const token_t> tokens) {
    return add(segment_kind::kSpan, tokens, 0);
  }
  /// The tokens this request's spans were computed behind, instead of the prefix (see
  /// request_layout::span_context: a sink-absorbing compile). Any time before build(); may be
  /// empty (spans computed at position 0, nothing before them).
  layout_builder& span_context(std::span<const token_t> tokens) {
    span_context_.emplace(tokens.begin(), tokens.end());
    return *this;
  }
  /// A prompt-dependent segment bound to all tokens before it (last_n == 0) or the last n,
  /// 0 <= last_n <= kMaxDepWindow.
  layout_builder& dependent(std::span<const token_t> tokens, std::int32_t last_n = 0) {
    if (last_n < 0 || last_n > kMaxDepWindow)
      throw layout_error(calls(), layout_rule::kBadDependencyWindow,
                         "last_n " + std::to_string(last_n) + " not in [0, " +
                             std::to_string(kMaxDepWindow) + "]");
    return add(segment_kind::kDependent, tokens, last_n);
  }
  /// The question: a dependent segment bound to everything before it; it ends the request.
  layout_builder& question(std::span<const token_t> tokens) {
    add(segment_kind::kDependent, tokens, 0);
    parts_.back().question = true;
    closed_ = true;
    return *this;
  }
  /// Reads an adapter's learned rows (any time before build()): its header rows open every
  /// span and its trailer rows close it, its link rows open the question; the layout carries
  /// the adapter's identity.
  /// @throws layout_error (kBadConfiguration) for a zero identity, a negative count, or ids
  /// that would not fit a token_t
  layout_builder& links(const link_rows& r) {
    if (r.adapter_id == 0 || r.first_id < 0 || r.header < 0 || r.before_question < 0 ||
        r.trailer < 0 ||
        std::int64_t{r.first_id} + r.header + r.trailer + r.before_question >
            std::numeric_limits<token_t>::max())
      throw layout_error(calls(), layout_rule::kBadConfiguration,
                         "link_rows: adapter_id must be nonzero, first_id and the counts "
                         "non-negative, and every row id a token_t");
    links_ = r;
    return *this;
  }

  /// @throws layout_error for an empty request, an empty segment, a token outside the
  /// vocabulary or a segment over the limit.
  [[nodiscard]] request_layout build() const {
    // Learned rows sit past the vocabulary: the assembler admits them, the callers' tokens
    // are held to the vocabulary here.
    const std::int64_t rows =
        links_ ? std::int64_t{links_->header} + links_->trailer + links_->before_question : 0;
    const std::int64_t limit =
        links_ ? std::max<std::int64_t>(vocab_size_, std::int64_t{links_->first_id} + rows)
               : vocab_size_;
    detail::layout_assembler a(block_size_, limit, max_segment_);
    for (std::size_t c = 0; c < parts_.size(); ++c) {
      const part& p = parts_[c];
      const auto at = static_cast<std::int64_t>(c);
      if (p.tokens.empty()) throw layout_error(at, layout_rule::kEmptySegment, "builder call");
      a.begin_segment(p.kind, p.window, at);
      const bool wrapped = links_ && p.kind == segment_kind::kSpan;
      if (wrapped)
        for (std::int32_t i = 0; i < links_->header; ++i) a.push(links_->first_id + i, at);
      if (links_ && p.question)
        for (std::int32_t i = 0; i < links_->before_question; ++i)
          a.push(links_->first_id + links_->header + links_->trailer + i, at);
      for (token_t t : p.tokens) {
        if (t >= vocab_size_)
          throw layout_error(
              at, layout_rule::kTokenOutOfVocabulary,
              "id " + std::to_string(t) + " not in [0, " + std::to_string(vocab_size_) + ")");
        a.push(t, at);
      }
      if (wrapped)
        for (std::int32_t i = 0; i < links_->trailer; ++i)
          a.push(links_->first_id + links_->header + i, at);
    }
    request_layout l = std::move(a).finish(static_cast<std::int64_t>(parts_.size()));
    if (links_) l.adapter_id = links_->adapter_id;
    if (span_context_) {
      for (token_t t : *span_context_)
        if (t < 0 || t >= vocab_size_)
          throw layout_error(static_cast<std::int64_t>(parts_.size()),
                             layout_rule::kTokenOutOfVocabulary,
                             "span_context token " + std::to_string(t));
      l.span_context = span_context_;
    }
    return l;
  }

 private:
  struct part {
    segment_kind kind;
    std::int32_t window;
    std::vector<token_t> tokens;
    bool question = false;
  };
  [[nodiscard]] std::int64_t calls() const noexcept {
    return static_cast<std::int64_t>(parts_.size());
  }
  layout_builder& add(segment_kind k, std::span<const token_t> tokens, std::int32_t window) {
    if (closed_) throw layout_error(calls(), layout_rule::kBuilderOrder, "after question");
    parts_.push_back(part{k, window, std::vector<token_t>(tokens.begin(), tokens.end())});
    return *this;
  }

  std::int32_t block_size_;
  std::int64_t vocab_size_;
  std::int32_t max_segment_;
  std::vector<part> parts_;
  std::optional<std::vector<token_t>> span_context_;
  std::optional<link_rows> links_;
  bool closed_ = false;
};

RELOKV_NAMESPACE_END
