// SentencePiece tokenizer of the example engine (spm_tokenizer.hpp).
#include "spm_tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <stdexcept>

namespace relokv_engine {
namespace {
constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

std::size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}
}  // namespace

spm_tokenizer::spm_tokenizer(const gguf_file& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "llama")
    throw gguf_error(f.name(), 0, "tokenizer model '" + model + "' is not SentencePiece ('llama')");
  tokens_ = f.get_strings("tokenizer.ggml.tokens");
  const auto scores = f.get_floats("tokenizer.ggml.scores");
  const auto types = f.get_ints("tokenizer.ggml.token_type");
  if (tokens_.empty() || scores.size() != tokens_.size() || types.size() != tokens_.size())
    throw gguf_error(f.name(), 0,
                     "SentencePiece vocabulary of " + std::to_string(tokens_.size()) +
                         " tokens with " + std::to_string(scores.size()) + " scores and " +
                         std::to_string(types.size()) + " token types");
  space_prefix_ = f.get_bool("tokenizer.ggml.add_space_prefix", true);
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    const auto id = static_cast<relokv::token_t>(i);
    scores_.push_back(static_cast<float>(scores[i]));
    types_.push_back(static_cast<std::int32_t>(types[i]));
    ids_.emplace(tokens_[i], id);
    const std::string& t = tokens_[i];
    if (types[i] == 6) {  // <0xXX>
      unsigned b = 0;
      if (t.size() != 6 || std::sscanf(t.c_str(), "<0x%02X>", &b) != 1 || b > 255)
        throw gguf_error(f.name(), 0,
                         "tokenizer.ggml.tokens[" + std::to_string(i) + "] = '" + t +
                             "' is a byte token (type 6) but not <0xXX>");
      byte_id_[b] = id;
    } else if (types[i] == 3 || types[i] == 4) {  // control, user-defined: cut out first
      if (t.empty())
        throw gguf_error(
            f.name(), 0,
            "tokenizer.ggml.tokens[" + std::to_string(i) + "] is a special token and empty");
      specials_.emplace_back(t, id);
    }
  }
  for (int b = 0; b < 256; ++b)
    if (byte_id_[b] < 0)
      throw gguf_error(f.name(), 0,
                       "SentencePiece vocabulary without the byte token for " + std::to_string(b) +
                           " (byte fallback needs all 256)");
  // Longest first, as llama.cpp partitions; equal lengths by id, so the order is fixed.
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

