// Spans found in plain prompts (chunker.hpp).
#include "chunker.hpp"

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace relokv_server {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool all_space(std::string_view s) { return std::all_of(s.begin(), s.end(), is_space); }

/// A line of three or more of - = * _ ~ # + and nothing else (spaces around it aside).
bool delimiter_line(std::string_view line) {
  while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
  while (!line.empty() && is_space(line.back())) line.remove_suffix(1);
  return line.size() >= 3 && line.find_first_not_of("-=*_~#+") == std::string_view::npos;
}

/// Whether the line starting at `s` opens a list item: "- ", "* ", "+ ", "• ", "12. ", "3) ",
/// "[4]" (after up to three spaces of indent).
bool list_item(std::string_view s) {
  std::size_t i = 0;
  while (i < 3 && i < s.size() && s[i] == ' ') ++i;
  s.remove_prefix(i);
  if (s.size() >= 2 && (s[0] == '-' || s[0] == '*' || s[0] == '+') && s[1] == ' ') return true;
  if (s.starts_with("\xE2\x80\xA2 ")) return true;  // U+2022 BULLET
  std::size_t d = s.starts_with("[") ? 1 : 0;
  const std::size_t digits_from = d;
  while (d < s.size() && d - digits_from < 3 && is_digit(s[d])) ++d;
  if (d == digits_from || d >= s.size()) return false;
  if (digits_from == 1) return s[d] == ']';
  return (s[d] == '.' || s[d] == ')') && d + 1 < s.size() && s[d + 1] == ' ';
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<chunk> find_chunks(const std::vector<std::int32_t>& ids,
                               const std::vector<std::string>& pieces, const chunk_options& opt,
                               const std::vector<std::int32_t>& forced) {
  const auto n = static_cast<std::int32_t>(std::min(ids.size(), pieces.size()));
  if (n == 0) return {};
  std::string text;
  std::vector<std::size_t> off(static_cast<std::size_t>(n) + 1);
  for (std::int32_t i = 0; i < n; ++i) {
    off[static_cast<std::size_t>(i)] = text.size();
    text += pieces[static_cast<std::size_t>(i)];
  }
  off[static_cast<std::size_t>(n)] = text.size();
  const std::string_view all(text);

  // Cuts at separators: before a token that starts a line's content.
  std::vector<std::int32_t> cuts{0};
  for (std::int32_t i = 1; i < n; ++i) {
    const std::size_t at = off[static_cast<std::size_t>(i)];
    if (at == 0 || at >= all.size() || all[at - 1] != '\n' || all[at] == '\n' || all[at] == '\r')
      continue;
    std::size_t w = at;
    while (w > 0 && is_space(all[w - 1])) --w;
    const auto newlines = std::count(all.begin() + static_cast<std::ptrdiff_t>(w),
                                     all.begin() + static_cast<std::ptrdiff_t>(at), '\n');
    // The line that just ended: from the newline before it (or the start) to its newline.
    const std::size_t end = at - 1;
    const std::size_t nl = end == 0 ? std::string_view::npos : all.rfind('\n', end - 1);
    const std::size_t begin = nl == std::string_view::npos ? 0 : nl + 1;
    // The line this token starts, to its newline.
    const std::size_t next = all.find('\n', at);
    const std::string_view starts =
        all.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at);
    if (newlines >= 2 || delimiter_line(all.substr(begin, end - begin)) || delimiter_line(starts) ||
        list_item(all.substr(at)))
      cuts.push_back(i);
  }
  for (const std::int32_t f : forced)
    if (f > 0 && f < n) cuts.push_back(f);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  cuts.push_back(n);

  // Content-defined anchors inside long runs without a separator.
  std::vector<std::int32_t> bounds;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    const std::int32_t a = cuts[c], b = cuts[c + 1];
    bounds.push_back(a);
    if (opt.anchor_after <= 0 || b - a < opt.anchor_after) continue;
    const std::int32_t win = std::max(1, opt.anchor_window);
    const auto every = static_cast<std::uint64_t>(std::max(1, opt.anchor_every));
    std::int32_t prev = a;
    for (std::int32_t j = a + std::max(opt.min_span, win); j + opt.min_span <= b; ++j) {
      std::uint64_t h = 0;
      for (std::int32_t k = j - win; k < j; ++k)
        h = mix(h ^ static_cast<std::uint32_t>(ids[static_cast<std::size_t>(k)]));
      if (j - prev >= opt.min_span && h % every == 0) {
        bounds.push_back(j);
        prev = j;
      }
    }
  }
  bounds.push_back(n);
  if (bounds.size() <= 2) return {{chunk_kind::kPrefix, 0, n}};

  std::vector<chunk> out;
  const auto add = [&](chunk_kind k, std::int32_t a, std::int32_t b) {
    if (a >= b) return;
    // Short pieces are computed in every request; neighbours of that kind are one segment.
    if (k == chunk_kind::kDependent && !out.empty() && out.back().kind == chunk_kind::kDependent &&
        out.back().end == a) {
      out.back().end = b;
      return;
    }
    out.push_back({k, a, b});
  };
  const std::size_t last = bounds.size() - 2;
  for (std::size_t c = 0; c <= last; ++c) {
    const std::int32_t a = bounds[c], b = bounds[c + 1];
    if (c == 0) {
      add(chunk_kind::kPrefix, a, b);
      continue;
    }
    if (c == last) {
      add(chunk_kind::kQuestion, a, b);
      continue;
    }
    // The whitespace tokens that end the chunk: a segment of their own.
    std::int32_t w = b;
    while (w > a && all_space(pieces[static_cast<std::size_t>(w - 1)])) --w;
    add(w - a >= opt.min_span ? chunk_kind::kSpan : chunk_kind::kDependent, a, w);
    add(chunk_kind::kDependent, w, b);
  }
  if (std::none_of(out.begin(), out.end(),
                   [](const chunk& k) { return k.kind == chunk_kind::kSpan; }))
    return {{chunk_kind::kPrefix, 0, n}};  // nothing long enough to reuse anywhere else
  return out;
}

}  // namespace relokv_server
