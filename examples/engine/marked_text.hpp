#pragma once
// marked_text: a prompt's text with the chat template's pieces told apart from text that came
// from outside, so that only the template produces control tokens (tokenizer.hpp).
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace relokv_engine {

/// Text of two kinds, in order: the chat template's own pieces, whose special-token literals
/// are control tokens, and text from outside (a client's message, a retrieved document), every
/// byte of which is text: a special token's literal inside it is tokenized as the ordinary
/// text it spells, so no document can close a turn or open another.
class marked_text {
 public:
  marked_text() = default;
  /// A template piece: its special-token literals become their tokens.
  marked_text& control(std::string_view s) {
    if (!s.empty()) {
      if (!control_.empty() && control_.back().second == text_.size())
        control_.back().second += s.size();
      else
        control_.emplace_back(text_.size(), text_.size() + s.size());
    }
    text_ += s;
    return *this;
  }
  /// Text from outside: never a control token.
  marked_text& plain(std::string_view s) {
    text_ += s;
    return *this;
  }
  marked_text& append(const marked_text& o) {
    for (std::size_t i = 0, at = 0; at <= o.text_.size(); ++i) {
      const std::size_t b = i < o.control_.size() ? o.control_[i].first : o.text_.size();
      plain(std::string_view(o.text_).substr(at, b - at));
      if (i >= o.control_.size()) break;
      control(std::string_view(o.text_).substr(b, o.control_[i].second - b));
      at = o.control_[i].second;
    }
    return *this;
  }
  [[nodiscard]] const std::string& str() const noexcept { return text_; }
  /// Whether bytes [pos, pos + n) lie inside one template piece.
  [[nodiscard]] bool control_at(std::size_t pos, std::size_t n) const noexcept {
    std::size_t lo = 0, hi = control_.size();
    while (lo < hi) {  // the last piece that begins at or before pos
      const std::size_t mid = (lo + hi) / 2;
      if (control_[mid].first <= pos)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo > 0 && pos + n <= control_[lo - 1].second;
  }

 private:
  std::string text_;
  std::vector<std::pair<std::size_t, std::size_t>> control_;  // [begin, end), sorted, disjoint
};

}  // namespace relokv_engine
