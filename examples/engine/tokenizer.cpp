// Byte-level BPE (see tokenizer.hpp).
#include "tokenizer.hpp"
#include "unicode_tables.hpp"

#include <algorithm>
#include <functional>
#include <queue>
#include <span>
#include <stdexcept>
#include <string_view>

namespace relokv_engine {
namespace {

std::string utf8(std::uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Character classes of the pre-tokenizer regexes: \p{L}, \p{N}, \s (White_Space) and the
// rest, by the code point a byte belongs to (so a curly quote is punctuation, not a letter).
enum class cls : std::uint8_t { kSpace, kLetter, kNumber, kOther };

bool in(std::span<const unicode::code_range> table, std::uint32_t cp) {
  const auto it =
      std::upper_bound(table.begin(), table.end(), cp,
                       [](std::uint32_t c, const unicode::code_range& r) { return c < r.lo; });
  return it != table.begin() && cp <= (it - 1)->hi;
}

cls class_of(std::uint32_t cp) {
  if (cp < 0x80) {
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return cls::kSpace;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return cls::kLetter;
    if (cp >= '0' && cp <= '9') return cls::kNumber;
    return cls::kOther;
  }
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
      cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return cls::kSpace;
  if (in(unicode::kLetters, cp)) return cls::kLetter;
  if (in(unicode::kNumbers, cp)) return cls::kNumber;
  return cls::kOther;
}

/// The text as code points: for each, its byte offset and class (a byte that does not start
/// a valid UTF-8 sequence is one code point of class kOther, so any bytes tokenize).
/// The text's code points: 6 bytes each, reserved once (the pre-tokenizer's only memory that
/// grows with the text; its pieces are handed on one at a time).
struct code_points {
  std::vector<std::uint32_t> at;  // byte offset of each code point, then the end
  std::vector<cls> kind;
  std::vector<char> cp;  // the code point when ASCII (all the patterns compare), else 0
  explicit code_points(std::string_view s) {
    if (s.size() >= 0xFFFFFFFFu) throw std::length_error("tokenizer: text of 4 GiB or more");
    at.reserve(s.size() + 1);
    kind.reserve(s.size());
    cp.reserve(s.size());
    for (std::size_t i = 0; i < s.size();) {
      const auto c = static_cast<unsigned char>(s[i]);
      std::size_t len = c < 0x80         ? 1
                        : (c >> 5) == 6  ? 2
                        : (c >> 4) == 14 ? 3
                        : (c >> 3) == 30 ? 4
                                         : 0;
      std::uint32_t v = len == 1 ? c : len == 2 ? c & 0x1Fu : len == 3 ? c & 0x0Fu : c & 0x07u;
      for (std::size_t k = 1; k < len; ++k) {
        const auto cc = i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0;
        if ((cc & 0xC0) != 0x80) {
          len = 0;
          break;
        }
        v = (v << 6) | (cc & 0x3Fu);
      }
      const bool valid = len != 0 && !(len == 2 && v < 0x80) && !(len == 3 && v < 0x800) &&
                         !(len == 4 && (v < 0x10000 || v > 0x10FFFF)) &&
                         !(v >= 0xD800 && v <= 0xDFFF);
      at.push_back(static_cast<std::uint32_t>(i));
      cp.push_back(valid && v < 0x80 ? static_cast<char>(v) : '\0');
      kind.push_back(valid ? class_of(v) : cls::kOther);
      i += valid ? len : 1;
    }
    at.push_back(static_cast<std::uint32_t>(s.size()));
  }
  [[nodiscard]] std::size_t size() const noexcept { return kind.size(); }
};

/// Length (in code points) of the contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
std::size_t contraction(const code_points& t, std::size_t i, bool any_case) {
  if (t.cp[i] != '\'' || i + 1 >= t.size()) return 0;
  auto lower = [&](std::size_t k) -> std::uint32_t {
    if (k >= t.size()) return 0;
    const auto c = static_cast<std::uint32_t>(static_cast<unsigned char>(t.cp[k]));
    return any_case && c >= 'A' && c <= 'Z' ? c | 0x20 : c;
  };
  const std::uint32_t a = lower(i + 1), b = lower(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

/// Length of the whitespace run at i.
std::size_t space_run(const code_points& t, std::size_t i) {
  std::size_t j = i;
  while (j < t.size() && t.kind[j] == cls::kSpace) ++j;
  return j - i;
}

/// \s+(?!\S)|\s+ : a run that ends the text is taken whole; one followed by a word leaves its
/// last character to what follows (taken alone when it is the whole run).
std::size_t trailing_space(const code_points& t, std::size_t i) {
  const std::size_t r = space_run(t, i);
  if (i + r == t.size() || r == 1) return r;
  return r - 1;
}

/// GPT-2's pattern, one match at i (in code points):
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::size_t match_gpt2(const code_points& t, std::size_t i) {
  if (const std::size_t c = contraction(t, i, false)) return c;
  const std::size_t n = t.size();
  const bool space = t.cp[i] == ' ' && i + 1 < n && t.kind[i + 1] != cls::kSpace;
  const std::size_t s = space ? i + 1 : i;
  const cls k = t.kind[s];
  if (k != cls::kSpace) {
    std::size_t j = s;
    while (j < n && t.kind[j] == k) ++j;
    return j - i;
  }
  return trailing_space(t, i);
}

/// Qwen2's pattern, one match at i:
///   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
///   \s*[\r\n]+|\s+(?!\S)|\s+
std::size_t match_qwen2(const code_points& t, std::size_t i) {
  if (const std::size_t c = contraction(t, i, true)) return c;
  const std::size_t n = t.size();
  auto newline = [&](std::size_t k) { return t.cp[k] == '\r' || t.cp[k] == '\n'; };
  const cls k0 = t.kind[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  std::size_t s = i;
  if (k0 != cls::kLetter && k0 != cls::kNumber && !newline(i) && i + 1 < n &&
      t.kind[i + 1] == cls::kLetter)
    s = i + 1;
  if (t.kind[s] == cls::kLetter) {
    std::size_t j = s;
    while (j < n && t.kind[j] == cls::kLetter) ++j;
    return j - i;
  }
  if (k0 == cls::kNumber) return 1;
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  s = t.cp[i] == ' ' && i + 1 < n && t.kind[i + 1] == cls::kOther ? i + 1 : i;
  if (t.kind[s] == cls::kOther) {
    std::size_t j = s;
    while (j < n && t.kind[j] == cls::kOther) ++j;
    while (j < n && newline(j)) ++j;
    return j - i;
  }
  // \s*[\r\n]+ : up to the run's last newline
  const std::size_t r = space_run(t, i);
  for (std::size_t j = i + r; j > i; --j)
    if (newline(j - 1)) return j - i;
  return trailing_space(t, i);
}

}  // namespace

std::vector<std::string_view> pre_tokenize(std::string_view s, pre_tokenizer pre) {
  std::vector<std::string_view> out;
  pre_tokenize_each(s, pre, [&out](std::string_view w) { out.push_back(w); });
  return out;
}

void pre_tokenize_each(std::string_view s, pre_tokenizer pre,
                       const std::function<void(std::string_view)>& out_piece) {
  const code_points t(s);
  auto piece = [&](std::size_t a, std::size_t b) { return s.substr(t.at[a], t.at[b] - t.at[a]); };
  if (pre == pre_tokenizer::kSmolLM) {
    // SmolLM2 isolates every digit first, then runs GPT-2's pattern on each stretch between
    // digits on its own (so a lookahead never sees past a digit).
    for (std::size_t i = 0; i < t.size();) {
      std::size_t j = i;
      while (j < t.size() && t.kind[j] != cls::kNumber) ++j;
      if (j > i) pre_tokenize_each(piece(i, j), pre_tokenizer::kGPT2, out_piece);
      if (j < t.size()) out_piece(piece(j, j + 1));
      i = j + 1;
    }
    return;
  }
  for (std::size_t i = 0; i < t.size();) {
    const std::size_t len = pre == pre_tokenizer::kQwen2 ? match_qwen2(t, i) : match_gpt2(t, i);
    out_piece(piece(i, i + len));
    i += len;
  }
}

bpe_tokenizer::bpe_tokenizer(const gguf_file& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    throw gguf_error(f.name(), 0, "tokenizer model '" + model + "' is not supported (gpt2 is)");
  const std::string pre = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "gpt2";
  if (pre == "gpt2")
    pre_ = pre_tokenizer::kGPT2;
  else if (pre == "smollm")
    pre_ = pre_tokenizer::kSmolLM;
  else if (pre == "qwen2")
    pre_ = pre_tokenizer::kQwen2;
  else
    throw gguf_error(
        f.name(), 0,
        "tokenizer.ggml.pre = '" + pre + "' is not supported (gpt2, smollm, qwen2 are)");
  tokens_ = f.get_strings("tokenizer.ggml.tokens");
  const auto merges = f.get_strings("tokenizer.ggml.merges");
  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_ints("tokenizer.ggml.token_type");
    for (std::size_t i = 0; i < types.size() && i < tokens_.size(); ++i)
      if (types[i] == 3 || types[i] == 4) {
        // An empty special token matches everywhere: encode would never advance.
        if (tokens_[i].empty())
          throw gguf_error(f.name(), 0,
                           "tokenizer.ggml.tokens[" + std::to_string(i) +
                               "] is a special token (tokenizer.ggml.token_type " +
                               std::to_string(types[i]) + ") and empty");
        special_pairs_.emplace_back(tokens_[i], static_cast<relokv::token_t>(i));
      }
  }
  build(merges);
}

bpe_tokenizer::bpe_tokenizer(std::vector<std::string> tokens,
                             const std::vector<std::string>& merges,
                             std::vector<std::string> specials, pre_tokenizer pre)
    : pre_(pre), tokens_(std::move(tokens)) {
  for (const std::string& sp : specials) {
    if (sp.empty()) throw std::invalid_argument("tokenizer: a special token is empty");
    const auto it = std::find(tokens_.begin(), tokens_.end(), sp);
    if (it == tokens_.end())
      throw std::invalid_argument("tokenizer: special token '" + sp + "' is not in the vocabulary");
    special_pairs_.emplace_back(sp, static_cast<relokv::token_t>(it - tokens_.begin()));
  }
  build(merges);
}

void bpe_tokenizer::build(const std::vector<std::string>& merges) {
  for (std::size_t i = 0; i < tokens_.size(); ++i)
    ids_.emplace(tokens_[i], static_cast<relokv::token_t>(i));
  for (std::size_t i = 0; i < merges.size(); ++i)
    ranks_.emplace(merges[i], static_cast<std::int32_t>(i));
  // GPT-2's byte <-> symbol map: printable bytes stand for themselves, the rest are shifted
  // to code points from 256 on.
  std::uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    byte_sym_[b] = utf8(printable ? static_cast<std::uint32_t>(b) : next++);
    sym_byte_[byte_sym_[b]] = static_cast<unsigned char>(b);
  }
  // Special tokens are known by id: text reaches them only by their literal string, never
  // through BPE (a vocabulary whose special token is also a byte's symbol cannot hand that
  // byte a special id), and decode writes them as they are.
  is_special_.assign(tokens_.size(), 0);
  for (const auto& [sp, id] : special_pairs_) is_special_[static_cast<std::size_t>(id)] = 1;
  // Longest specials first, so that one that contains another wins.
  std::stable_sort(special_pairs_.begin(), special_pairs_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

relokv::token_t bpe_tokenizer::id(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

void bpe_tokenizer::encode_word(std::string_view word, std::vector<relokv::token_t>& out) const {
  // BPE in O(n log n): the symbols form a linked list, candidate merges a min-heap ordered by
  // (rank, position), so the lowest-ranked, leftmost pair merges first, as in the quadratic
  // definition. A merge adds at most two candidates (with its neighbours); entries whose
  // symbols changed since they were pushed are recognized by the symbols' versions and skipped.
  const std::size_t n = word.size();
  std::vector<std::string> sym(n);
  std::vector<std::int32_t> prev(n), next(n);
  std::vector<std::uint32_t> version(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    sym[i] = byte_sym_[static_cast<unsigned char>(word[i])];
    prev[i] = static_cast<std::int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<std::int32_t>(i + 1) : -1;
  }
  struct candidate {
    std::int32_t rank, left, right;
    std::uint32_t left_version, right_version;
    bool operator>(const candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<candidate, std::vector<candidate>, std::greater<>> heap;
  std::string key;
  auto push = [&](std::int32_t l, std::int32_t r) {
    if (l < 0 || r < 0) return;
    key.assign(sym[static_cast<std::size_t>(l)]);
    key += ' ';
    key += sym[static_cast<std::size_t>(r)];
    const auto it = ranks_.find(key);
    if (it != ranks_.end())
      heap.push({it->second, l, r, version[static_cast<std::size_t>(l)],
                 version[static_cast<std::size_t>(r)]});
  };
  for (std::size_t i = 0; i + 1 < n; ++i)
    push(static_cast<std::int32_t>(i), static_cast<std::int32_t>(i + 1));
  while (!heap.empty()) {
    const candidate c = heap.top();
    heap.pop();
    const auto l = static_cast<std::size_t>(c.left), r = static_cast<std::size_t>(c.right);
    if (next[l] != c.right || version[l] != c.left_version || version[r] != c.right_version)
      continue;  // stale: one of the two symbols has merged since
    sym[l] += sym[r];
    sym[r].clear();
    ++version[l];
    ++version[r];  // r is gone: any entry naming it is stale
    next[l] = next[r];
    if (next[r] >= 0) prev[static_cast<std::size_t>(next[r])] = c.left;
    push(prev[l], c.left);
    push(c.left, next[l]);
  }
  std::vector<std::string> merged;
  for (std::int32_t i = n == 0 ? -1 : 0; i >= 0; i = next[static_cast<std::size_t>(i)])
    merged.push_back(std::move(sym[static_cast<std::size_t>(i)]));
  sym = std::move(merged);
  // A symbol's id, unless it is missing or special (specials come only from their literal).
  auto plain_id = [&](const std::string& s) -> relokv::token_t {
    const auto it = ids_.find(s);
    return it == ids_.end() || is_special_[static_cast<std::size_t>(it->second)] ? -1 : it->second;
  };
  for (const std::string& s : sym) {
    if (const relokv::token_t id = plain_id(s); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Not in the vocabulary as a whole: fall back to its bytes' symbols (UTF-8 pieces of s).
    for (std::size_t i = 0; i < s.size();) {
      const auto c = static_cast<unsigned char>(s[i]);
      const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : 3;  // byte symbols are < U+0144
      const relokv::token_t id = plain_id(s.substr(i, len));
      if (id < 0)
        throw std::runtime_error("tokenizer: byte " +
                                 std::to_string(sym_byte_.at(s.substr(i, len))) +
                                 " has no (non-special) token");
      out.push_back(id);
      i += len;
    }
  }
}

std::vector<relokv::token_t> bpe_tokenizer::encode(const std::string& text,
                                                   const marked_text* marks) const {
  std::vector<relokv::token_t> out;
  // The next occurrence of special k at or after `from` that may be a control token: with
  // marks, only one inside a template piece (elsewhere its literal is text).
  const auto next_special = [&](std::size_t k, std::size_t from) {
    const std::string& sp = special_pairs_[k].first;
    std::size_t p = text.find(sp, from);
    while (marks != nullptr && p != std::string::npos && !marks->control_at(p, sp.size()))
      p = text.find(sp, p + 1);
    return p;
  };
  // Where each special token next occurs at or after i: searched again only once passed, so
  // the text is scanned once per special token, however many of them it holds.
  std::vector<std::size_t> at(special_pairs_.size(), 0);
  std::size_t i = 0;
  bool first = true;
  while (i < text.size()) {
    std::size_t best = std::string::npos;
    std::size_t which = special_pairs_.size();
    for (std::size_t k = 0; k < special_pairs_.size(); ++k) {
      if (first || (at[k] != std::string::npos && at[k] < i)) at[k] = next_special(k, i);
      if (at[k] < best) {  // ties: the longer special (sorted first) wins
        best = at[k];
        which = k;
      }
    }
    first = false;
    const std::size_t end = best == std::string::npos ? text.size() : best;
    // In chunks of about kChunk bytes, cut where every pre-tokenizer starts a piece anyway (a
    // space between two ASCII letters: the letter run before it ends there, " x..." begins
    // there, and BPE never merges across pieces), so that the pre-tokenizer's memory is a
    // chunk's, not the text's; the tokens are the same.
    constexpr std::size_t kChunk = 32 * 1024;
    const auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
    for (std::size_t a = i; a < end;) {
      std::size_t b = end;
      if (end - a > kChunk) {
        for (std::size_t k = a + kChunk; k > a + 1; --k)
          if (text[k] == ' ' && letter(text[k - 1]) && k + 1 < end && letter(text[k + 1])) {
            b = k;
            break;
          }
      }
      pre_tokenize_each(std::string_view(text).substr(a, b - a), pre_,
                        [&](std::string_view w) { encode_word(w, out); });
      a = b;
    }
    if (which == special_pairs_.size()) break;
    out.push_back(special_pairs_[which].second);
    i = best + special_pairs_[which].first.size();
  }
  return out;
}

std::string bpe_tokenizer::decode(const std::vector<relokv::token_t>& ids) const {
  std::string out;
  for (relokv::token_t t : ids) {
    if (t < 0 || static_cast<std::size_t>(t) >= tokens_.size())
      throw std::out_of_range("tokenizer: id " + std::to_string(t) + " outside the vocabulary");
    const std::string& s = tokens_[static_cast<std::size_t>(t)];
    if (is_special_[static_cast<std::size_t>(t)]) {
      out += s;
      continue;
    }
    // Split the token string into UTF-8 symbols and map each back to its byte.
    for (std::size_t i = 0; i < s.size();) {
      const auto c = static_cast<unsigned char>(s[i]);
      const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      const auto it = sym_byte_.find(s.substr(i, len));
      if (it != sym_byte_.end())
        out += static_cast<char>(it->second);
      else
        out += s.substr(i, len);
      i += len;
    }
  }
  return out;
}

std::string bpe_tokenizer::chat(const std::string& system, const std::string& user) {
  return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n" + user +
         "<|im_end|>\n<|im_start|>assistant\n";
}

tokenizer::tokenizer(const gguf_file& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model == "llama") {
    spm_.emplace(f);
  } else if (model == "gpt2") {
    bpe_.emplace(f);
  } else {
    throw gguf_error(f.name(), 0,
                     "tokenizer model '" + model +
                         "' is not supported (gpt2: byte-level BPE; llama: SentencePiece)");
  }
  if (f.has("tokenizer.chat_template"))
    default_system_ = template_default_system(f.get_string("tokenizer.chat_template"));
  if (!f.has("tokenizer.chat_template")) {
    format_ = chat_format::kPlain;
    eot_ = "\n";
  } else if (id("<start_of_turn>") >= 0 && id("<end_of_turn>") >= 0) {
    format_ = chat_format::kGemma;
    eot_ = "<end_of_turn>";
  }
  measure();
}

tokenizer::tokenizer(bpe_tokenizer bpe) : bpe_(std::move(bpe)) { measure(); }

std::vector<relokv::token_t> tokenizer::encode(const std::string& text) const {
  return bpe_ ? bpe_->encode(text) : spm_->encode(text);
}
std::vector<relokv::token_t> tokenizer::encode(const marked_text& text) const {
  return bpe_ ? bpe_->encode(text) : spm_->encode(text);
}
void tokenizer::measure() {
  max_token_bytes_ = 1;
  const std::int32_t n = vocab_size();
  for (std::int32_t t = 0; t < n; ++t)
    max_token_bytes_ = std::max(max_token_bytes_, decode({t}).size());
}
std::string tokenizer::decode(const std::vector<relokv::token_t>& ids) const {
  return bpe_ ? bpe_->decode(ids) : spm_->decode(ids);
}
std::int32_t tokenizer::vocab_size() const noexcept {
  return bpe_ ? bpe_->vocab_size() : spm_->vocab_size();
}
relokv::token_t tokenizer::id(const std::string& token) const {
  return bpe_ ? bpe_->id(token) : spm_->id(token);
}

std::string template_default_system(const std::string& t) {
  for (const char* open : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    const std::string o(open);
    for (std::size_t at = t.find(o); at != std::string::npos; at = t.find(o, at + 1)) {
      const std::size_t b = at + o.size();
      const std::size_t e = t.find("<|im_end|>", b);
      if (e == std::string::npos) break;
      const std::string text = t.substr(b, e - b);
      // A literal only: no template code, no end of the string literal inside.
      if (text.empty() || text.find_first_of("{}'\"\\") != std::string::npos) continue;
      return text;
    }
  }
  return {};
}

marked_text tokenizer::open_marked(const std::string& system,
                                   const std::vector<turn>& history) const {
  marked_text s;
  if (format_ == chat_format::kPlain) {  // earlier turns as "Question:"/"Answer:" lines
    s.control(id("<bos>") >= 0 ? "<bos>" : "").plain(system).control(system.empty() ? "" : "\n\n");
    for (const auto& [role, content] : history)
      s.control(role == "assistant" ? "Answer: " : "").plain(content).control("\n");
    return s;
  }
  if (format_ == chat_format::kGemma) {  // Gemma has no system role: it leads a user turn
    s.control("<bos>");
    bool lead = !system.empty();
    const auto lead_in = [&] {
      if (lead) s.plain(system).control("\n\n");
      lead = false;
    };
    for (const auto& [role, content] : history) {
      const bool user = role != "assistant";
      s.control("<start_of_turn>").control(user ? "user" : "model").control("\n");
      if (user) lead_in();
      s.plain(content).control("<end_of_turn>\n");
    }
    s.control("<start_of_turn>user\n");
    lead_in();
    return s;
  }
  s.control("<|im_start|>system\n").plain(system).control("<|im_end|>\n");
  for (const auto& [role, content] : history)
    s.control("<|im_start|>").control(role).control("\n").plain(content).control("<|im_end|>\n");
  return s.control("<|im_start|>user\n");
}
marked_text tokenizer::close_marked() const {
  marked_text s;
  if (format_ == chat_format::kPlain) return s.control("\nAnswer:");
  if (format_ == chat_format::kGemma) return s.control("<end_of_turn>\n<start_of_turn>model\n");
  return s.control("<|im_end|>\n<|im_start|>assistant\n");
}
std::vector<std::string> tokenizer::stop_texts() const {
  std::vector<std::string> s{eot_};
  if (format_ == chat_format::kPlain && id("\n\n") >= 0) s.emplace_back("\n\n");
  for (const char* t : {"<|endoftext|>", "<eos>"})
    if (id(t) >= 0) s.emplace_back(t);
  return s;
}

}  // namespace relokv_engine
