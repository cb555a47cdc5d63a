// relokv inside llama.cpp on a real model (the first argument: smollm2 or qwen2.5-0.5b), against
// two references: llama.cpp's own prefill of the same tokens, and relokv's engine with the same
// placement (pre_rotated) and KV type (fp32). Skipped (77) without the model.
#define CATCH_CONFIG_RUNNER
#include <relokv/layout/builder.hpp>
#include <relokv/recompute/deviation_topk.hpp>
#include <relokv/recompute/first_k.hpp>
#include <relokv/recompute/full.hpp>
#include <relokv/recompute/none.hpp>
#include <relokv/recompute/seam_window.hpp>
#include <relokv/store/file_store.hpp>
#ifdef RELOKV_TEST_REDIS
#include <relokv/store/redis_store.hpp>

#include "support/redis_server.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine.hpp"
#include "gguf.hpp"
#include "llama.hpp"
#include "model_path.hpp"
#include "support/catch.hpp"
#include "support/skip.hpp"
#include "tokenizer.hpp"

namespace {
std::string g_name = "smollm2", g_model;

using relokv::token_t;
using adapter = relokv_llama_cpp::engine<float>;
using adapter16 = relokv_llama_cpp::engine<relokv::fp16>;

struct texts {
  std::vector<token_t> prefix, question;
  std::vector<std::vector<token_t>> spans;
};
const texts& words() {
  static const texts t = [] {
    auto f = relokv_engine::gguf_file::open(g_model);
    relokv_engine::bpe_tokenizer tok(f);
    texts r;
    r.prefix = tok.encode(
        "<|im_start|>system\nAnswer the question from the passages.<|im_end|>\n<|im_start|>user\n");
    for (const char* s :
         {"The lighthouse on Skerry Point was built in 1852 by the engineer Alan Brodie, who "
          "also designed the harbour walls of the nearby town of Carrick.",
          "Carrick is a fishing town on the west coast. Its population was 4,200 at the last "
          "census, and its school was founded by the Brodie family.",
          "Alan Brodie was born in Leith in 1811 and died in Carrick in 1879; he is buried in the "
          "churchyard beside the harbour he built."})
      r.spans.push_back(tok.encode(std::string(s) + "\n"));
    r.question = tok.encode(
        "Question: Where did the engineer of the Skerry Point lighthouse "
        "die?<|im_end|>\n<|im_start|>assistant\n");
    return r;
  }();
  return t;
}

relokv::request_layout spans_layout(std::vector<std::size_t> order) {
  relokv::layout_builder b(16);
  b.prefix(words().prefix);
  for (std::size_t i : order) b.span(words().spans[i]);
  return b.question(words().question).build();
}
std::vector<token_t> flat_tokens(const relokv::request_layout& l) { return l.tokens; }

/// Caches each span behind the prefix (as a RAG server warms what its retriever returns).
template <class E>
void warm(E& e) {
  for (const auto& s : words().spans) {
    relokv::layout_builder b(16);
    (void)e.prefill(b.prefix(words().prefix).span(s).build(), relokv::recompute::none{});
    e.end(true);
  }
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    s = std::max(s, double(std::fabs(b[i])));
  }
  return d / s;
}
std::size_t argmax(const std::vector<float>& v) {
  return static_cast<std::size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

relokv_llama_cpp::engine_options small(std::int32_t blocks = 256) {
  relokv_llama_cpp::engine_options o;
  o.num_blocks = blocks;
  o.n_ctx = 1024;
  o.n_batch = 64;  // several batches per request
  o.n_threads = 2;
  return o;
}

std::shared_ptr<const relokv_engine::llama_model> relokv_model() {
  static const auto m = [] {
    auto f = relokv_engine::gguf_file::open(g_model);
    return std::make_shared<const relokv_engine::llama_model>(
        relokv_engine::llama_model::from_gguf(f));
  }();
  return m;
}
}  // namespace

