// --spans auto: passages found in plain prompts (relokv/layout/span_finder.hpp), on a tokenizer
// of one byte per token and on the real models' tokenizers (label model).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api.hpp"
#include "gguf.hpp"
#include "model_files.hpp"
#include "support/catch.hpp"
#include "support/prompt_formats.hpp"
#include "support/skip.hpp"
#include "tokenizer.hpp"

using chunk = relokv::found_segment;
using chunk_kind = relokv::found_kind;

namespace {
using relokv_test::bytes_options;  // the tests on bytes_prompt: a byte a token

std::vector<chunk> find_chunks(const std::vector<std::int32_t>& ids,
                               const std::vector<std::string>& pieces,
                               const relokv::span_finder_options& opt = bytes_options(),
                               const std::vector<std::int32_t>& forced = {},
                               relokv::span_index* known = nullptr) {
  return relokv::find_spans(ids, pieces, opt, forced, known);
}
}  // namespace

namespace {

/// One token per byte: ids are the bytes.
struct bytes_prompt {
  std::vector<std::int32_t> ids;
  std::vector<std::string> pieces;
  explicit bytes_prompt(const std::string& s) {
    for (const char c : s) {
      ids.push_back(static_cast<unsigned char>(c));
      pieces.emplace_back(1, c);
    }
  }
  [[nodiscard]] std::string text(const chunk& k) const {
    std::string out;
    for (std::int32_t i = k.begin; i < k.end; ++i) out += pieces[static_cast<std::size_t>(i)];
    return out;
  }
};

std::vector<std::string> spans_of(const bytes_prompt& p, const std::vector<chunk>& cs) {
  std::vector<std::string> out;
  for (const chunk& k : cs)
    if (k.kind == chunk_kind::kSpan) out.push_back(p.text(k));
  return out;
}

const std::string kA =
    "The lighthouse on Skerry Point was built in 1852 by the engineer Alan Brodie.";
const std::string kB = "Carrick is a fishing town on the west coast; its school dates from 1870.";
const std::string kC = "Alan Brodie was born in Leith in 1811 and died in Carrick in 1879.";
// Passages of 40-60 tokens on the real tokenizers (spans need 32).
const std::string kLongA = kA +
                           " It stands forty metres tall, and its light is seen for twenty "
                           "miles on a clear night; it was automated in 1989.";
const std::string kLongB = kB +
                           " The harbour holds sixty boats, most of them crab and lobster "
                           "boats that sail before dawn and land their catch by noon.";
const std::string kLongC = kC +
                           " His notebooks, with drawings of every harbour wall he built, "
                           "are kept in the town library and were printed in 1960.";

}  // namespace

TEST_CASE("chunks: blank lines cut passages; the chunks tile the prompt in order", "[server]") {
  const bytes_prompt p("Answer from the context.\n\n" + kA + "\n\n" + kB + "\n\nQuestion: who?");
  const auto cs = find_chunks(p.ids, p.pieces);
  REQUIRE(cs.size() >= 4);
  CHECK(cs.front().kind == chunk_kind::kPrefix);
  CHECK(cs.back().kind == chunk_kind::kQuestion);
  CHECK(cs.front().begin == 0);
  CHECK(cs.back().end == static_cast<std::int32_t>(p.ids.size()));
  for (std::size_t i = 1; i < cs.size(); ++i) CHECK(cs[i].begin == cs[i - 1].end);
  CHECK(spans_of(p, cs) == std::vector<std::string>{kA, kB});
  // The question: what follows the last span (the whitespace before it included).
  CHECK(p.text(cs.back()) == "\n\nQuestion: who?");
}

TEST_CASE("chunks: a passage is the same span in another order and another template", "[server]") {
  const std::vector<std::string> prompts = {
      // LangChain's "stuff" prompt
      "Use the following pieces of context to answer the question at the end.\n\n" + kC + "\n\n" +
          kA + "\n\n" + kB + "\n\nQuestion: where?\nHelpful Answer:",
      // LlamaIndex's QA template
      "Context information is below.\n---------------------\n" + kB + "\n\n" + kA + "\n\n" + kC +
          "\n---------------------\nGiven the context information, answer the query.\nQuery: "
          "where?\nAnswer: ",
      // a markdown list
      "Sources:\n- " + kA + "\n- " + kC + "\n- " + kB + "\n\nQuestion: where?",
      // a numbered list
      "Sources:\n1. " + kA + "\n2. " + kB + "\n3. " + kC + "\n\nQuestion: where?",
  };
  for (const std::string& s : prompts) {
    INFO(s);
    const bytes_prompt p(s);
    const auto spans = spans_of(p, find_chunks(p.ids, p.pieces));
    // Each passage is a span of its own, its list marker outside it (a number differs with
    // the order, the passage does not). Long template lines may be spans too.
    for (const std::string& want : {kA, kB, kC})
      CHECK(std::count(spans.begin(), spans.end(), want) == 1);
  }
}

