// The byte-level BPE: the heap merge against the quadratic definition, and hostile vocabularies.
#include <climits>
#include <random>
#include <string>
#include <vector>

#include "engine/gguf_writer.hpp"
#include "gguf.hpp"
#include "support/catch.hpp"
#include "tokenizer.hpp"

using relokv_engine::bpe_tokenizer;

namespace {

/// The definition: merge the lowest-ranked adjacent pair (leftmost on ties) until none is left.
std::vector<std::string> reference_bpe(std::vector<std::string> sym,
                                       const std::vector<std::string>& merges) {
  auto rank = [&](const std::string& pair) {
    for (std::size_t r = 0; r < merges.size(); ++r)
      if (merges[r] == pair) return static_cast<int>(r);
    return INT_MAX;
  };
  while (sym.size() > 1) {
    int best = INT_MAX;
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      const int r = rank(sym[i] + " " + sym[i + 1]);
      if (r < best) best = r, at = i;
    }
    if (best == INT_MAX) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  return sym;
}

/// A random vocabulary over the letters a..d: every letter, then merges of existing tokens.
struct random_vocab {
  std::vector<std::string> tokens = {"a", "b", "c", "d"};
  std::vector<std::string> merges;
  explicit random_vocab(std::mt19937& rng, int n) {
    for (int i = 0; i < n; ++i) {
      const auto& l = tokens[rng() % tokens.size()];
      const auto& r = tokens[rng() % tokens.size()];
      if (l.size() + r.size() > 6) continue;
      const std::string m = l + " " + r;
      bool seen = false;
      for (const auto& x : merges) seen = seen || x == m;
      if (seen) continue;
      merges.push_back(m);
      tokens.push_back(l + r);
    }
  }
};

}  // namespace

TEST_CASE("tokenizer: the heap merge equals the quadratic definition", "[engine]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const random_vocab v(rng, 40);
    const bpe_tokenizer tok(v.tokens, v.merges, {});
    std::string word;
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) word += static_cast<char>('a' + rng() % 4);
    std::vector<std::string> bytes;
    for (char c : word) bytes.emplace_back(1, c);
    const auto want = reference_bpe(bytes, v.merges);
    std::vector<relokv::token_t> want_ids;
    for (const auto& s : want) want_ids.push_back(tok.id(s));
    INFO("word " << word);
    REQUIRE(tok.encode(word) == want_ids);
    CHECK(tok.decode(tok.encode(word)) == word);
  }
}

TEST_CASE("tokenizer: overlapping and repeated pairs merge leftmost first", "[engine]") {
  const bpe_tokenizer tok({"a", "aa", "aaa"}, {"a a", "aa a"}, {});
  // "aaaaa": a a -> (aa)(aa)a by leftmost, then (aa a)? "aa aa" has no rank, "aa a" does.
  CHECK(tok.encode("aaaaa") == std::vector<relokv::token_t>{1, 2});
  CHECK(tok.encode("aaa") == std::vector<relokv::token_t>{2});
}

TEST_CASE("tokenizer: an empty or unknown special token is rejected at load", "[engine]") {
  CHECK_THROWS_AS(bpe_tokenizer({"a", ""}, {}, {""}), std::invalid_argument);
  CHECK_THROWS_AS(bpe_tokenizer({"a"}, {}, {"<|x|>"}), std::invalid_argument);
  relokv_test::gguf_writer w;
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_strs("tokenizer.ggml.tokens", {"a", "", "b"});
  w.kv_strs("tokenizer.ggml.merges", {});
  w.kv_i32s("tokenizer.ggml.token_type", {1, 3, 1});
  const auto f = relokv_engine::gguf_file::from_memory(w.bytes());
  try {
    const bpe_tokenizer tok(f);
    FAIL("no error");
  } catch (const relokv_engine::gguf_error& e) {
    CHECK(std::string(e.what()).find("tokenizer.ggml.tokens[1]") != std::string::npos);
  }
}

TEST_CASE("tokenizer: specials split the text however many there are", "[engine]") {
  const bpe_tokenizer tok({"a", "b", "<s>", "<s>x"}, {}, {"<s>", "<s>x"});
  CHECK(tok.encode("a<s>xb<s>a") == std::vector<relokv::token_t>{0, 3, 1, 2, 0});
  std::string many;
  for (int i = 0; i < 2000; ++i) many += "a<s>";
  CHECK(tok.encode(many).size() == 4000);
}

