#include "llama.hpp"

#include <relokv/layout/builder.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <vector>

#include "support/catch.hpp"
#include "support/test_data.hpp"

using relokv::token_t;
using relokv_engine::llama_engine;
using relokv_engine::llama_model;

namespace {
std::shared_ptr<const llama_model> model() {
  static const auto m = std::make_shared<const llama_model>(llama_model::synthetic());
  return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}
const auto kSys = relokv_test::iota_tokens(1, 21);
const auto kA = relokv_test::iota_tokens(40, 37);
const auto kB = relokv_test::iota_tokens(90, 29);
const auto kQ = relokv_test::iota_tokens(200, 9);
relokv::request_layout rag(const std::vector<token_t>& x, const std::vector<token_t>& y) {
  return relokv::layout_builder(16).prefix(kSys).span(x).span(y).question(kQ).build();
}
}  // namespace

TEMPLATE_TEST_CASE("engine: prefill through relokv equals a plain contiguous prefill", "[engine]",
                   relokv::pre_rotated, relokv::at_attention, relokv::block_relative) {
  llama_engine<TestType> eng(model(), 64);
  const auto l = rag(kA, kB);
  const auto want = relokv_engine::plain_prefill(*model(), l.tokens);
  relokv_engine::prefill_stats st;
  const auto got = eng.prefill(l, relokv::recompute::none{}, &st);
  CHECK(st.computed == l.num_tokens());
  CHECK(max_diff(got, want) < 1e-3);
  eng.end();
  // Reordered with full recompute: the same logits as no reuse at all.
  const auto l2 = rag(kB, kA);
  const auto want2 = relokv_engine::plain_prefill(*model(), l2.tokens);
  const auto full = eng.prefill(l2, relokv::recompute::full{}, &st);
  const std::int64_t full_work = st.token_layers;
  CHECK(full_work == std::int64_t{l2.num_tokens()} * model()->cfg.n_layers);
  CHECK(st.relocated_hits > 0);
  CHECK(st.computed == l2.num_tokens());
  CHECK(max_diff(full, want2) < 1e-3);
  eng.end(false);
  // none: only the question is computed, and the answer drifts.
  const auto none = eng.prefill(l2, relokv::recompute::none{}, &st);
  CHECK(st.computed == static_cast<int>(kQ.size()));
  CHECK(max_diff(none, want2) > 1e-3);
  eng.end(false);
  // A dynamic strategy runs end to end and computes fewer tokens than full.
  const auto dyn = eng.prefill(l2, relokv::recompute::deviation_topk(0.3f), &st);
  CHECK(dyn.size() == want2.size());
  CHECK(st.token_layers < full_work);
  CHECK(st.token_layers > std::int64_t{st.computed});  // more than one layer's worth
  eng.end(false);
}

TEST_CASE("engine: token ids outside the vocabulary are rejected at the entry points", "[engine]") {
  llama_engine<relokv::block_relative> eng(model(), 64);
  const std::int32_t vocab = model()->cfg.vocab;
  for (const token_t bad : {vocab, -1, 1 << 30}) {
    auto l = rag(kA, kB);
    l.tokens[30] = bad;
    CHECK_THROWS_AS(eng.prefill(l, relokv::recompute::none{}), std::out_of_range);
    CHECK_THROWS_AS(relokv_engine::plain_prefill(*model(), l.tokens), std::out_of_range);
  }
  (void)eng.prefill(rag(kA, kB), relokv::recompute::none{});
  CHECK_THROWS_AS(eng.decode(vocab), std::out_of_range);
  CHECK_THROWS_AS(eng.decode(-3), std::out_of_range);
  CHECK(eng.decode(5).size() == static_cast<std::size_t>(vocab));  // the request lives on
  eng.end(false);
}

TEST_CASE("engine: the three placements give the same logits", "[engine]") {
  const auto l = rag(kA, kB);
  llama_engine<relokv::pre_rotated> a(model(), 64);
  llama_engine<relokv::at_attention> b(model(), 64);
  llama_engine<relokv::block_relative> c(model(), 64);
  const auto la = a.prefill(l, relokv::recompute::none{});
  const auto lb = b.prefill(l, relokv::recompute::none{});
  const auto lc = c.prefill(l, relokv::recompute::none{});
  CHECK(max_diff(la, lb) < 1e-3);
  CHECK(max_diff(la, lc) < 1e-3);
}

TEST_CASE("engine: decode continues the prefill exactly", "[engine]") {
  llama_engine<relokv::block_relative> eng(model(), 64);
  const auto l = rag(kA, kB);
  const auto first = eng.prefill(l, relokv::recompute::none{});
  const token_t t = relokv_engine::argmax(first);
  const auto next = eng.decode(t);
  eng.end();
  auto extended = l.tokens;
  extended.push_back(t);
  CHECK(max_diff(next, relokv_engine::plain_prefill(*model(), extended)) < 1e-3);
  // Greedy generation crosses block boundaries (decode extends the request).
  llama_engine<relokv::at_attention> eng2(model(), 64);
  const auto gen = eng2.generate(eng2.prefill(l, relokv::recompute::none{}), 20);
  CHECK(gen.size() == 20);
  eng2.end();
}

TEST_CASE("engine: a document cached on its own is reused whole, its last block included",
          "[engine]") {
  llama_engine<relokv::block_relative> eng(model(), 64);
  // Cache kA (37 tokens: its third block holds 5) after the system prompt, as a RAG server
  // warms its passages; then decode after it, which must start a block of its own.
  const auto alone = relokv::layout_builder(16).prefix(kSys).span(kA).build();
  REQUIRE(alone.blocks.back().sealed);
  const auto first = eng.prefill(alone, relokv::recompute::none{});
  const token_t t = relokv_engine::argmax(first);
  const auto next = eng.decode(t);
  eng.end(true);
  auto extended = alone.tokens;
  extended.push_back(t);
  CHECK(max_diff(next, relokv_engine::plain_prefill(*model(), extended)) < 1e-3);
  // Read after another document: every block of kA is a relocated hit, none computed.
  relokv_engine::prefill_stats st;
  (void)eng.prefill(rag(kB, kA), relokv::recompute::none{}, &st);
  CHECK(st.relocated_hits == 3);
  CHECK(st.computed == static_cast<int>(kB.size() + kQ.size()));
  eng.end(false);
}
