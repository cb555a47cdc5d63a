// relokv inside llama.cpp on a real model (the first argument: smollm2, qwen2.5-0.5b or
// gemma3-270m, whose windowed layers llama.cpp keeps whole for the adapter), against
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
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gguf.hpp"
#include "links.hpp"
#include "llama_cpp_engine.hpp"
#include "llama_engine.hpp"
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
    const relokv_engine::tokenizer tok(f);
    texts r;
    r.prefix = tok.encode(tok.open("Answer the question from the passages."));
    // Gemma 3: passages long enough (about 200 tokens each) that its 512-token windows cut
    // the request, its spans and the relocated ones.
    const int repeat = g_name == "gemma3-270m" ? 5 : 1;
    for (const char* s :
         {"The lighthouse on Skerry Point was built in 1852 by the engineer Alan Brodie, who "
          "also designed the harbour walls of the nearby town of Carrick.",
          "Carrick is a fishing town on the west coast. Its population was 4,200 at the last "
          "census, and its school was founded by the Brodie family.",
          "Alan Brodie was born in Leith in 1811 and died in Carrick in 1879; he is buried in the "
          "churchyard beside the harbour he built."}) {
      std::string text;
      for (int i = 0; i < repeat; ++i)
        text += (repeat > 1 ? "(" + std::to_string(i + 1) + ") " : std::string()) + s + "\n";
      r.spans.push_back(tok.encode(text));
    }
    r.question = tok.encode("Question: Where did the engineer of the Skerry Point lighthouse die?" +
                            tok.close());
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

/// The engines pick the same next token, unless `b`'s best two are closer than twice the
/// engines' difference `d` (as max_rel measures it): then either pick is a tie within their
/// rounding, and `a`'s pick must still be one of `b`'s near-best.
void check_same_pick(const std::vector<float>& a, const std::vector<float>& b, double d) {
  double scale = 1e-30;
  for (float x : b) scale = std::max(scale, double(std::fabs(x)));
  const std::size_t best = argmax(b);
  double second = -1e30;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (i != best) second = std::max(second, double(b[i]));
  const double margin = double(b[best]) - second, tol = 2 * d * scale;
  INFO("next token " << argmax(a) << " / " << best << ", margin " << margin << ", tolerance "
                     << tol);
  if (margin > tol)
    CHECK(argmax(a) == best);
  else
    CHECK(double(b[argmax(a)]) >= double(b[best]) - tol);
}

/// How many entries of `v` exceed v[i].
std::size_t rank_of(const std::vector<float>& v, std::size_t i) {
  return static_cast<std::size_t>(
      std::count_if(v.begin(), v.end(), [&](float x) { return x > v[i]; }));
}