TEST_CASE("tokenizer: a merge missing from the vocabulary falls back to its bytes' tokens",
          "[engine]") {
  // "\xc4\xa0" is GPT-2's symbol for the space byte; the merge's result is not a token.
  const bpe_tokenizer tok({"\xc4\xa0", "a"}, {"\xc4\xa0 a"}, {});
  CHECK(tok.encode(" a") == std::vector<relokv::token_t>{0, 1});
  CHECK(tok.decode({0, 1}) == " a");
}

TEST_CASE("tokenizer: special tokens are reached by their literal only (found by fuzzing)",
          "[engine]") {
  // A hostile vocabulary whose special token is the space byte's symbol: BPE must not hand the
  // space that id (decode would write the symbol, not the space).
  const bpe_tokenizer tok({"a", "\xc4\xa0"}, {}, {"\xc4\xa0"});
  CHECK_THROWS_AS(tok.encode("a a"), std::runtime_error);
  CHECK(tok.encode("a\xc4\xa0") == std::vector<relokv::token_t>{0, 1});
  CHECK(tok.decode({0, 1}) == "a\xc4\xa0");
}

namespace {
std::vector<std::string> pieces(const std::string& s, relokv_engine::pre_tokenizer p) {
  std::vector<std::string> out;
  for (auto w : relokv_engine::pre_tokenize(s, p)) out.emplace_back(w);
  return out;
}
using V = std::vector<std::string>;
}  // namespace

// The patterns' rules, each of which the old ASCII-only split got wrong or never had; the
// real-model test checks whole strings against the reference tokenizer's ids.
TEST_CASE("pre-tokenizer: GPT-2's pattern by Unicode category", "[engine]") {
  using enum relokv_engine::pre_tokenizer;
  // A whitespace run leaves its last character to what follows, whatever kind it is.
  CHECK(pieces("a\n\nb", kGPT2) == V{"a", "\n", "\n", "b"});
  CHECK(pieces("a  b", kGPT2) == V{"a", " ", " b"});
  CHECK(pieces("a\t\tb", kGPT2) == V{"a", "\t", "\t", "b"});
  CHECK(pieces("end  ", kGPT2) == V{"end", "  "});
  // Curly quotes and dashes are punctuation, accented letters letters, CJK letters.
  CHECK(pieces("\xE2\x80\x9Cyes\xE2\x80\x9D", kGPT2) == V{"\xE2\x80\x9C", "yes", "\xE2\x80\x9D"});
  CHECK(pieces("caf\xC3\xA9 \xE2\x80\x94 x", kGPT2) == V{"caf\xC3\xA9", " \xE2\x80\x94", " x"});
  CHECK(pieces("it's 1987", kGPT2) == V{"it", "'s", " 1987"});
  // A no-break space is whitespace, not a letter.
  CHECK(pieces("a\xC2\xA0"
               "b",
               kGPT2) == V{"a", "\xC2\xA0", "b"});
  // Invalid UTF-8: each stray byte is one punctuation code point, nothing is lost.
  CHECK(pieces("a\xFF\xFE"
               "b",
               kGPT2) == V{"a", "\xFF\xFE", "b"});
}

TEST_CASE("pre-tokenizer: SmolLM2 isolates digits; Qwen2's pattern", "[engine]") {
  using enum relokv_engine::pre_tokenizer;
  CHECK(pieces("in 1987.", kSmolLM) == V{"in", " ", "1", "9", "8", "7", "."});
  CHECK(pieces("a  1", kSmolLM) == V{"a", "  ", "1"});  // the lookahead stops at the digit
  CHECK(pieces("in 1987.", kQwen2) == V{"in", " ", "1", "9", "8", "7", "."});
  CHECK(pieces("a\n\nb", kQwen2) == V{"a", "\n\n", "b"});
  CHECK(pieces("(x).\n\nNext", kQwen2) == V{"(x", ").\n\n", "Next"});
  CHECK(pieces("I'M DON'T", kQwen2) == V{"I", "'M", " DON", "'T"});
  CHECK(pieces("\ttab", kQwen2) == V{"\ttab"});
}