TEST_CASE("chunks: short pieces and the whitespace between passages are computed, not spans",
          "[server]") {
  const bytes_prompt p("System.\n\nDocument 1:\n\n" + kA + "\n\n\n" + kB + "\n\nQ?");
  const auto cs = find_chunks(p.ids, p.pieces);
  for (const chunk& k : cs) {
    if (k.kind == chunk_kind::kSpan) {
      CHECK(k.end - k.begin >= 32);
      CHECK(p.text(k).find_first_of("\n") == std::string::npos);
    }
  }
  bool label_dependent = false;
  for (const chunk& k : cs)
    label_dependent |= k.kind == chunk_kind::kDependent && p.text(k).find("Document 1:") == 0;
  CHECK(label_dependent);
  // Neighbouring computed pieces are one segment.
  for (std::size_t i = 1; i < cs.size(); ++i)
    CHECK(!(cs[i].kind == chunk_kind::kDependent && cs[i - 1].kind == chunk_kind::kDependent));
}

TEST_CASE("chunks: a prompt with nothing to cut is one prefix", "[server]") {
  for (const std::string& s :
       std::vector<std::string>{"hello", "a\nb\nc\n", kA + " " + kB,
                                std::string("short\n\npieces\n\nonly"), std::string()}) {
    const bytes_prompt p(s);
    const auto cs = find_chunks(p.ids, p.pieces);
    if (s.empty()) {
      CHECK(cs.empty());
      continue;
    }
    REQUIRE(cs.size() == 1);
    CHECK(cs[0].kind == chunk_kind::kPrefix);
    CHECK(cs[0].end == static_cast<std::int32_t>(s.size()));
  }
}

TEST_CASE(
    "chunks: every line is cut; delimiter lines and titles are computed or kept with "
    "what follows",
    "[server]") {
  const bytes_prompt p("Context:\n===\n" + kA + "\n## " + kB + "\nA title\n" + kC + "\n***\nQ?");
  const auto spans = spans_of(p, find_chunks(p.ids, p.pieces));
  // A short line without final punctuation (a title) stays with the line after it.
  CHECK(spans == std::vector<std::string>{kA, "## " + kB, "A title\n" + kC});
}

TEST_CASE("chunks: a long run without separators is cut at anchors its content decides",
          "[server]") {
  // A pseudo-random run of 4,000 tokens, met behind two different openings.
  std::vector<std::int32_t> run;
  std::uint32_t x = 12345;
  for (int i = 0; i < 4000; ++i) {
    x = x * 1103515245u + 12345u;
    run.push_back(static_cast<std::int32_t>('a' + (x >> 16) % 26));
  }
  const auto cuts_in_run = [&](const std::string& opening) {
    bytes_prompt p(opening);
    for (const std::int32_t id : run) {
      p.ids.push_back(id);
      p.pieces.emplace_back(1, static_cast<char>(id));
    }
    std::vector<std::int32_t> out;
    for (const chunk& k : find_chunks(p.ids, p.pieces))
      if (k.begin > static_cast<std::int32_t>(opening.size()))
        out.push_back(k.begin - static_cast<std::int32_t>(opening.size()));
    return out;
  };
  const auto a = cuts_in_run("Read this:\n\n");
  const auto b = cuts_in_run("A longer opening, then the same text after a blank line.\n\n");
  REQUIRE(a.size() >= 10);  // about one per anchor_every tokens
  CHECK(a == b);
  for (std::size_t i = 1; i < a.size(); ++i) CHECK(a[i] - a[i - 1] >= bytes_options().min_span);
  // Without anchors the run is one piece.
  relokv::span_finder_options no = bytes_options();
  no.anchor_after = 0;
  bytes_prompt p("Read this:\n\n");
  for (const std::int32_t id : run) {
    p.ids.push_back(id);
    p.pieces.emplace_back(1, static_cast<char>(id));
  }
  CHECK(find_chunks(p.ids, p.pieces, no).size() == 1);
}