relokv_llama_cpp::engine_options small(std::int32_t blocks = 256) {
  relokv_llama_cpp::engine_options o;
  o.num_blocks = blocks;
  o.n_ctx = g_name == "gemma3-270m" ? 4096 : 1024;
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

TEST_CASE("llama.cpp: the prompt in steps (sequence_engine) is prefill() in chunks",
          "[llama_cpp]") {
  adapter e(g_model, small());
  warm(e);
  const auto layout = spans_layout({2, 0, 1});
  const relokv::recompute::any_strategy s = relokv::recompute::first_k{4};
  relokv_engine::prefill_stats whole;
  const auto ref = e.prefill(layout, s, &whole);
  const auto ref_next = e.decode(static_cast<token_t>(argmax(ref)));
  e.end(false);
  // Steps of 64 rows (n_batch): llama.cpp's batches then break where prefill()'s would not
  // (a step ends inside a computed run), so the logits agree within llama.cpp's batch
  // rounding, not bit for bit; one step of every row is prefill() itself.
  for (const std::int32_t rows : {std::numeric_limits<std::int32_t>::max(), 64}) {
    INFO("rows a step " << rows);
    relokv_engine::sequence_engine& seqs = e;
    relokv_engine::prefill_stats st;
    const auto id = seqs.open(layout, s, &st, {}, 0);
    CHECK(seqs.live() == 1);
    CHECK(st.computed == whole.computed);  // the plan's count, before any row is computed
    CHECK(st.token_layers == 0);
    // One sequence at a time: a second waits for blocks, and nothing of it is kept.
    CHECK_THROWS_AS(seqs.open(layout, s, nullptr, {}, 0), relokv_engine::out_of_blocks);
    std::vector<float> logits;
    int steps = 0;
    while (logits.empty()) {
      relokv_engine::prefill_stats step;
      logits = seqs.prefill_step(id, rows, &step);
      CHECK(step.token_layers <= std::int64_t{rows} * e.n_layers());
      st.token_layers += step.token_layers;
      ++steps;
    }
    CHECK(st.token_layers == whole.token_layers);
    if (rows == 64) {
      CHECK(steps == (whole.computed + 63) / 64);
      CHECK(max_rel(logits, ref) < 1e-3);
      check_same_pick(logits, ref, max_rel(logits, ref));
    } else {
      CHECK(steps == 1);
      CHECK(logits == ref);
    }
    CHECK_THROWS_AS(seqs.prefill_step(id, rows, nullptr), std::logic_error);  // done
    REQUIRE(seqs.append(id, static_cast<token_t>(argmax(ref))));
    const std::vector<relokv_engine::sequence_engine::seq_id> ids{id};
    const auto next = seqs.decode_step(ids);
    REQUIRE(next.size() == 1);
    if (rows != 64) CHECK(next[0] == ref_next);
    seqs.close(id, /*commit=*/false);
    CHECK(seqs.live() == 0);
    seqs.close(id, /*commit=*/false);  // unknown now: ignored
  }
  // A sequence closed before its prompt was done commits nothing and frees its blocks.
  relokv_engine::sequence_engine& seqs = e;
  const auto cached = e.cache().cached_blocks();
  const auto id = seqs.open(spans_layout({1, 0, 2}), s, nullptr, {}, 0);
  CHECK(e.cache().allocator().num_free() < e.cache().allocator().capacity());
  CHECK(seqs.prefill_step(id, 1, nullptr).empty());
  seqs.close(id, /*commit=*/true);
  CHECK(seqs.live() == 0);
  CHECK(e.cache().cached_blocks() == cached);
  CHECK(e.cache().allocator().num_free() == e.cache().allocator().capacity());
}

TEST_CASE("llama.cpp: tenants and principals reach the cache (the provenance attack)",
          "[llama_cpp]") {
  // Issue 45, item 2: the adapter planned every request as tenant 0, principal 0, so the
  // provenance policy and the tenant salts did nothing through it.
  adapter e(g_model, small());
  const auto& w = words();
  // Principal 1 computes span 0 after other text of its own (the attack's injected
  // instruction): its K/V carry that text, so they are not canonical.
  const auto poisoned = relokv::layout_builder(16)
                            .prefix(w.prefix)
                            .dependent(w.spans[1])
                            .span(w.spans[0])
                            .question(w.question)
                            .build();
  (void)e.prefill(poisoned, relokv::recompute::none{}, nullptr, {}, 1);
  e.end(true);
  const auto victim = spans_layout({2, 0});
  SECTION("another principal computes the poisoned span itself") {
    relokv_engine::prefill_stats st;
    (void)e.prefill(victim, relokv::recompute::none{}, &st, {}, 2);
    e.end(false);
    CHECK(st.relocated_hits == 0);
    CHECK(e.cache().stats().provenance_denied > 0);
  }
  SECTION("the principal who computed it reuses it") {
    relokv_engine::prefill_stats st;
    (void)e.prefill(victim, relokv::recompute::none{}, &st, {}, 1);
    e.end(false);
    CHECK(st.relocated_hits > 0);
    CHECK(e.cache().stats().provenance_denied == 0);
  }
  SECTION("tenants share no block") {
    relokv::extra_keys a, b;
    a.tenant_salt = 7;
    b.tenant_salt = 8;
    for (const auto& sp : w.spans) {
      (void)e.prefill(relokv::layout_builder(16).prefix(w.prefix).span(sp).build(),
                      relokv::recompute::none{}, nullptr, a);
      e.end(true);
    }
    relokv_engine::prefill_stats other, same;
    (void)e.prefill(spans_layout({1, 2}), relokv::recompute::none{}, &other, b);
    e.end(false);
    CHECK(other.relocated_hits == 0);
    CHECK(other.exact_hits == 0);
    (void)e.prefill(spans_layout({1, 2}), relokv::recompute::none{}, &same, a);
    e.end(false);
    CHECK(same.relocated_hits > 0);
  }
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
  // Gemma 3: 4-6% (its 262k-row output and llama.cpp's 8-bit activations in every product).
  CHECK(floor < (g_name == "gemma3-270m" ? 8e-2 : 5e-2));
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
    // Tied to the measured floor (about 2% of the largest logit on SmolLM2): the engines'
    // own difference, plus a little for reuse compounding it.
    CHECK(d <= 1.5 * floor + 2e-3);
    CHECK(moved > d);  // the reuse effect is what both engines share
    check_same_pick(le, lr, d);
  }
}

