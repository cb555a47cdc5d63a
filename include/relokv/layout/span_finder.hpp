#pragma once
/// @file
/// Spans found in a plain prompt's tokens, whatever format joins the passages: what a serving
/// engine calls when a client pastes its retrieved passages into the message text instead of
/// marking them (docs/span-finding.md).
///
/// Two sources of cuts, both in the prompt's own tokens (pieces are never tokenized apart, so
/// the tokens served do not depend on the cuts and full recompute stays exact):
///
///  - **Rules on the text**: every line's content is a chunk, after its indentation and after a
///    label that names the passage's place (`[3] `, `3. `, `Document 3: `, `<doc id="3">`,
///    `- `, a JSON string's opening quote), and before a closing that follows it (`</doc>`, the
///    closing quote). The label and the closing are computed in every request (a dependent
///    segment): they change with the order, the passage does not. A short line without final
///    punctuation (a title) stays with the line after it. Runs longer than `anchor_after`
///    tokens are cut at content-defined anchors.
///  - **Spans seen before** (`span_index`): a rolling hash of every `match_window` tokens of the
///    prompt is looked up among the first tokens of the spans the index remembers; a match whose
///    whole length agrees is cut out as that span, wherever it begins, whatever precedes it on
///    its line. A passage seen once on its own is then found again inline, after a sentence that
///    changes per request, inside a format no rule knows.
///
/// A wrong cut costs reuse, never correctness: the cache verifies every hit by its tokens, so a
/// passage edited by one word is computed, not served as the old one.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "relokv/layout/builder.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// How find_spans cuts.
struct span_finder_options {
  /// A chunk this long or longer is a relocatable span; shorter ones (labels, titles alone,
  /// the newlines between passages) are computed in every request (dependent segments).
  /// One block of the default size: a one-sentence passage (2WikiMultihopQA's are often
  /// 17-31 tokens) is a span; a label (at most 8 tokens or so) never is.
  std::int32_t min_span = 16;
  /// A run this long without a cut is cut at content-defined anchors: a hash of the last
  /// `anchor_window` token ids whose residue mod `anchor_every` is zero, at least `min_span`
  /// tokens after the previous cut. 0: no anchors.
  std::int32_t anchor_after = 512;
  std::int32_t anchor_window = 8;
  std::int32_t anchor_every = 128;
  /// Tokens hashed to find a remembered span's start (at most min_span).
  std::int32_t match_window = 16;
};

/// What a found segment is: relokv's segment kinds, plus the question that closes the prompt.
enum class found_kind : std::uint8_t { kPrefix, kSpan, kDependent, kQuestion };

/// A segment found in a prompt: tokens [begin, end).
struct found_segment {
  found_kind kind = found_kind::kPrefix;
  std::int32_t begin = 0, end = 0;
  /// kSpan only: cut where a span the index remembers matched (not by a rule).
  bool remembered = false;
  friend bool operator==(const found_segment&, const found_segment&) = default;
};

namespace detail::spans {

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Polynomial hashes of every run of a token sequence in O(1) after O(n): h(i, j) over
/// tokens [i, j), each token mixed with a namespace first (a tenant's spans hash apart).
class run_hashes {
 public:
  static constexpr std::uint64_t kBase = 0x100000001b3ULL * 2 + 1;  // odd

  run_hashes(std::span<const token_t> ids, std::uint64_t ns)
      : prefix_(ids.size() + 1), pow_(ids.size() + 1) {
    pow_[0] = 1;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::uint64_t x =
          mix(ns ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(ids[i])) +
                    0x9e3779b97f4a7c15ULL));
      prefix_[i + 1] = prefix_[i] * kBase + x;
      pow_[i + 1] = pow_[i] * kBase;
    }
  }
  [[nodiscard]] std::uint64_t operator()(std::size_t i, std::size_t j) const {
    return mix(prefix_[j] - prefix_[i] * pow_[j - i] + (j - i));
  }

 private:
  std::vector<std::uint64_t> prefix_, pow_;
};

}  // namespace detail::spans

