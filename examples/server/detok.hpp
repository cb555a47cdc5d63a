#pragma once
// An answer's text one token at a time (relokv_server's output path): each token costs the
// decoding of a few tokens around it, not of the whole answer.
#include <cstddef>
#include <string>
#include <vector>

#include <relokv/types.hpp>

#include "tokenizer.hpp"

namespace relokv_server {

/// The text of a growing token sequence, equal after every push() to the tokenizer's decode of
/// the whole sequence. A token's text is the difference between decoding the few tokens before
/// it with and without it, so that a decode whose output for a token depends on its neighbours
/// (a leading space dropped at the start, bytes joined into a character) still extends the
/// text exactly; where that is not a clean extension, the whole is decoded again. (On the
/// project's three tokenizers a token decoded alone is already its exact piece: the context
/// is what keeps it right for a tokenizer where it is not.)
class incremental_text {
 public:
  static constexpr std::size_t kContext = 4;  ///< tokens decoded before the new one

  explicit incremental_text(const relokv_engine::tokenizer& tok) : tok_(&tok) {}

  /// Appends a token; returns the whole text so far.
  const std::string& push(relokv::token_t t) {
    const std::size_t n = tokens_.size();
    const std::size_t from = n > kContext ? n - kContext : 0;
    std::vector<relokv::token_t> tail(tokens_.begin() + static_cast<std::ptrdiff_t>(from),
                                      tokens_.end());
    const std::string before = tok_->decode(tail);
    tail.push_back(t);
    const std::string after = tok_->decode(tail);
    tokens_.push_back(t);
    if (after.size() >= before.size() && after.compare(0, before.size(), before) == 0 &&
        text_.size() >= before.size() &&
        text_.compare(text_.size() - before.size(), before.size(), before) == 0) {
      text_.append(after, before.size());
    } else {
      text_ = tok_->decode(tokens_);
      ++redecoded_;
    }
    return text_;
  }
  [[nodiscard]] const std::string& text() const noexcept { return text_; }
  [[nodiscard]] const std::vector<relokv::token_t>& tokens() const noexcept { return tokens_; }
  /// Pushes that decoded the whole sequence again.
  [[nodiscard]] std::size_t redecoded() const noexcept { return redecoded_; }

 private:
  const relokv_engine::tokenizer* tok_;
  std::vector<relokv::token_t> tokens_;
  std::string text_;
  std::size_t redecoded_ = 0;
};

}  // namespace relokv_server
