#pragma once
/// @file
/// Shared by the marker parser and the builder: appends segments with block-aligned padding.
#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "relokv/layout/request_layout.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

class layout_assembler {
 public:
  layout_assembler(std::int32_t block_size, std::int64_t vocab_size, std::int32_t max_segment)
      : vocab_size_(vocab_size), max_segment_(max_segment) {
    if (block_size <= 0 || block_size > kMaxBlockSize ||
        !std::has_single_bit(static_cast<std::uint32_t>(block_size)))
      throw layout_error(0, layout_rule::kBadConfiguration,
                         "block_size must be a power of two in [1, " +
                             std::to_string(kMaxBlockSize) + "], got " +
                             std::to_string(block_size));
    if (vocab_size <= 0)
      throw layout_error(0, layout_rule::kBadConfiguration, "vocab_size must be positive");
    if (max_segment <= 0)
      throw layout_error(0, layout_rule::kBadConfiguration, "max_segment_tokens must be positive");
    out_.block_size = block_size;
  }

  /// Starts a new segment on a fresh block. `offset` is where it starts in the input.
  void begin_segment(segment_kind kind, std::int32_t dep_window, std::int64_t offset) {
    pad();
    segment s;
    s.kind = kind;
    s.dep_window = dep_window;
    s.first_token = out_.num_tokens();
    s.first_block = out_.num_blocks();
    out_.segments.push_back(s);
    segment_offset_ = offset;
  }

  /// Appends one token of the current segment; `offset` locates it in the input for errors.
  void push(token_t t, std::int64_t offset) {
    if (t < 0 || t >= vocab_size_)
      throw layout_error(
          offset, layout_rule::kTokenOutOfVocabulary,
          "id " + std::to_string(t) + " not in [0, " + std::to_string(vocab_size_) + ")");
    segment& s = out_.segments.back();
    if (s.num_tokens >= max_segment_)
      throw layout_error(offset, layout_rule::kSpanTooLong,
                         "limit " + std::to_string(max_segment_) + " tokens");
    if (!block_open_) {
      block_extent e;
      e.pos0 = out_.num_tokens();
      e.segment = static_cast<std::int32_t>(out_.segments.size()) - 1;
      out_.blocks.push_back(e);
      ++s.num_blocks;
      block_open_ = true;
    }
    block_extent& b = out_.blocks.back();
    ++b.len;
    out_.tokens.push_back(t);
    ++s.num_tokens;
    if (b.len == out_.block_size) pad();
  }

  /// Block-aligned padding: seals the open block, so the next token starts a new one.
  void pad() noexcept {
    if (block_open_) out_.blocks.back().sealed = true;
    block_open_ = false;
  }

  [[nodiscard]] std::int32_t current_segment_tokens() const noexcept {
    return out_.segments.empty() ? 0 : out_.segments.back().num_tokens;
  }
  [[nodiscard]] std::int64_t segment_offset() const noexcept { return segment_offset_; }

  /// Finishes the layout. A last block left open is unsealed (decode appends to it) unless it
  /// ends a span: spans are padded on both sides, so a span is cached whole even when it ends
  /// the request (a document cached on its own), and decode starts a new block after it.
  request_layout finish(std::int64_t end_offset) && {
    if (out_.tokens.empty()) throw layout_error(end_offset, layout_rule::kEmptyRequest);
    if (block_open_) out_.blocks.back().sealed = out_.segments.back().kind == segment_kind::kSpan;
    return std::move(out_);
  }

 private:
  request_layout out_;
  std::int64_t vocab_size_;
  std::int32_t max_segment_;
  std::int64_t segment_offset_ = 0;
  bool block_open_ = false;
};

}  // namespace detail
RELOKV_NAMESPACE_END