TEST_CASE("llama.cpp: full through relokv equals llama.cpp's own prefill", "[llama_cpp]") {
  adapter e(g_model, small());
  warm(e);
  const auto layout = spans_layout({2, 0, 1});
  relokv_engine::prefill_stats st;
  const auto got = e.prefill(layout, relokv::recompute::full{}, &st);
  e.end(false);
  CHECK(st.computed == static_cast<std::int32_t>(layout.tokens.size()));
  CHECK(st.relocated_hits > 0);  // the spans were found, and recomputed whole
  const auto ref = e.plain_prefill(flat_tokens(layout));
  REQUIRE(got.size() == ref.size());
  CHECK(got == ref);  // the same decode calls: bit for bit
}

TEST_CASE("llama.cpp: naive, EPIC and the seam window agree with relokv's engine", "[llama_cpp]") {
  // The same GGUF, placement (pre_rotated) and KV type (fp32) on both sides; the plans are the
  // same (the same cache code), so the engines differ by their kernels' rounding only: each
  // side's distance to its own full prefill must match the other's.
  adapter e(g_model, small());
  relokv_engine::llama_engine<relokv::pre_rotated, float> r(relokv_model(), 256);
  warm(e);
  warm(r);
  const auto layout = spans_layout({1, 2, 0});
  const auto e_full = e.plain_prefill(layout.tokens);
  const auto r_full = r.prefill(layout, relokv::recompute::full{});
  r.end(false);
  // The kernels' difference: llama.cpp quantizes activations to 8 bits for its quantized
  // products, relokv's engine does not everywhere; about 2% of the largest logit on SmolLM2.
  const double floor = max_rel(e_full, r_full);
  INFO("full prefill, llama.cpp against relokv: " << floor);
  CHECK(floor < 5e-2);
  const relokv::recompute::any_strategy strategies[] = {
      relokv::recompute::none{}, relokv::recompute::first_k{4}, relokv::recompute::seam_window{4}};
  for (const auto& s : strategies) {
    relokv_engine::prefill_stats se, sr;
    const auto le = e.prefill(layout, s, &se);
    e.end(false);
    const auto lr = r.prefill(layout, s, &sr);
    r.end(false);
    INFO("strategy " << s.index() << ": computed " << se.computed << " / " << sr.computed);
    CHECK(se.relocated_hits == sr.relocated_hits);
    CHECK(se.exact_hits == sr.exact_hits);
    CHECK(se.computed == sr.computed);
    const double d = max_rel(le, lr);
    const double moved = max_rel(le, e_full);  // what reuse changes, for scale
    INFO("llama.cpp vs relokv: " << d << ", reuse moved the logits by " << moved);
    CHECK(d < 2 * floor + 1e-2);
    CHECK(moved > d);  // the reuse effect is what both engines share
    CHECK(argmax(le) == argmax(lr));
  }
}

/// A span written to a store by one adapter and fetched by a second (an empty pool: another
/// process) gives the same logits as the span held in the pool; an fp16 adapter (another
/// fingerprint) finds none of the fp32 spans. `store` makes a fresh handle on the same store.
template <class MakeStore>
void store_round_trip(MakeStore&& store) {
  const auto layout = spans_layout({0, 2, 1});
  std::vector<float> held;
  {
    auto o = small();
    o.store = store();
    adapter writer(g_model, std::move(o));
    warm(writer);  // commits write the spans to the store
    held = writer.prefill(layout, relokv::recompute::none{});
    writer.end(false);
  }
  auto o = small();
  o.store = store();
  adapter reader(g_model, std::move(o));  // a second process: an empty pool
  relokv_engine::prefill_stats st;
  // Naive reuse: the store classes a span found by its content as relocated even where it sits
  // at its old position (EPIC would then recompute it), so `none` is what compares bytes.
  const auto fetched = reader.prefill(layout, relokv::recompute::none{}, &st);
  reader.end(false);
  CHECK(st.store_hits > 0);
  CHECK(st.store_blocks > 0);
  CHECK(fetched == held);
  // Another KV type is another fingerprint: the fp32 spans are not an fp16 engine's.
  auto o16 = small();
  o16.store = store();
  adapter16 other(g_model, std::move(o16));
  relokv_engine::prefill_stats s16;
  (void)other.prefill(layout, relokv::recompute::first_k{2}, &s16);
  other.end(false);
  CHECK(s16.store_hits == 0);
}