TEST_CASE("llama.cpp: span-link rows are read as embeddings, as relokv's engine reads them",
          "[llama_cpp][links]") {
  // The adapter shipped for this model (tools/links/adapters): its rows go to llama.cpp as
  // llama_batch.embd, a call of their own between runs of token ids.
  const std::string file = std::string(RELOKV_LINKS_ADAPTERS) + "/" +
                           (g_name == "smollm2" ? std::string("smollm2-135m") : g_name) + ".gguf";
  const auto rows = relokv_engine::load_links(file, *relokv_model());
  const auto linked = relokv_engine::with_links(relokv_model(), rows);
  auto o = small();
  o.links = rows;
  adapter e(g_model, std::move(o));
  relokv_engine::llama_engine<relokv::pre_rotated, float> r(linked, 256);
  const std::int32_t vocab = relokv_model()->cfg.vocab;
  REQUIRE(e.n_vocab() == vocab);
  const auto with_rows = [&](std::vector<std::size_t> order) {
    relokv::layout_builder b(16);
    b.links(rows->layout_rows(vocab)).prefix(words().prefix);
    for (std::size_t i : order) b.span(words().spans[i]);
    return b.question(words().question).build();
  };
  const auto warm_rows = [&](auto& eng) {
    for (const auto& s : words().spans) {
      relokv::layout_builder b(16);
      (void)eng.prefill(b.links(rows->layout_rows(vocab)).prefix(words().prefix).span(s).build(),
                        relokv::recompute::none{});
      eng.end(true);
    }
  };
  const auto layout = with_rows({2, 0, 1});
  REQUIRE(std::count_if(layout.tokens.begin(), layout.tokens.end(),
                        [&](token_t t) { return t >= vocab; }) == rows->before_question);

  // Full prefill with the rows: llama.cpp's own and relokv's agree to their kernels' floor,
  // and the rows move the logits (a row read as zeros or as a token would not agree).
  const auto e_full = e.plain_prefill(layout.tokens);
  const auto r_full = r.prefill(layout, relokv::recompute::full{});
  r.end(false);
  const double floor = max_rel(e_full, r_full);
  INFO("full prefill with rows, llama.cpp against relokv: " << floor);
  CHECK(floor < (g_name == "gemma3-270m" ? 8e-2 : 5e-2));
  check_same_pick(e_full, r_full, floor);
  const auto plain = spans_layout({2, 0, 1});
  const auto e_plain = e.plain_prefill(plain.tokens);
  INFO("the rows moved llama.cpp's logits by " << max_rel(e_full, e_plain));
  CHECK(max_rel(e_full, e_plain) > 2 * floor);

  // Reuse under the adapter: the same plan on both sides and the same logits to the floor.
  warm_rows(e);
  warm_rows(r);
  for (const relokv::recompute::any_strategy& s :
       {relokv::recompute::any_strategy(relokv::recompute::none{}),
        relokv::recompute::any_strategy(relokv::recompute::first_k{2})}) {
    relokv_engine::prefill_stats se, sr;
    const auto le = e.prefill(layout, s, &se);
    e.end(false);
    const auto lr = r.prefill(layout, s, &sr);
    r.end(false);
    CHECK(se.relocated_hits > 0);
    CHECK(se.relocated_hits == sr.relocated_hits);
    CHECK(se.computed == sr.computed);
    const double d = max_rel(le, lr);
    INFO("reuse with rows (strategy " << s.index() << "), llama.cpp against relokv: " << d);
    // Gemma 3's floor varies between prompts (4-7% of the largest logit; the full prefill
    // here happens to be at its low end): its bound is the floor test's.
    const double bound = g_name == "gemma3-270m" ? 8e-2 : 1.5 * floor + 2e-3;
    CHECK(d <= bound);
    CHECK(d < max_rel(e_full, e_plain) / 2);  // far below what the rows themselves change
    // Each engine's next token is among the other's five most likely (a tie within the
    // kernels' rounding may swap the first two).
    CHECK(rank_of(lr, argmax(le)) < 5);
    CHECK(rank_of(le, argmax(lr)) < 5);
  }

  // Spans compiled under the adapter are not served to a request without it.
  relokv_engine::prefill_stats sp;
  (void)e.prefill(spans_layout({2, 0, 1}), relokv::recompute::none{}, &sp);
  e.end(false);
  CHECK(sp.relocated_hits == 0);
  CHECK(sp.exact_hits == 0);

  // An id past the adapter's rows is refused, and nothing is planned.
  auto bad = layout;
  bad.tokens.back() = vocab + rows->n;
  const auto planned = e.cache().stats().requests;
  CHECK_THROWS_AS(e.prefill(bad, relokv::recompute::none{}), std::invalid_argument);
  CHECK(e.cache().stats().requests == planned);

  // A deep adapter (per-layer K/V) has no way in through llama.cpp's API: refused by name at
  // construction, before any request.
  auto deep = std::make_shared<relokv_engine::link_adapter>(*rows);
  deep->deep = true;
  auto od = small();
  od.links = deep;
  std::string msg;
  try {
    adapter d(g_model, std::move(od));
  } catch (const std::invalid_argument& x) {
    msg = x.what();
  }
  INFO(msg);
  CHECK(msg.find("deep") != std::string::npos);
}