TEST_CASE("chunks: on real tokenizers the prompt's tokens are kept and passages recur as spans",
          "[server][model]") {
  for (const char* file : {"SmolLM2-135M-Instruct.Q4_1.gguf", "Qwen2.5-Coder-0.5B-Instruct.gguf",
                           "gemma-3-270m-q4_k_m.gguf"}) {
    const std::string path = relokv_test::fetched_model(file);
    if (path.empty()) continue;
    INFO(file);
    const auto gguf = relokv_engine::gguf_file::open(path);
    const relokv_engine::tokenizer tok(gguf);
    relokv_server::api_limits limits;
    const std::vector<std::string> passages = {kLongA, kLongB, kLongC};
    const std::vector<std::vector<std::size_t>> orders = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0}};
    // Per passage, the span tokens seen in each order: all equal where the cut is clean.
    std::map<std::size_t, std::vector<std::vector<relokv::token_t>>> seen;
    for (const auto& order : orders) {
      std::string context;
      for (std::size_t i : order) context += (context.empty() ? "" : "\n\n") + passages[i];
      relokv_server::chat_request r;
      r.messages.push_back({"user", "Use the following pieces of context to answer.\n\n" + context +
                                        "\n\nQuestion: where did he die?"});
      r.max_tokens = 8;
      const auto p = relokv_server::build_prompt(r, tok, "", true, limits);
      // The tokens served are the prompt's own: the same as without spans.
      const auto plain = relokv_server::build_prompt(r, tok, "", false, limits);
      CHECK(p.layout.tokens == plain.layout.tokens);
      REQUIRE(!p.chunks.empty());
      std::vector<relokv::token_t> all = p.prefix;
      all.insert(all.end(), p.question.begin(), p.question.end());
      for (const chunk& k : p.chunks) {
        if (k.kind != chunk_kind::kSpan) continue;
        const std::vector<relokv::token_t> t(all.begin() + k.begin, all.begin() + k.end);
        const std::string text = tok.decode(t);
        for (std::size_t i = 0; i < passages.size(); ++i)
          if (text.find(passages[i].substr(4, 20)) != std::string::npos) seen[i].push_back(t);
      }
    }
    for (const auto& [i, ts] : seen) {
      INFO("passage " << i);
      CHECK(ts.size() == orders.size());
      // The same tokens in every order, but where the tokenizer merged the passage's last
      // punctuation with what follows (then the last token differs, never the rest).
      for (const auto& t : ts) {
        REQUIRE(t.size() >= ts[0].size() - 1);
        CHECK(std::equal(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(ts[0].size() - 1),
                         ts[0].begin()));
      }
    }
    CHECK(seen.size() == passages.size());
  }
}