TEST_CASE("llama.cpp: a span from the store equals the span held in the pool", "[llama_cpp]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("relokv-llama-cpp-store-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  store_round_trip([&] { return relokv::any_store(relokv::file_store(dir.string())); });
  std::filesystem::remove_all(dir);
}

#ifdef RELOKV_TEST_REDIS
TEST_CASE("llama.cpp: a span from Redis equals the span held in the pool", "[llama_cpp]") {
  if (relokv_test::find_redis_server().empty()) {
    // scripts/test installs redis-server; under CI=true its absence fails (skip.hpp).
    if (relokv_test::in_ci()) FAIL("CI=true and no redis-server on PATH");
    WARN("no redis-server on PATH: the Redis round trip did not run");
    return;
  }
  relokv_test::redis_server server;
  store_round_trip([&] {
    return relokv::any_store(
        relokv::redis_store(relokv::redis_store_options::from_url(server.url())));
  });
}
#endif

TEST_CASE("llama.cpp: bad input is refused and loses nothing", "[llama_cpp]") {
  adapter e(g_model, small(40));
  warm(e);
  const auto layout = spans_layout({0, 1, 2});
  const auto before = e.prefill(layout, relokv::recompute::first_k{2});
  e.end(false);
  const auto free_before = e.cache().allocator().num_free();
  SECTION("a request longer than the context") {
    relokv::layout_builder b(16);
    std::vector<token_t> many(1100, words().prefix[0]);
    CHECK_THROWS_WITH(e.prefill(b.prefix(many).build(), relokv::recompute::none{}),
                      Catch::Contains("does not fit the context of 1024 cells"));
  }
  SECTION("a token outside the vocabulary") {
    relokv::layout_builder b(16);
    const std::vector<token_t> bad{1, 2, 1 << 30};
    CHECK_THROWS_WITH(e.prefill(b.prefix(bad).build(), relokv::recompute::none{}),
                      Catch::Contains("outside the vocabulary"));
  }
  SECTION("a strategy that needs a hook between layers") {
    CHECK_THROWS_WITH(e.prefill(layout, relokv::recompute::deviation_topk{0.15f}),
                      Catch::Contains("no hook between them"));
  }
  SECTION("an exhausted pool") {
    relokv::layout_builder b(16);
    std::vector<token_t> many(1000);
    for (std::size_t i = 0; i < many.size(); ++i) many[i] = static_cast<token_t>(100 + i);
    CHECK_THROWS_WITH(e.prefill(b.prefix(many).build(), relokv::recompute::none{}),
                      Catch::Contains("out of KV blocks"));
  }
  CHECK(e.cache().allocator().num_free() == free_before);
  const auto after = e.prefill(layout, relokv::recompute::first_k{2});
  e.end(false);
  CHECK(after == before);
}

int main(int argc, char** argv) {
  if (argc > 1 && argv[1][0] != '-' && argv[1][0] != '[') {
    g_name = argv[1];
    argv[1] = argv[0];
    ++argv;
    --argc;
  }
  g_model = relokv_engine::default_model_path(g_name);
  if (g_model.empty()) {
    const std::string why = "no " + g_name + " model (run scripts/get-model " + g_name +
                            "): the llama.cpp adapter tests did not run";
    return relokv_test::skip(why.c_str());
  }
  std::printf("model: %s\n", g_model.c_str());
  return Catch::Session().run(argc, argv);
}