TEST_CASE("llama.cpp: exact hits are loaded from the pool, and load what was computed",
          "[llama_cpp]") {
  // Issue 45, item 10: the full-recompute test loads nothing (full reuses nothing), so it
  // passed with the loader deleted. Here every full block of the prompt is an exact hit that
  // the loader must place: with it broken, the last tokens see no context.
  adapter e(g_model, small());
  const auto flat = relokv::layout_builder(16).prefix(spans_layout({0, 1, 2}).tokens).build();
  (void)e.prefill(flat, relokv::recompute::none{});
  e.end(true);
  relokv_engine::prefill_stats st;
  const auto got = e.prefill(flat, relokv::recompute::none{}, &st);
  e.end(false);
  const auto full_blocks = static_cast<std::int32_t>(flat.tokens.size() / 16);
  CHECK(st.exact_hits >= full_blocks - 1);
  CHECK(st.computed <= 16);
  const auto ref = e.plain_prefill(flat.tokens);
  // llama.cpp's own floor: the same tokens prefilled in batches of other sizes (its kernels
  // are not batch-invariant: on Gemma 3 a prompt's logits move by 4-5% with the size of its
  // last batch, and one size can split the prompt as the reference does, so several).
  double floor = 0;
  for (const std::int32_t nb : {72, 96, 128}) {
    auto o = small();
    o.n_batch = nb;
    adapter other(g_model, std::move(o));
    floor = std::max(floor, max_rel(other.plain_prefill(flat.tokens), ref));
  }
  const double d = max_rel(got, ref);
  INFO("loaded exact hits vs plain prefill: " << d << "; llama.cpp's batching floor: " << floor);
  CHECK(d <= 2 * floor + 1e-4);
  check_same_pick(got, ref, d);
}

