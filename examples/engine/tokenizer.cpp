// Byte-level BPE (see tokenizer.hpp).
#include "tokenizer.hpp"

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>

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

enum class cls { kSpace, kLetter, kDigit, kOther };
cls class_of(unsigned char c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') return cls::kSpace;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return cls::kLetter;
  if (c >= '0' && c <= '9') return cls::kDigit;
  return cls::kOther;
}

/// GPT-2's pre-tokenization: contractions, optional space + letters / digits / other symbols,
/// and whitespace (a run of spaces leaves its last one to the following word).
std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  const std::size_t n = s.size();
  static const char* contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  while (i < n) {
    bool matched = false;
    if (s[i] == '\'')
      for (const char* c : contractions) {
        const std::size_t len = std::char_traits<char>::length(c);
        if (s.compare(i, len, c) == 0) {
          out.push_back(s.substr(i, len));
          i += len;
          matched = true;
          break;
        }
      }
    if (matched) continue;
    const auto c0 = static_cast<unsigned char>(s[i]);
    std::size_t j = i;
    if (class_of(c0) == cls::kSpace) {
      while (j < n && class_of(static_cast<unsigned char>(s[j])) == cls::kSpace) ++j;
      // keep one plain space for the next word when a word follows
      if (j < n && j - i > 1 && s[j - 1] == ' ')
        --j;
      else if (j < n && j - i == 1 && s[i] == ' ') {
        ++j;  // " word": the space joins the word
        const cls k = class_of(static_cast<unsigned char>(s[i + 1]));
        while (j < n && class_of(static_cast<unsigned char>(s[j])) == k && k != cls::kSpace) ++j;
      }
      out.push_back(s.substr(i, j - i));
      i = j;
      continue;
    }
    const cls k = class_of(c0);
    while (j < n && class_of(static_cast<unsigned char>(s[j])) == k) ++j;
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

bpe_tokenizer::bpe_tokenizer(const gguf_file& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    throw gguf_error(f.name(), 0, "tokenizer model '" + model + "' is not supported (gpt2 is)");
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
                             std::vector<std::string> specials)
    : tokens_(std::move(tokens)) {
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

void bpe_tokenizer::encode_word(const std::string& word, std::vector<relokv::token_t>& out) const {
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

std::vector<relokv::token_t> bpe_tokenizer::encode(const std::string& text) const {
  std::vector<relokv::token_t> out;
  // Where each special token next occurs at or after i: searched again only once passed, so
  // the text is scanned once per special token, however many of them it holds.
  std::vector<std::size_t> at(special_pairs_.size(), 0);
  std::size_t i = 0;
  bool first = true;
  while (i < text.size()) {
    std::size_t best = std::string::npos;
    std::size_t which = special_pairs_.size();
    for (std::size_t k = 0; k < special_pairs_.size(); ++k) {
      if (first || (at[k] != std::string::npos && at[k] < i))
        at[k] = text.find(special_pairs_[k].first, i);
      if (at[k] < best) {  // ties: the longer special (sorted first) wins
        best = at[k];
        which = k;
      }
    }
    first = false;
    const std::size_t end = best == std::string::npos ? text.size() : best;
    for (const std::string& w : split_words(text.substr(i, end - i))) encode_word(w, out);
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

}  // namespace relokv_engine