/// The spans a server has cut before, by the hash of their first tokens: what find_spans
/// matches anywhere in a later prompt. Thread-safe (lookups share a lock, remembering takes
/// it alone); bounded: it holds at most `capacity` spans, the least recently remembered going
/// first (two generations: a span remembered again moves to the young one). Only hashes are
/// kept, never text: a false match costs a cut, and the cache verifies every hit by its tokens.
class span_index {
 public:
  explicit span_index(std::size_t capacity = std::size_t{1} << 16)
      : half_(std::max<std::size_t>(capacity / 2, 1)) {}

  /// Remembers the span [begin, end) of a prompt whose run hashes are `h` (min length: the
  /// window). `window` must be the finder's match window.
  void remember(const detail::spans::run_hashes& h, std::size_t begin, std::size_t end,
                std::size_t window) {
    if (end < begin + window || window == 0) return;
    const entry e{h(begin, end), static_cast<std::uint32_t>(end - begin)};
    const std::uint64_t start = h(begin, begin + window);
    std::unique_lock lock(mu_);
    auto& v = young_[start];
    if (std::find(v.begin(), v.end(), e) != v.end()) return;
    if (v.size() >= kPerStart) v.erase(v.begin());
    v.push_back(e);
    if (++young_count_ >= half_) {
      old_ = std::move(young_);
      young_.clear();
      young_count_ = 0;
    }
  }

  /// Calls f(length, whole_hash) for each remembered span whose first `window` tokens hash to
  /// `start`. Caller holds lookup().
  template <class F>
  void each(std::uint64_t start, F&& f) const {
    for (const auto* m : {&young_, &old_}) {
      const auto it = m->find(start);
      if (it == m->end()) continue;
      for (const entry& e : it->second) f(e.length, e.whole);
    }
  }
  /// A shared lock for a scan of lookups.
  [[nodiscard]] std::shared_lock<std::shared_mutex> lookup() const { return std::shared_lock(mu_); }
  /// Spans held (both generations; a span in both counts twice).
  [[nodiscard]] std::size_t size() const {
    std::shared_lock lock(mu_);
    std::size_t n = 0;
    for (const auto* m : {&young_, &old_})
      for (const auto& [k, v] : *m) n += v.size();
    return n;
  }

 private:
  struct entry {
    std::uint64_t whole;
    std::uint32_t length;
    friend bool operator==(const entry&, const entry&) = default;
  };
  static constexpr std::size_t kPerStart = 8;
  using map = std::unordered_map<std::uint64_t, std::vector<entry>>;
  mutable std::shared_mutex mu_;
  map young_, old_;
  std::size_t young_count_ = 0;
  std::size_t half_;
};