TEST_CASE("llama.cpp: more than 64 alternating cached and computed runs (load waves)",
          "[llama_cpp]") {
  // Each cached run is loaded as a sequence of its own, at most 63 at a time (a wave): 70 runs
  // take two waves. Against relokv's engine on the same plans, within the engines' floor.
  // The waves are the adapter's, whatever the model: on SmolLM2 only, since the 2,300-token
  // prompt's five full prefills on Qwen2.5-0.5B took most of the test's 900 s limit in CI.
  if (g_name != "smollm2") {
    WARN("load waves: run on smollm2 only (model-independent; slow on " << g_name << ")");
    return;
  }
  auto o = small(1024);
  o.n_ctx = 4096;
  o.n_batch = 256;
  adapter e(g_model, std::move(o));
  relokv_engine::llama_engine<relokv::pre_rotated, float> r(relokv_model(), 1024);
  const auto& w = words();
  constexpr int kRuns = 70;
  std::vector<std::vector<token_t>> cached(kRuns), fresh(kRuns);
  for (int i = 0; i < kRuns; ++i)
    for (int j = 0; j < 16; ++j) {
      cached[static_cast<std::size_t>(i)].push_back(1000 + 16 * i + j);
      fresh[static_cast<std::size_t>(i)].push_back(5000 + 16 * i + j);
    }
  for (const auto& c : cached) {
    const auto l = relokv::layout_builder(16).prefix(w.prefix).span(c).build();
    (void)e.prefill(l, relokv::recompute::none{});
    e.end(true);
    (void)r.prefill(l, relokv::recompute::none{});
    r.end(true);
  }
  relokv::layout_builder b(16);
  b.prefix(w.prefix);
  for (int i = 0; i < kRuns; ++i)
    b.span(cached[static_cast<std::size_t>(i)]).span(fresh[static_cast<std::size_t>(i)]);
  const auto layout = b.question(w.question).build();
  const auto e_full = e.plain_prefill(layout.tokens);
  const auto r_full = r.prefill(layout, relokv::recompute::full{});
  r.end(false);
  const double floor = max_rel(e_full, r_full);
  relokv_engine::prefill_stats se, sr;
  const auto le = e.prefill(layout, relokv::recompute::none{}, &se);
  e.end(false);
  const auto lr = r.prefill(layout, relokv::recompute::none{}, &sr);
  r.end(false);
  // The first run sits where it was compiled (right after the prefix): an exact hit, loaded in
  // place; the other 69 move.
  CHECK(se.relocated_hits == kRuns - 1);
  CHECK(se.relocated_hits == sr.relocated_hits);
  CHECK(se.computed == sr.computed);
  const double d = max_rel(le, lr), moved = max_rel(le, e_full);
  INFO("llama.cpp vs relokv with 70 loaded runs: " << d << "; full prefill floor " << floor
                                                   << "; reuse moved llama.cpp's by " << moved);
  // Measured: SmolLM2 within 1.5 x its floor; Qwen2.5-0.5B 0.038 against a floor of 0.016,
  // while reuse moved its logits by 0.47. Seventy loaded runs compound the engines' rounding;
  // a loader that misplaced a run would move them by the reuse effect's order.
  CHECK(d <= 3 * floor + 2e-3);
  CHECK(moved > 5 * d);
  check_same_pick(le, lr, d);
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

TEST_CASE("llama.cpp: a batch smaller than the sequences is refused, not an abort", "[llama_cpp]") {
  // llama.cpp asserts (GGML_ASSERT: the process aborts) when a batch has fewer output rows
  // than the context has sequences; the adapter uses 64.
  auto o = small();
  o.n_batch = 16;
  CHECK_THROWS_WITH(adapter(g_model, std::move(o)), Catch::Contains("n_batch must be at least 64"));
}

TEST_CASE("llama.cpp: bad input is refused and loses nothing", "[llama_cpp]") {
  // A pool that holds the spans and a request, and no more (Gemma's spans are longer).
  const std::int32_t pool = g_name == "gemma3-270m" ? 120 : 40;
  const std::int32_t ctx = small().n_ctx;
  adapter e(g_model, small(pool));
  warm(e);
  const auto layout = spans_layout({0, 1, 2});
  const auto before = e.prefill(layout, relokv::recompute::first_k{2});
  e.end(false);
  const auto free_before = e.cache().allocator().num_free();
  SECTION("a request longer than the context") {
    relokv::layout_builder b(16);
    std::vector<token_t> many(static_cast<std::size_t>(ctx) + 76, words().prefix[0]);
    CHECK_THROWS_WITH(
        e.prefill(b.prefix(many).build(), relokv::recompute::none{}),
        Catch::Contains("does not fit the context of " + std::to_string(ctx) + " cells"));
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
    std::vector<token_t> many(static_cast<std::size_t>(pool) * 16 + 40);
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
