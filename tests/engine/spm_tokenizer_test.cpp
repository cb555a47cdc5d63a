// The SentencePiece tokenizer on small vocabularies written as GGUFs: merges by score (the
// leftmost on ties), byte fallback, special and user-defined tokens cut out longest first,
// the space prefix, decode, and the files it refuses. Parity with llama.cpp on Gemma 3's own
// vocabulary is the real-model test's (tests/engine/data/tokenizer_ref_ids.tsv).
#include <cstdio>
#include <string>
#include <vector>

#include "engine/gguf_writer.hpp"
#include "support/catch.hpp"
#include "tokenizer.hpp"

namespace {
using relokv_engine::spm_tokenizer;
using ids = std::vector<relokv::token_t>;

struct vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<std::int32_t> types;
  void add(const std::string& t, float score, std::int32_t type = 1) {
    tokens.push_back(t);
    scores.push_back(score);
    types.push_back(type);
  }
};

/// 256 byte tokens (ids 0..255), <bos> 256, <start_of_turn> 257, "\n\n" 258 (user-defined),
/// then the pieces.
vocab base_vocab() {
  vocab v;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    v.add(name, 0.0f, 6);
  }
  v.add("<bos>", 0.0f, 3);
  v.add("<start_of_turn>", 0.0f, 3);
  v.add("\n\n", 0.0f, 4);
  return v;
}

relokv_engine::gguf_file file_of(const vocab& v, bool space_prefix = false,
                                 const std::string& model = "llama") {
  relokv_test::gguf_writer w;
  w.kv_str("tokenizer.ggml.model", model);
  w.kv_strs("tokenizer.ggml.tokens", v.tokens);
  w.kv_f32s("tokenizer.ggml.scores", v.scores);
  w.kv_i32s("tokenizer.ggml.token_type", v.types);
  w.kv_bool("tokenizer.ggml.add_space_prefix", space_prefix);
  return relokv_engine::gguf_file::from_memory(w.bytes());
}
constexpr const char* kSp = "\xE2\x96\x81";  // U+2581
}  // namespace

TEST_CASE("spm tokenizer: the best-scoring merge first, the leftmost on ties", "[engine]") {
  auto v = base_vocab();
  v.add("a", -1, 1);                     // 259
  v.add("b", -1, 1);                     // 260
  v.add("c", -1, 1);                     // 261
  v.add("ab", -5, 1);                    // 262
  v.add("bc", -2, 1);                    // 263: scores above ab, so "abc" -> a + bc
  v.add(std::string(kSp) + "a", -3, 1);  // 264
  v.add("aa", -4, 1);                    // 265
  const auto f = file_of(v);
  const spm_tokenizer tok(f);
  CHECK(tok.encode("abc") == ids{259, 263});
  CHECK(tok.encode("ab") == ids{262});
  CHECK(tok.encode("aaa") == ids{265, 259});  // a tie of equal pairs: the leftmost merges
  CHECK(tok.encode("b a") == ids{260, 264});  // the space is U+2581, merged with what follows
  CHECK(tok.decode(tok.encode("b a")) == "b a");
}

TEST_CASE("spm tokenizer: characters outside the vocabulary fall back to bytes", "[engine]") {
  auto v = base_vocab();
  v.add("x", -1, 1);  // 259
  const spm_tokenizer tok(file_of(v));
  // "é" is two bytes, 0xC3 0xA9; the space (U+2581) three, none of them in the vocabulary.
  CHECK(tok.encode("x\xC3\xA9") == ids{259, 0xC3, 0xA9});
  CHECK(tok.encode(" ") == ids{0xE2, 0x96, 0x81});
  CHECK(tok.decode({259, 0xC3, 0xA9}) == "x\xC3\xA9");
}

TEST_CASE("spm tokenizer: specials are cut out first, longest first; the space prefix",
          "[engine]") {
  auto v = base_vocab();
  v.add("u", -1, 1);                     // 259
  v.add(std::string(kSp) + "u", -1, 1);  // 260
  v.add("<start", -1, 4);                // 261: a shorter user-defined token inside a control
  const spm_tokenizer tok(file_of(v));
  CHECK(tok.encode("<bos><start_of_turn>u\n\nu") == ids{256, 257, 259, 258, 259});
  CHECK(tok.encode("<start u") == ids{261, 260});
  CHECK(tok.decode({256, 257, 259, 258}) == "<bos><start_of_turn>u\n\n");
  CHECK(tok.id("<start_of_turn>") == 257);
  CHECK(tok.id("missing") == -1);
  // With add_space_prefix, raw text after a special (and at the start) gains a space.
  const spm_tokenizer spaced(file_of(v, true));
  CHECK(spaced.encode("u<bos>u") == ids{260, 256, 260});
  CHECK_THROWS_AS(tok.decode({static_cast<relokv::token_t>(v.tokens.size())}), std::out_of_range);
}

TEST_CASE("spm tokenizer: vocabularies it cannot use are refused, naming why", "[engine]") {
  auto v = base_vocab();
  const auto refused = [](const relokv_engine::gguf_file& f, const char* why) {
    try {
      const spm_tokenizer tok(f);
      FAIL("no error");
    } catch (const relokv_engine::gguf_error& e) {
      CHECK_THAT(e.what(), Catch::Contains(why));
    }
  };
  refused(file_of(v, false, "gpt2"), "not SentencePiece");
  auto no_byte = v;
  no_byte.types[65] = 1;  // <0x41> no longer a byte token
  refused(file_of(no_byte), "without the byte token for 65");
  auto bad_byte = v;
  bad_byte.tokens[7] = "<0xZZ>";
  refused(file_of(bad_byte), "is a byte token (type 6) but not <0xXX>");
  auto short_scores = v;
  short_scores.scores.pop_back();
  refused(file_of(short_scores), "scores");
  auto empty_special = v;
  empty_special.add("", 0.0f, 3);
  refused(file_of(empty_special), "is a special token and empty");
  // The facade picks the tokenizer from the file and refuses other models by name.
  CHECK_THROWS_WITH(relokv_engine::tokenizer(file_of(v, false, "bert")),
                    Catch::Contains("tokenizer model 'bert' is not supported"));
  const relokv_engine::tokenizer facade(file_of(v));
  CHECK(facade.format() == relokv_engine::chat_format::kPlain);  // no chat template
  CHECK(facade.chat("S", "Q") == "<bos>S\n\nQ\nAnswer:");
}