namespace detail::spans {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
inline bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/// A line of three or more of - = * _ ~ # + and nothing else (spaces around it aside).
inline bool delimiter_line(std::string_view line) {
  while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
  while (!line.empty() && is_space(line.back())) line.remove_suffix(1);
  return line.size() >= 3 && line.find_first_not_of("-=*_~#+") == std::string_view::npos;
}

/// The length of a label at the start of `s` (0: none): a bullet (- * + • > |), a bracketed
/// or parenthesized tag of up to 24 bytes ([3], (a), [doc 3]), an XML-like tag (<doc id="3">,
/// </doc>), a JSON string's opening (`"`, `["`, `{"text": "`), or a short run of words with a
/// digit ending in : . ) ] or - (3. , 12) , Document 3: , Source #2 -). Spaces after it count.
inline std::size_t label_length(std::string_view s) {
  std::size_t n = 0;
  const auto spaces = [&](std::size_t i) {
    while (i < s.size() && is_blank(s[i])) ++i;
    return i;
  };
  if (s.empty()) return 0;
  const char c = s[0];
  if ((c == '-' || c == '*' || c == '+' || c == '>' || c == '|') && s.size() > 1 && s[1] == ' ')
    return spaces(1);
  if (s.starts_with("\xE2\x80\xA2")) return spaces(3);  // U+2022 BULLET
  if (c == '[' || c == '(') {
    const char close = c == '[' ? ']' : ')';
    const std::size_t e = s.find(close);
    if (e != std::string_view::npos && e <= 24 &&
        s.substr(0, e).find('\n') == std::string_view::npos) {
      n = e + 1;
      if (n < s.size() && (s[n] == ':' || s[n] == '.')) ++n;
      return spaces(n);
    }
  }
  if (c == '<' && s.size() > 2 && (is_alpha(s[1]) || s[1] == '/' || s[1] == '!' || s[1] == '?')) {
    const std::size_t e = s.find('>');
    if (e == std::string_view::npos || e > 96) return 0;
    if (s.substr(1, e - 1).find_first_of("<\n") != std::string_view::npos) return 0;
    return spaces(e + 1);
  }
  // JSON: a string's opening, possibly after [ { , and a key: {"id": 3, "text": "
  {
    std::size_t i = 0;
    bool quote = false;
    while (i < s.size() && i < 96) {
      const char d = s[i];
      if (d == '[' || d == '{' || d == ',' || is_blank(d)) {
        ++i;
        continue;
      }
      if (d == '"') {
        const std::size_t e = s.find('"', i + 1);
        // A key ("text": ) or a number value (3, ) is skipped; the last opening quote ends it.
        if (e != std::string_view::npos && e < 64) {
          std::size_t k = spaces(e + 1);
          if (k < s.size() && s[k] == ':') {
            i = spaces(k + 1);
            while (i < s.size() && (is_digit(s[i]) || s[i] == '-' || s[i] == '.')) ++i;
            continue;
          }
        }
        quote = true;
        n = i + 1;
        break;
      }
      break;
    }
    if (quote) return n;
  }
  // Words and a number before a terminator: "3. ", "12) ", "Document 3: ", "Source #2 - ".
  {
    std::size_t i = 0;
    bool digit = false;
    while (i < s.size() && i < 32 &&
           (is_alpha(s[i]) || is_digit(s[i]) || s[i] == ' ' || s[i] == '#' || s[i] == '_')) {
      digit = digit || is_digit(s[i]);
      ++i;
    }
    if (digit && i > 0 && i < s.size() &&
        (s[i] == ':' || s[i] == '.' || s[i] == ')' || s[i] == ']' || s[i] == '-') &&
        i + 1 < s.size() && (s[i + 1] == ' ' || s[i + 1] == '\t' || s[i + 1] == '\n'))
      return spaces(i + 1);
  }
  return 0;
}

/// The length of a closing at the end of `s` (0: none): trailing tags (</doc>) and, when
/// the line opened a JSON string (`json`), its closing quote and what follows it (", "] "}, ).
inline std::size_t closing_length(std::string_view s, bool json) {
  std::size_t w = s.size();
  for (;;) {
    while (w > 0 && is_space(s[w - 1])) --w;
    if (w > 0 && s[w - 1] == '>') {
      const std::size_t b = s.rfind('<', w - 1);
      if (b != std::string_view::npos && w - b <= 96 && b + 1 < w &&
          (is_alpha(s[b + 1]) || s[b + 1] == '/') &&
          s.substr(b, w - b).find('\n') == std::string_view::npos) {
        w = b;
        continue;
      }
    }
    break;
  }
  if (json) {
    std::size_t k = w;
    while (k > 0 && (s[k - 1] == ',' || s[k - 1] == ']' || s[k - 1] == '}' || is_blank(s[k - 1])))
      --k;
    if (k > 0 && s[k - 1] == '"' && (k < 2 || s[k - 2] != '\\')) w = k - 1;
  }
  return s.size() - w;
}

}  // namespace detail::spans