relokv::token_t spm_tokenizer::id(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<relokv::token_t> spm_tokenizer::encode(const marked_text& text) const {
  return encode(text.str(), &text);
}

std::vector<relokv::token_t> spm_tokenizer::encode(const std::string& text,
                                                   const marked_text* marks) const {
  // Fragments: raw text [begin, begin + len), or a special token's id. Each special in turn
  // (longest first) splits the raw fragments where it occurs (with marks: only inside a
  // template piece; elsewhere its literal is text).
  struct fragment {
    std::size_t begin = 0, len = 0;
    relokv::token_t id = -1;
  };
  std::vector<fragment> frags{{0, text.size(), -1}};
  const std::string_view all(text);
  // The next place `sp` is a control token within raw fragment fr, at or after `from`.
  const auto find = [&](const std::string& sp, const fragment& fr, std::size_t from) {
    const std::string_view v = all.substr(fr.begin, fr.len);
    std::size_t p = v.find(sp, from);
    while (marks != nullptr && p != std::string_view::npos &&
           !marks->control_at(fr.begin + p, sp.size()))
      p = v.find(sp, p + 1);
    return p;
  };
  for (const auto& [sp, sid] : specials_) {
    bool hit = false;
    for (const fragment& fr : frags)
      hit = hit || (fr.id < 0 && find(sp, fr, 0) != std::string_view::npos);
    if (!hit) continue;
    std::vector<fragment> next;
    for (const fragment& fr : frags) {
      if (fr.id >= 0 || find(sp, fr, 0) == std::string_view::npos) {
        next.push_back(fr);
        continue;
      }
      std::size_t i = 0;
      for (std::size_t at; (at = find(sp, fr, i)) != std::string_view::npos; i = at + sp.size()) {
        if (at > i) next.push_back({fr.begin + i, at - i, -1});
        next.push_back({0, 0, sid});
      }
      if (i < fr.len) next.push_back({fr.begin + i, fr.len - i, -1});
    }
    frags = std::move(next);
  }
  std::vector<relokv::token_t> out;
  bool prev_special = true;
  for (const fragment& fr : frags) {
    if (fr.id >= 0) {
      out.push_back(fr.id);
      prev_special = true;
      continue;
    }
    std::string s = space_prefix_ && prev_special ? " " : "";
    s += all.substr(fr.begin, fr.len);
    std::string escaped;
    for (const char c : s) {
      if (c == ' ')
        escaped += kSpace;
      else
        escaped += c;
    }
    encode_text(escaped, out);
    prev_special = false;
  }
  return out;
}

void spm_tokenizer::encode_text(const std::string& text, std::vector<relokv::token_t>& out) const {
  if (text.empty()) return;
  // Symbols: UTF-8 characters in a linked list; merged ones grow, their right part empties.
  struct symbol {
    std::size_t off, len;
    int prev, next;
  };
  std::vector<symbol> sym;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(text[i])), text.size() - i);
    const int k = static_cast<int>(sym.size());
    sym.push_back({i, n, k - 1, i + n == text.size() ? -1 : k + 1});
    i += n;
  }
  struct bigram {
    int left, right;
    float score;
    std::size_t size;
  };
  const auto lower = [](const bigram& a, const bigram& b) {  // max-heap: best score, leftmost
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<bigram, std::vector<bigram>, decltype(lower)> queue(lower);
  const auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const std::string piece =
        text.substr(sym[static_cast<std::size_t>(l)].off,
                    sym[static_cast<std::size_t>(l)].len + sym[static_cast<std::size_t>(r)].len);
    const auto it = ids_.find(piece);
    if (it == ids_.end()) return;
    queue.push({l, r, scores_[static_cast<std::size_t>(it->second)], piece.size()});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const bigram b = queue.top();
    queue.pop();
    symbol& l = sym[static_cast<std::size_t>(b.left)];
    symbol& r = sym[static_cast<std::size_t>(b.right)];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.size) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<std::size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  // Merges only make pieces of the vocabulary, so a final piece is one of them or a single
  // character outside it, which falls back to its bytes.
  for (int i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
    const symbol& x = sym[static_cast<std::size_t>(i)];
    if (const auto it = ids_.find(text.substr(x.off, x.len)); it != ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (std::size_t j = x.off; j < x.off + x.len; ++j)
      out.push_back(byte_id_[static_cast<unsigned char>(text[j])]);
  }
}

std::string spm_tokenizer::decode(const std::vector<relokv::token_t>& ids) const {
  std::string out;
  for (const relokv::token_t t : ids) {
    if (t < 0 || static_cast<std::size_t>(t) >= tokens_.size())
      throw std::out_of_range("tokenizer: id " + std::to_string(t) + " outside the vocabulary");
    const std::string& s = tokens_[static_cast<std::size_t>(t)];
    const std::int32_t type = types_[static_cast<std::size_t>(t)];
    if (type == 6) {  // <0xXX>, checked at load
      out += static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16));
      continue;
    }
    if (type == 3 || type == 4) {  // specials as written
      out += s;
      continue;
    }
    for (std::size_t i = 0; i < s.size();) {
      if (s.compare(i, 3, kSpace) == 0) {
        out += ' ';
        i += 3;
      } else {
        out += s[i++];
      }
    }
  }
  return out;
}

}  // namespace relokv_engine