TEST_CASE("chunks: request threads share one span index (remember and match at once)",
          "[server][threads]") {
  // The server's HTTP threads call find_spans on one index (--known-spans): lookups share its
  // lock while other threads remember spans. Run under ThreadSanitizer (scripts/test --tsan).
  relokv::span_index known(256);  // small: generations turn over during the run
  const auto passages = relokv_test::test_passages();
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0), matched(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(static_cast<std::uint32_t>(w + 1));
      for (int r = 0; r < 40; ++r) {
        auto ps = passages;
        std::shuffle(ps.begin(), ps.end(), rng);
        ps.resize(4);
        const auto f = relokv_test::random_format(rng);
        const bytes_prompt p(relokv_test::render(f, ps, "Who?", r));
        const auto segs = find_chunks(p.ids, p.pieces, bytes_options(), {1}, &known);
        std::int32_t at = 0;
        for (const chunk& k : segs) {
          bad[static_cast<std::size_t>(w)] += k.begin != at;
          at = k.end;
          matched[static_cast<std::size_t>(w)] += k.remembered;
        }
        bad[static_cast<std::size_t>(w)] += at != static_cast<std::int32_t>(p.ids.size());
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(bad == std::vector<int>(4, 0));                           // every prompt tiled
  CHECK(std::accumulate(matched.begin(), matched.end(), 0) > 0);  // spans met across threads
  CHECK(known.size() <= 256);
}

TEST_CASE("chunks: a forced cut keeps the first passage out of the prefix", "[server]") {
  const std::string opening = "<|im_start|>user\n";
  const bytes_prompt p(opening + kA + "\n\n" + kB + "\n\nwho?");
  const auto plain = find_chunks(p.ids, p.pieces);
  CHECK(spans_of(p, plain) == std::vector<std::string>{kB});  // kA is in the prefix
  const auto cut =
      find_chunks(p.ids, p.pieces, bytes_options(), {static_cast<std::int32_t>(opening.size())});
  CHECK(p.text(cut.front()) == opening);
  CHECK(spans_of(p, cut) == std::vector<std::string>{kA, kB});
}

TEST_CASE("chunks: a conversation's earlier turns are cut the same way in its later requests",
          "[server][model]") {
  for (const char* file : {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}) {
    const std::string path = relokv_test::fetched_model(file);
    if (path.empty()) continue;
    INFO(file);
    const auto gguf = relokv_engine::gguf_file::open(path);
    const relokv_engine::tokenizer tok(gguf);
    relokv_server::api_limits limits;
    relokv_server::chat_request r;
    r.max_tokens = 8;
    r.messages.push_back({"system", "Answer from the context."});
    r.messages.push_back({"user", "Use the following pieces of context.\n\n" + kLongA + "\n\n" +
                                      kLongB + "\n\nQuestion: where?"});
    const auto one = relokv_server::build_prompt(r, tok, "", true, limits);
    r.messages.push_back({"assistant", "In Carrick."});
    r.messages.push_back({"user", "Which passage says so?"});
    const auto two = relokv_server::build_prompt(r, tok, "", true, limits);
    // The first request's prefix and spans are the second's, at the same places: its spans
    // are exact hits there (what follows the last span, the first question, is cut otherwise).
    REQUIRE(one.chunks.size() >= 3);
    REQUIRE(two.chunks.size() >= 3);
    CHECK(two.chunks.front().end == one.chunks.front().end);
    for (const chunk& k : one.chunks) {
      if (k.kind != chunk_kind::kSpan) continue;
      INFO("span at " << k.begin);
      CHECK(std::any_of(two.chunks.begin(), two.chunks.end(), [&](const chunk& t) {
        return t.kind == chunk_kind::kSpan && t.begin == k.begin && t.end == k.end;
      }));
    }
    CHECK(std::count_if(one.chunks.begin(), one.chunks.end(),
                        [](const chunk& k) { return k.kind == chunk_kind::kSpan; }) >= 2);
  }
}

TEST_CASE(
    "chunks: every format of the suite and random formats reuse each passage seen before "
    "on the real tokenizers",
    "[server][model]") {
  const auto passages = relokv_test::test_passages();
  std::vector<std::string> texts;
  for (const auto& [t, x] : passages) texts.push_back(x);
  auto formats = relokv_test::named_formats();
  std::mt19937 rng(99);
  for (int i = 0; i < 24; ++i)
    formats.emplace_back("random " + std::to_string(i), relokv_test::random_format(rng));
  for (const char* file : {"SmolLM2-135M-Instruct.Q4_1.gguf", "Qwen2.5-Coder-0.5B-Instruct.gguf",
                           "gemma-3-270m-q4_k_m.gguf"}) {
    const std::string path = relokv_test::fetched_model(file);
    if (path.empty()) continue;
    INFO(file);
    const auto gguf = relokv_engine::gguf_file::open(path);
    const relokv_engine::tokenizer tok(gguf);
    for (const auto& named : formats) {
      INFO(named.first);
      // Captured by the lambda below: a reference, not a structured binding (clang 14).
      const relokv_test::prompt_format& f = named.second;
      relokv_server::api_limits limits;  // a fresh server: nothing remembered
      const auto request = [&](const std::vector<std::size_t>& order, int n) {
        std::vector<std::pair<std::string, std::string>> ps;
        for (const std::size_t i : order) ps.push_back(passages[i]);
        relokv_server::chat_request r;
        r.max_tokens = 8;
        r.messages.push_back({"user", relokv_test::render(f, ps, "Where was he born?", n)});
        const auto p = relokv_server::build_prompt(r, tok, "Answer briefly.", true, limits);
        relokv_test::token_prompt t;
        t.ids = p.prefix;
        t.ids.insert(t.ids.end(), p.question.begin(), p.question.end());
        for (const auto id : t.ids) t.pieces.push_back(tok.decode({id}));
        for (const auto& piece : t.pieces) t.text += piece;
        return std::pair{p, t};
      };
      const auto [p1, t1] = request({0, 1, 2, 3, 4, 5}, 1);
      const auto [p2, t2] = request({5, 3, 6, 1, 4, 0, 2}, 2);
      std::vector<std::vector<std::int32_t>> seen;
      for (const chunk& k : p1.chunks)
        if (k.kind == chunk_kind::kSpan)
          seen.emplace_back(t1.ids.begin() + k.begin, t1.ids.begin() + k.end);
      const auto found = relokv_test::reuse_of(
          t2, p2.chunks, [](const chunk& k) { return k.kind == chunk_kind::kSpan; }, seen, texts);
      CHECK(found.size() == 7);
      for (const auto& r : found) {
        if (r.passage == 6) continue;
        INFO("passage " << r.passage << ": " << r.reused << " of " << r.tokens);
        CHECK(r.reused >= r.tokens - 2);
      }
    }
  }
}