/// Cuts a prompt's tokens (`pieces[i]` the bytes token i stands for) into segments: the first
/// is the prefix, the last the question, the rest spans or dependent segments, in order and
/// tiling the prompt. `forced` cuts come first (where each message's text starts: the template
/// before the first is the prefix, and a span's key depends on what it was computed behind).
/// With `known`, spans it remembers are matched anywhere after the prefix (in the namespace
/// `ns`: a tenant's), and every span cut is remembered there. Returns one prefix (exact reuse
/// only) when no span is found.
///
/// Cost: O(n) in the prompt's tokens and bytes: one pass over the text, one hash lookup per
/// token (bench/span_finder_bench).
inline std::vector<found_segment> find_spans(std::span<const token_t> ids,
                                             std::span<const std::string> pieces,
                                             const span_finder_options& opt = {},
                                             std::span<const std::int32_t> forced = {},
                                             span_index* known = nullptr, std::uint64_t ns = 0) {
  namespace d = detail::spans;
  const auto n = static_cast<std::int32_t>(std::min(ids.size(), pieces.size()));
  if (n == 0) return {};
  const auto at = [](auto i) { return static_cast<std::size_t>(i); };
  std::string text;
  std::vector<std::size_t> off(at(n) + 1);
  for (std::int32_t i = 0; i < n; ++i) {
    off[at(i)] = text.size();
    text += pieces[at(i)];
  }
  off[at(n)] = text.size();
  const std::string_view all(text);
  const std::int32_t min_span = std::max(opt.min_span, 1);

  // The token holding byte b (the last that starts at or before it).
  const auto token_at = [&](std::size_t b) {
    const auto it = std::upper_bound(off.begin(), off.end() - 1, b);
    return static_cast<std::int32_t>(it - off.begin()) - 1;
  };
  // A chunk starting at byte b starts at the token holding b when what that token holds before
  // b is whitespace (" The" after "[3]"), else at the next token.
  const auto start_cut = [&](std::size_t b) {
    if (b >= all.size()) return n;
    const std::int32_t t = token_at(b);
    for (std::size_t k = off[at(t)]; k < b; ++k)
      if (!d::is_space(all[k])) return t + 1;
    return t;
  };
  // A chunk ending before byte b ends before the token holding b.
  const auto end_cut = [&](std::size_t b) { return b >= all.size() ? n : token_at(b); };

  // 1. Rules on the text, line by line.
  std::vector<std::int32_t> cuts;
  bool join_next = false;  // the line before was a title: this line's content joins it
  for (std::size_t ls = 0; ls < all.size();) {
    std::size_t le = all.find('\n', ls);
    if (le == std::string_view::npos) le = all.size();
    std::size_t cs = ls;
    while (cs < le && d::is_blank(all[cs])) ++cs;
    if (cs == le) {  // a blank line ends a title's reach
      join_next = false;
      ls = le + 1;
      continue;
    }
    std::size_t ts = cs;
    bool labelled = false;
    for (int k = 0; k < 4 && ts < le; ++k) {
      const std::size_t l = d::label_length(all.substr(ts, le - ts));
      if (l == 0) break;
      ts += l;
      labelled = true;
    }
    const bool json = labelled && ts > cs && all[ts - 1] == '"';  // the line opened a string
    std::size_t te0 = le;
    while (te0 > ts && d::is_space(all[te0 - 1])) --te0;
    const std::size_t te =
        te0 - std::min(te0 - ts, d::closing_length(all.substr(ts, te0 - ts), json));
    if (!join_next || labelled) cuts.push_back(start_cut(cs));
    if (ts > cs && ts < te) cuts.push_back(start_cut(ts));
    // Inside the line: inline tags and, in a JSON line, the boundaries between its strings.
    // `tail` is where the line's last chunk starts (a title after an inline tag joins the
    // next line as a title on a line of its own does).
    std::size_t tail = ts;
    for (std::size_t i = json ? ts - 1 : ts; i < te; ++i) {
      if (all[i] == '<' && i + 1 < te && (d::is_alpha(all[i + 1]) || all[i + 1] == '/')) {
        const std::size_t l = d::label_length(all.substr(i, te - i));
        if (l > 0) {
          cuts.push_back(end_cut(i));
          cuts.push_back(start_cut(i + l));
          i += l - 1;
          tail = i + 1;
        }
      } else if (all[i] == '"') {
        // A quoted string after [ , : or { (JSON's values; a quotation after "he said,") of
        // 48 bytes or more: its text is a chunk, the quotes and what joins them are not.
        std::size_t k = i;
        while (k > ls && d::is_blank(all[k - 1])) --k;
        if (k == ls || std::string_view("[,:{").find(all[k - 1]) == std::string_view::npos)
          continue;
        std::size_t j = i + 1;
        while (j < le && !(all[j] == '"' && all[j - 1] != '\\')) ++j;
        if (j >= le) break;
        if (j - i > 48) {
          cuts.push_back(start_cut(i + 1));
          cuts.push_back(end_cut(j));
          tail = te;  // a closed string is no title
        }
        i = j;
      }
    }
    if (te < te0 && te > ts) cuts.push_back(end_cut(te));
    // A token that holds the content's last byte and the line break after it (Qwen's ".\n"
    // and ".\n\n" differ with what follows) is cut off: the passage ends the same everywhere.
    if (te > ts && te == te0 && te < all.size()) {
      const std::int32_t t = token_at(te - 1);
      if (off[at(t) + 1] > te && off[at(t)] > ts) cuts.push_back(t);
    }
    // A title: a short line (or a line's last chunk, after an inline tag) without final
    // punctuation, directly above content (after its label, if any: "[3] Title" then the text).
    const std::string_view content = all.substr(tail, te - std::min(te, tail));
    join_next = !content.empty() && !d::delimiter_line(content) &&
                std::string_view(".:;!?,}>\"").find(content.back()) == std::string_view::npos &&
                end_cut(te) - start_cut(tail) < min_span;
    ls = le + 1;
  }
  for (const std::int32_t f : forced) cuts.push_back(f);
  cuts.erase(
      std::remove_if(cuts.begin(), cuts.end(), [&](std::int32_t c) { return c <= 0 || c >= n; }),
      cuts.end());
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<std::int32_t> hard(forced.begin(), forced.end());
  std::sort(hard.begin(), hard.end());
  hard.erase(
      std::remove_if(hard.begin(), hard.end(), [&](std::int32_t c) { return c <= 0 || c >= n; }),
      hard.end());

  // 2. Spans remembered, matched anywhere after the prefix, never across a forced cut, and
  //    leaving the question at least one token.
  std::vector<std::pair<std::int32_t, std::int32_t>> matched;
  const std::int32_t window = std::clamp(opt.match_window, 1, min_span);
  std::optional<d::run_hashes> hashes;
  if (known != nullptr) hashes.emplace(ids.first(at(n)), ns);
  const std::int32_t lo = cuts.empty() ? n : cuts.front();  // the prefix is never matched
  if (known != nullptr && lo < n) {
    const auto lock = known->lookup();
    for (std::int32_t i = lo; i + window < n;) {
      std::int32_t len = 0;
      const std::uint64_t start = (*hashes)(at(i), at(i + window));
      // The longest remembered span that starts here, fits, and agrees whole.
      known->each(start, [&](std::uint32_t length, std::uint64_t whole) {
        const auto e = static_cast<std::int64_t>(i) + length;
        if (e >= n || static_cast<std::int32_t>(length) <= len) return;
        const auto h = std::upper_bound(hard.begin(), hard.end(), i);
        if (h != hard.end() && *h < e) return;
        if ((*hashes)(at(i), at(e)) != whole) return;
        len = static_cast<std::int32_t>(length);
      });
      if (len > 0) {
        matched.emplace_back(i, i + len);
        i += len;
      } else {
        ++i;
      }
    }
  }
  std::vector<std::int32_t> bounds{0};
  {
    std::size_t m = 0;
    for (const std::int32_t c : cuts) {
      while (m < matched.size() && matched[m].second <= c) ++m;
      if (m < matched.size() && matched[m].first < c && c < matched[m].second) continue;
      bounds.push_back(c);
    }
    for (const auto& [b, e] : matched) {
      bounds.push_back(b);
      bounds.push_back(e);
    }
    bounds.push_back(n);
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  }
  const auto is_matched = [&](std::int32_t b, std::int32_t e) {
    return std::binary_search(matched.begin(), matched.end(), std::pair{b, e});
  };

  // 3. Content-defined anchors inside long runs the rules and the matches left whole.
  if (opt.anchor_after > 0) {
    std::vector<std::int32_t> more;
    const std::int32_t win = std::max(1, opt.anchor_window);
    const auto every = static_cast<std::uint64_t>(std::max(1, opt.anchor_every));
    for (std::size_t c = 0; c + 1 < bounds.size(); ++c) {
      const std::int32_t a = bounds[c], b = bounds[c + 1];
      if (b - a < opt.anchor_after || is_matched(a, b)) continue;
      std::int32_t prev = a;
      for (std::int32_t j = a + std::max(min_span, win); j + min_span <= b; ++j) {
        std::uint64_t h = 0;
        for (std::int32_t k = j - win; k < j; ++k)
          h = d::mix(h ^ static_cast<std::uint32_t>(ids[at(k)]));
        if (j - prev >= min_span && h % every == 0) {
          more.push_back(j);
          prev = j;
        }
      }
    }
    bounds.insert(bounds.end(), more.begin(), more.end());
    std::sort(bounds.begin(), bounds.end());
  }
  if (bounds.size() <= 2) return {{found_kind::kPrefix, 0, n, false}};

  // 4. Kinds: the first chunk is the prefix, the last the question; a chunk of min_span or
  //    more (its trailing whitespace apart) is a span; short ones are computed.
  std::vector<found_segment> out;
  const auto add = [&](found_kind k, std::int32_t a, std::int32_t b, bool remembered) {
    if (a >= b) return;
    if (k == found_kind::kDependent && !out.empty() && out.back().kind == found_kind::kDependent &&
        out.back().end == a) {
      out.back().end = b;
      return;
    }
    out.push_back({k, a, b, remembered});
  };
  const auto all_space = [&](std::int32_t t) {
    const std::string& p = pieces[at(t)];
    return std::all_of(p.begin(), p.end(), d::is_space);
  };
  const std::size_t last = bounds.size() - 2;
  for (std::size_t c = 0; c <= last; ++c) {
    const std::int32_t a = bounds[c], b = bounds[c + 1];
    if (c == 0) {
      add(found_kind::kPrefix, a, b, false);
    } else if (c == last) {
      add(found_kind::kQuestion, a, b, false);
    } else if (is_matched(a, b)) {
      add(found_kind::kSpan, a, b, true);
    } else {
      std::int32_t w = b;
      while (w > a && all_space(w - 1)) --w;
      add(w - a >= min_span ? found_kind::kSpan : found_kind::kDependent, a, w, false);
      add(found_kind::kDependent, w, b, false);
    }
  }
  // What follows the last span is the question (the question's line, the template's close).
  while (out.size() >= 2 && out[out.size() - 2].kind == found_kind::kDependent) {
    out[out.size() - 2].kind = found_kind::kQuestion;
    out[out.size() - 2].end = out.back().end;
    out.pop_back();
  }
  if (std::none_of(out.begin(), out.end(),
                   [](const found_segment& k) { return k.kind == found_kind::kSpan; }))
    return {{found_kind::kPrefix, 0, n, false}};
  if (known != nullptr)
    for (const found_segment& k : out)
      if (k.kind == found_kind::kSpan) known->remember(*hashes, at(k.begin), at(k.end), at(window));
  return out;
}

/// Adds a prompt's found segments to `b` in order: `tokens` are the prompt's (the question
/// segment runs to their end, so a question that grew by generated tokens keeps them).
inline layout_builder& add_found(layout_builder& b, std::span<const token_t> tokens,
                                 std::span<const found_segment> segments) {
  for (const found_segment& g : segments) {
    const auto end =
        g.kind == found_kind::kQuestion ? tokens.size() : static_cast<std::size_t>(g.end);
    const auto part =
        tokens.subspan(static_cast<std::size_t>(g.begin), end - static_cast<std::size_t>(g.begin));
    switch (g.kind) {
      case found_kind::kPrefix:
        b.prefix(part);
        break;
      case found_kind::kSpan:
        b.span(part);
        break;
      case found_kind::kDependent:
        b.dependent(part);
        break;
      case found_kind::kQuestion:
        b.question(part);
        break;
    }
  }
  return b;
}

RELOKV_NAMESPACE_END
