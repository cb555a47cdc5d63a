#include "rag.hpp"
#include <relokv/layout/builder.hpp>
#include "run_engine.hpp"

#include "escalation_study.hpp"
#include "generate_escalating.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <variant>
#include <vector>

#include "store_mode.hpp"
#include "strategy_profile.hpp"

#include <unistd.h>

#include <filesystem>
#include <memory>

#include "support/catch.hpp"

namespace {
/// The message parse_qa_line throws for a line, or "" when it parses.
std::string complaint(const std::string& line) {
  try {
    (void)relokv_rag::parse_qa_line(line, "f.jsonl:7");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return {};
}
const std::string kGood =
    R"({"question": "caf\u00e9 \"x\"", "answer": "A", "context": [["T", ["s1", "s2"]]]})";
std::string with_question(const std::string& value) {
  return R"({"question": )" + value + R"(, "answer": "A", "context": []})";
}
}  // namespace

TEST_CASE("rag: dataset lines are parsed strictly", "[rag]") {
  const auto r = relokv_rag::parse_qa_line(kGood, "x");
  CHECK(r.question == "café \"x\"");
  REQUIRE(r.passages.size() == 1);
  CHECK(r.passages[0].second == "s1 s2");  // joined as the dataset intends
  // Every malformed line is an error that names the file and line.
  for (const std::string& bad :
       {std::string(R"({"a": [1, 2)"), std::string(R"({"a" 1})"), std::string(R"("open)"),
        with_question("1.2.3"), with_question("01"), with_question("+1"),
        with_question(R"("\ud800")"), with_question(R"("\uzzzz")"), with_question("\"tab\there\""),
        with_question("\"\xff\xfe\""), std::string(5000, '[') + std::string(5000, ']')}) {
    const std::string msg = complaint(bad);
    INFO(bad.substr(0, 60) << " -> " << msg);
    CHECK(msg.find("f.jsonl:7") != std::string::npos);
  }
  CHECK(complaint(std::string(100, '[') + std::string(100, ']')).find("nesting") !=
        std::string::npos);
  // Fields: missing, of the wrong type, or a number where text belongs.
  CHECK(complaint(R"({"answer": "A", "context": []})").find("'question'") != std::string::npos);
  CHECK(complaint(with_question("1e999")).find("f.jsonl:7: ") != std::string::npos);
  CHECK(complaint(with_question("12")).find("question is number") != std::string::npos);
  CHECK(complaint(R"({"question": "q", "answer": "A", "context": [["T", ["s", 3]]]})")
            .find("context[0][1][1]") != std::string::npos);
  CHECK(complaint(R"({"question": "q", "answer": "A", "context": [["T"]]})")
            .find("context[0] has 1") != std::string::npos);
}

TEST_CASE("rag: SQuAD's normalization deletes punctuation; EM; bootstrap intervals", "[rag]") {
  // Punctuation is deleted, not turned into a space: "U.S." is "us", "Jean-Paul" one word.
  CHECK(relokv_rag::squad_normalize("The U.S. Army") == "us army");
  CHECK(relokv_rag::squad_normalize("Jean-Paul  Sartre!") == "jeanpaul sartre");
  CHECK(relokv_rag::squad_normalize("an apple, a pear") == "apple pear");
  CHECK(relokv_rag::exact_match("the U.S.", "US") == 1.0);
  CHECK(relokv_rag::exact_match("Paris, France", "Paris") == 0.0);
  CHECK(relokv_rag::answer_f1("Jean-Paul", "Jean Paul") == 0.0);
  // The interval holds the mean, is seeded (reproducible), and shrinks to a point when every
  // value is the same.
  std::vector<double> v;
  for (int i = 0; i < 64; ++i) v.push_back(i % 4 == 0 ? 1.0 : 0.0);
  const auto e = relokv_rag::bootstrap_mean(v);
  CHECK(e.mean == Approx(0.25));
  CHECK(e.lo < 0.25);
  CHECK(e.hi > 0.25);
  CHECK(e.lo > 0.1);
  CHECK(e.hi < 0.4);
  const auto again = relokv_rag::bootstrap_mean(v);
  CHECK(again.lo == e.lo);
  const auto flat = relokv_rag::bootstrap_mean(std::vector<double>(10, 0.5));
  CHECK(flat.lo == 0.5);
  CHECK(flat.hi == 0.5);
}

TEST_CASE("rag: answer F1 as in SQuAD/CacheBlend", "[rag]") {
  CHECK(relokv_rag::answer_f1("Paris", "paris") == 1.0);
  CHECK(relokv_rag::answer_f1("The Paris.", "Paris") == 1.0);  // articles and punctuation
  CHECK(relokv_rag::answer_f1("in Paris France", "Paris") == Approx(0.5));
  CHECK(relokv_rag::answer_f1("Berlin", "Paris") == 0.0);
  CHECK(relokv_rag::percentile({1, 2, 3, 4}, 50) == Approx(2.5));
}

TEST_CASE("rag: JSONL workloads pool passages and report bad lines", "[rag]") {
  const std::string path = "rag_test_workload.jsonl";
  {
    std::ofstream o(path);
    o << R"({"question": "Q1?", "answer": "A", "context": [["T1", ["s1."]], ["T2", ["s2."]]]})"
      << "\n"
      << R"({"question": "Q2?", "answer": "B", "context": [["T2", ["s2."]], ["T3", ["s3."]]]})"
      << "\n";
  }
  const relokv_rag::text_codec codec{nullptr, 256};
  const auto w = relokv_rag::load_jsonl(path, 10, 1, codec);
  CHECK(w.requests.size() == 2);
  CHECK(w.corpus.size() == 3);  // T2 is shared
  CHECK(w.requests[1].passages.size() == 2);
  {
    std::ofstream o(path, std::ios::app);
    o << R"({"question": "Q3?", "answer": "C", "context": [["T4"]]})"
      << "\n";
  }
  CHECK_THROWS_WITH(relokv_rag::load_jsonl(path, 10, 1, codec), Catch::Contains(":3"));
  std::remove(path.c_str());
  const auto g = relokv_rag::generate(5, 12, 4, 1.0, 3, 512);
  CHECK(g.requests.size() == 5);
  for (const auto& r : g.requests) CHECK(r.passages.size() == 4);
  // No passages per question, or none in the corpus, is an error, not a division by zero.
  CHECK_THROWS_AS(relokv_rag::generate(5, 12, 0, 1.0, 3, 512), std::invalid_argument);
  CHECK_THROWS_AS(relokv_rag::generate(5, 0, 4, 1.0, 3, 512), std::invalid_argument);
  CHECK_THROWS_AS(relokv_rag::generate(5, 12, 4, -1.0, 3, 512), std::invalid_argument);
}

TEST_CASE("rag: two empty answers agree", "[rag]") {
  // A pretrained model (Gemma 3 270M) may answer "Answer:" with the newline that ends it: the
  // answer is empty, and the same empty answer from a variant agrees with it (it scored 0).
  const relokv::token_t stop = 7;
  const std::vector<std::vector<float>> steps{{0.0f, 1.0f, 2.0f}};
  relokv_rag::qa_request r;
  r.answer = "x";
  const relokv_rag::text_codec codec{nullptr, 16};
  relokv_rag::variant_result out;
  relokv_rag::detail::score_answer(steps, steps, {stop}, {stop}, stop, r, codec, out);
  relokv_rag::detail::score_answer(steps, steps, {3, 4, stop}, {3, 5, stop}, stop, r, codec, out);
  relokv_rag::detail::score_answer(steps, steps, {stop}, {3, stop}, stop, r, codec, out);
  REQUIRE(out.agreement.size() == 3);
  CHECK(out.agreement[0] == 1.0);
  CHECK(out.agreement[1] == 0.5);
  CHECK(out.agreement[2] == 0.0);
}

TEST_CASE("rag: a run needs at least one answer token", "[rag]") {
  const auto m =
      std::make_shared<const relokv_engine::llama_model>(relokv_engine::llama_model::synthetic());
  const relokv_rag::text_codec codec{nullptr, m->cfg.vocab};
  const auto w = relokv_rag::generate(1, 3, 2, 1.0, 3, m->cfg.vocab);
  const auto vars = relokv_rag::default_variants();
  for (const std::int32_t bad : {0, -5}) {
    relokv_rag::run_options o;
    o.max_answer = bad;
    CHECK_THROWS_WITH(relokv_rag::run(m, w, codec, vars, o),
                      Catch::Contains("max_answer must be at least 1"));
    relokv_rag::store_mode_options so;
    so.url = "memory:";
    so.max_answer = bad;
    CHECK_THROWS_WITH(relokv_rag::run_reader(m, w, codec, vars, so),
                      Catch::Contains("max_answer must be at least 1"));
  }
  relokv_rag::run_options one;
  one.max_answer = 1;
  const auto res = relokv_rag::run(m, w, codec, {vars[0], vars[2]}, one);
  REQUIRE(res.size() == 2);
  CHECK(res[1].agreement.size() == 1);
}

TEST_CASE("rag: exact hits agree with the reference; the fp32 noise floor is a row of its own",
          "[rag][exact]") {
  const auto m =
      std::make_shared<const relokv_engine::llama_model>(relokv_engine::llama_model::synthetic());
  const relokv_rag::text_codec codec{nullptr, m->cfg.vocab};
  const auto w = relokv_rag::generate(3, 6, 3, 1.0, 5, m->cfg.vocab);
  const auto vars = relokv_rag::default_variants();
  relokv_rag::run_options o;
  o.max_answer = 4;
  o.noise_floor = true;
  const auto res = relokv_rag::run(m, w, codec, {vars[0], vars[1], vars[2]}, o);
  REQUIRE(res.size() == 4);
  // Prefix caching (exact hits of the same prompt) answers as the reference does, bit for bit.
  REQUIRE(res[1].key == "prefix");
  for (double kl : res[1].kl) CHECK(kl == 0.0);
  for (double a : res[1].agreement) CHECK(a == 1.0);
  // The floor: full prefill with fp32 KV, all the work, a distance of its own (the KV's
  // rounding), measured on every question.
  const auto& floor = res.back();
  CHECK(floor.key == "fp32_floor");
  REQUIRE(floor.kl.size() == w.requests.size());
  for (double x : floor.work) CHECK(x == 1.0);
  double total = 0;
  for (double kl : floor.kl) total += kl;
  CHECK(total > 0.0);   // bf16 and fp32 KV differ
  CHECK(total < 1e-2);  // by rounding only
  // fp32 runs have no floor row (the reference is fp32 already).
  o.kv_dtype = "fp32";
  CHECK(relokv_rag::run(m, w, codec, {vars[0], vars[1]}, o).size() == 2);
}

TEST_CASE("rag: links variants read the adapter's rows, counted as work, spans relocated",
          "[rag][links]") {
  const auto base =
      std::make_shared<const relokv_engine::llama_model>(relokv_engine::llama_model::synthetic());
  auto rows = std::make_shared<relokv_engine::link_adapter>();
  rows->n = rows->before_question = 3;
  rows->dim = base->cfg.dim;
  rows->id = 0x5EED;
  for (int i = 0; i < 3 * base->cfg.dim; ++i) rows->rows.push_back(0.05f * float(i % 7) - 0.15f);
  const auto m = relokv_engine::with_links(base, rows);
  const relokv_rag::text_codec codec{nullptr, m->cfg.vocab};
  const auto w = relokv_rag::generate(3, 6, 3, 1.0, 5, m->cfg.vocab);
  relokv_rag::run_options o;
  o.max_answer = 4;
  auto vars = std::vector<relokv_rag::variant>{relokv_rag::variant_of({"full"}),
                                               relokv_rag::variant_of({"none"})};
  for (auto& v : relokv_rag::link_variants(2, 0.1f, false)) vars.push_back(v);
  REQUIRE(vars.size() == 5);
  CHECK(vars[2].key == "links");
  const auto res = relokv_rag::run(m, w, codec, vars, o);
  REQUIRE(res.size() == 5);
  for (std::size_t r = 0; r < w.requests.size(); ++r) {
    // The link rows are the work links adds to naive reuse: 3 rows at every layer, over the
    // prompt's own tokens.
    const double prompt = double(res[0].prompt_tokens[r]);
    CHECK(res[2].work[r] - res[1].work[r] == Approx(3.0 / prompt).epsilon(1e-9));
    CHECK(res[2].prompt_tokens[r] == res[0].prompt_tokens[r] + 3);
  }
  CHECK(res[2].relocated > 0);  // the passages, cached under the adapter's keys
  CHECK(res[3].relocated > 0);
  // Without an adapter the links variants are refused by name.
  CHECK_THROWS_WITH(relokv_rag::run(base, w, codec, vars, o), Catch::Contains("span-link adapter"));
}

TEST_CASE("profile: saved, loaded, checked against the model; bad files named", "[rag]") {
  const auto m = relokv_engine::llama_model::synthetic();
  relokv_engine::strategy_profile p;
  p.model = m.cfg.name;
  p.arch = m.cfg.arch;
  p.n_layers = m.cfg.n_layers;
  p.safe = true;
  p.strategy = {"union", 4, 0.1f};
  p.unsafe_kinds = {"first_k"};
  const std::string path = "relokv_profile_test.json";
  relokv_engine::save_profile(path, p);
  const auto q = relokv_engine::load_profile(path);
  CHECK(q.strategy.kind == "union");
  CHECK(q.strategy.k == 4);
  CHECK(q.unsafe_kinds == std::vector<std::string>{"first_k"});
  const auto s = relokv_engine::profile_strategy(q, m);
  CHECK(std::holds_alternative<relokv::recompute::first_k_and_topk>(s.get()));
  // Unsafe: full recompute, whatever strategy the file names.
  auto u = q;
  u.safe = false;
  CHECK(
      std::holds_alternative<relokv::recompute::full>(relokv_engine::profile_strategy(u, m).get()));
  // Another model's profile is refused.
  auto other = q;
  other.model = "SmolLM2";
  CHECK_THROWS_WITH(relokv_engine::profile_strategy(other, m), Catch::Contains("not 'synthetic'"));
  // A profile calibrated with a span-link adapter is served only with that adapter.
  auto linked = q;
  linked.links_id = "00000000000000ab";
  linked.links_file = "smollm2-135m.gguf";
  relokv_engine::save_profile(path, linked);
  const auto lq = relokv_engine::load_profile(path);
  CHECK(lq.links_id == linked.links_id);
  CHECK(lq.links_file == linked.links_file);
  CHECK_THROWS_WITH(relokv_engine::profile_strategy(lq, m), Catch::Contains("--links"));
  auto rows = std::make_shared<relokv_engine::link_adapter>();
  rows->n = 1;
  rows->rows.assign(static_cast<std::size_t>(m.cfg.dim), 0.0f);
  rows->id = 0xab;
  const auto with =
      relokv_engine::with_links(std::make_shared<const relokv_engine::llama_model>(m), rows);
  CHECK(std::holds_alternative<relokv::recompute::first_k_and_topk>(
      relokv_engine::profile_strategy(lq, *with).get()));
  rows->id = 0xac;  // another adapter
  CHECK_THROWS_WITH(relokv_engine::profile_strategy(lq, *with), Catch::Contains("--links"));
  // Malformed files: the file and the field are named.
  auto bad = [&](const std::string& text) {
    std::ofstream(path) << text;
    try {
      (void)relokv_engine::load_profile(path);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(bad("{").find("not JSON") != std::string::npos);
  CHECK(bad(R"({"format": "x", "version": 1})").find("not a relokv strategy profile") !=
        std::string::npos);
  relokv_engine::save_profile(path, p);
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto kind = text.find("\"union\"");
  REQUIRE(kind != std::string::npos);
  CHECK(bad(text.substr(0, kind) + "\"telepathy\"" + text.substr(kind + 7))
            .find("unknown strategy kind 'telepathy'") != std::string::npos);
  const auto ratio = text.find("\"ratio\"");
  CHECK(bad(text.substr(0, ratio) + "\"ratio_\"" + text.substr(ratio + 7)).find("strategy.ratio") !=
        std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("rag store mode: a reader with an empty pool answers from a writer's spans",
          "[rag][store]") {
  const auto model =
      std::make_shared<const relokv_engine::llama_model>(relokv_engine::llama_model::synthetic());
  const auto w = relokv_rag::generate(3, 8, 3, 1.0, 5, model->cfg.vocab);
  const relokv_rag::text_codec codec{nullptr, model->cfg.vocab};
  const auto dir =
      std::filesystem::temp_directory_path() / ("relokv_rag_store_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  relokv_rag::store_mode_options so;
  so.url = "file:" + dir.string();
  so.num_blocks = 256;
  so.max_answer = 4;
  const auto wr = relokv_rag::run_writer(model, w, so);
  CHECK(wr.passages > 0);
  CHECK(wr.stats.store_writes > 0);
  CHECK(wr.stats.store_write_failures == 0);
  const auto all = relokv_rag::default_variants();
  const std::vector<relokv_rag::variant> vars = {all[0], all[2], all[1]};  // full, naive, prefix
  REQUIRE(vars[2].key == "prefix");
  const auto rr = relokv_rag::run_reader(model, w, codec, vars, so);
  REQUIRE(rr.rows.size() == 3);
  CHECK(rr.rows[0].store == 0);
  CHECK(rr.rows[0].pool == 0);
  // Every sealed block of every question came from the store; only the questions' open last
  // blocks were computed.
  CHECK(rr.rows[1].store > 0);
  CHECK(rr.rows[1].pool == 0);
  CHECK(rr.rows[1].computed == 3);
  CHECK(rr.stats.store_rejected_total() == 0);
  CHECK(rr.rows[1].ttft_ms.size() == 3);
  // Prefix caching runs on the whole prompt as one prefix, as its name says: exact keys only,
  // so its answers are full recompute's bit for bit (on the span layout it would be naive
  // PIC, KL > 0).
  for (std::size_t q = 0; q < 3; ++q) {
    CHECK(rr.rows[2].kl[q] == 0.0);
    CHECK(rr.rows[2].agreement[q] == 1.0);
  }
  CHECK(rr.rows[1].kl[0] + rr.rows[1].kl[1] + rr.rows[1].kl[2] > 0.0);
  std::filesystem::remove_all(dir);
  so.url = "ftp://nowhere";
  CHECK_THROWS_AS(relokv_rag::run_writer(model, w, so), relokv::error);
}

TEST_CASE("rag: passages compiled behind an absorber or alone are reused as spans", "[rag]") {
  const auto m =
      std::make_shared<const relokv_engine::llama_model>(relokv_engine::llama_model::synthetic());
  const relokv_rag::text_codec codec{nullptr, m->cfg.vocab};
  const auto w = relokv_rag::generate(3, 6, 3, 1.0, 5, m->cfg.vocab);
  const auto vars = relokv_rag::default_variants();
  relokv_rag::run_options o;
  o.max_answer = 2;
  for (const std::string mode : {"prompt", "alone", "absorber:3"}) {
    INFO("compile " << mode);
    o.compile = mode;
    const auto res = relokv_rag::run(m, w, codec, {vars[0], vars[2]}, o);  // full, naive
    REQUIRE(res.size() == 2);
    // The passages are found, whatever they were compiled behind (the request names it as
    // its span_context): at least one block of each of the 3 x 3 passages (behind the prompt,
    // the first passage of a question is an exact hit).
    CHECK(res[1].relocated + res[1].exact >= 9);
    CHECK(res[1].relocated >= 6);
    // The system prompt is cached whatever the passages are compiled behind: each request
    // meets its full blocks as exact hits (an absorber once made every request compute it).
    CHECK(res[1].exact >= static_cast<std::int64_t>(w.requests.size() * (w.prefix.size() / 16)));
  }
  for (const std::string bad : {"absorber:0", "absorber:999", "absorber:", "absorber:2x", "x"}) {
    o.compile = bad;
    CHECK_THROWS_WITH(relokv_rag::run(m, w, codec, {vars[0], vars[2]}, o),
                      Catch::Contains("compile mode '" + bad + "'"));
  }
}

TEST_CASE("escalation: ROC AUC as the Mann-Whitney statistic", "[rag][escalation]") {
  using relokv_rag::roc_auc;
  CHECK(roc_auc({0.1, 0.2, 0.8, 0.9}, {false, false, true, true}) == 1.0);
  CHECK(roc_auc({0.9, 0.8, 0.2, 0.1}, {false, false, true, true}) == 0.0);
  CHECK(roc_auc({0.5, 0.5, 0.5, 0.5}, {false, true, false, true}) == 0.5);  // ties count half
  // One of four positive-negative pairs is misordered.
  CHECK(roc_auc({0.1, 0.3, 0.2, 0.4}, {false, false, true, true}) == 0.75);
  CHECK(roc_auc({0.1, 0.2}, {true, true}) == 0.5);  // one class only: no information
  // F1 over full's F1: paired resampling; resamples with no F1 in the denominator left out.
  const auto same = relokv_rag::bootstrap_ratio({0.5, 0.0, 1.0}, {0.5, 0.0, 1.0});
  CHECK(same.mean == 1.0);
  CHECK(same.lo == 1.0);
  CHECK(same.hi == 1.0);
  const auto half = relokv_rag::bootstrap_ratio({0.25, 0.25}, {0.5, 0.5});
  CHECK(half.mean == 0.5);
  CHECK(relokv_rag::bootstrap_ratio({1.0}, {0.0}).mean == 0.0);  // undefined: reported as 0
  CHECK(relokv_rag::split_half(5, false) == std::vector<std::size_t>{0, 2, 4});
  CHECK(relokv_rag::split_half(5, true) == std::vector<std::size_t>{1, 3});
}

TEST_CASE("escalation: the engine loop does what the simulation of its policy says",
          "[rag][escalation]") {
  const auto m =
      std::make_shared<const relokv_engine::llama_model>(relokv_engine::llama_model::synthetic());
  const relokv_rag::text_codec codec{nullptr, m->cfg.vocab};
  const auto w = relokv_rag::generate(8, 12, 3, 1.0, 11, m->cfg.vocab);
  const auto full = relokv_rag::variant_of({"full"});
  const auto naive = relokv_rag::variant_of({"none"});
  relokv_rag::run_options o;
  o.max_answer = 5;
  const auto base = relokv_rag::run(m, w, codec, {full, naive}, o);
  REQUIRE(base.size() == 2);
  const auto& nv = base[1];
  REQUIRE(nv.margin0.size() == w.requests.size());
  REQUIRE(nv.step_margins.size() == w.requests.size());
  for (std::size_t k = 0; k < w.requests.size(); ++k) {
    CHECK(nv.margin0[k] >= 0.0);
    CHECK(nv.margin0[k] <= 1.0);
    CHECK(nv.step_margins[k].size() >= 1);
    CHECK(nv.step_margins[k][0] == nv.margin0[k]);
    CHECK(nv.escalated[k] == 0.0);
    // Diverged where the answer first differs; agreement 1 only when it never does.
    CHECK((nv.diverged_at[k] < 0) == (nv.agreement[k] == 1.0));
    CHECK(nv.tf_agreement[k] >= 0.0);
    CHECK(nv.tf_agreement[k] <= 1.0);
  }
  std::vector<std::size_t> all(w.requests.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  // A first-token margin threshold between the requests' margins: some escalate, some not.
  std::vector<double> m0 = nv.margin0;
  std::sort(m0.begin(), m0.end());
  const double cut = (m0[m0.size() / 2 - 1] + m0[m0.size() / 2]) / 2;
  REQUIRE(m0[m0.size() / 2 - 1] < m0[m0.size() / 2]);
  const auto sigs = relokv_rag::escalation_signals();
  const auto& margin0 = sigs[0];
  REQUIRE(margin0.name == "margin0");
  const auto sim = relokv_rag::simulate(nv, margin0, -cut, all);
  CHECK(sim.escalated == 0.5);
  auto esc = naive;
  esc.escalation = relokv_rag::policy_of(margin0, -cut);
  CHECK(esc.escalation.label().rfind("margin<", 0) == 0);
  const auto run = relokv_rag::run(m, w, codec, {full, esc}, o);
  const auto& ev = run[1];
  double agree = 0, work = 0;
  for (std::size_t k = 0; k < w.requests.size(); ++k) {
    CHECK(ev.escalated[k] == (nv.margin0[k] < cut ? 1.0 : 0.0));
    if (ev.escalated[k] > 0) {
      // Full recompute's first token, and its whole answer.
      CHECK(ev.escalated_at[k] == 0);
      CHECK(ev.kl[k] == 0.0);
      CHECK(ev.agreement[k] == 1.0);
      CHECK(ev.work[k] > 1.0);  // the first attempt counts too
    } else {
      CHECK(ev.agreement[k] == nv.agreement[k]);
      CHECK(ev.work[k] == nv.work[k]);
    }
    agree += ev.agreement[k];
    work += ev.work[k];
  }
  CHECK(agree / double(all.size()) == Approx(sim.agreement));
  CHECK(work / double(all.size()) == Approx(sim.work).epsilon(0.02));  // padding differs
  // Before every token: requests escalate at the step where the margin first falls below it,
  // and those whose answer had not yet left full's end with full's answer.
  const auto& every = sigs[2];
  REQUIRE(every.name == "margin_every");
  std::vector<double> steps;
  for (const auto& v : nv.step_margins) steps.insert(steps.end(), v.begin(), v.end());
  std::sort(steps.begin(), steps.end());
  const double mid = steps[steps.size() / 3];
  auto esc2 = naive;
  esc2.escalation = relokv_rag::policy_of(every, -mid);
  CHECK(esc2.escalation.stage == relokv::recompute::escalation_stage::every_token);
  const auto run2 = relokv_rag::run(m, w, codec, {full, esc2}, o);
  int mid_answer = 0;
  for (std::size_t k = 0; k < w.requests.size(); ++k) {
    const auto& sm = nv.step_margins[k];
    const auto at = std::find_if(sm.begin(), sm.end(), [&](double x) { return x < mid; });
    const double want = at == sm.end() ? -1.0 : double(at - sm.begin());
    CHECK(run2[1].escalated_at[k] == want);
    mid_answer += want > 0;
    if (want >= 0 && (nv.diverged_at[k] < 0 || want <= nv.diverged_at[k]))
      CHECK(run2[1].agreement[k] == 1.0);
  }
  CHECK(mid_answer > 0);  // the case exercised escalation after a first token
  // A draft held back: escalated where its least sure step is below the cut, then replaced
  // by full recompute's answer whole; the simulation says the same.
  const auto& draft = sigs[4];
  REQUIRE(draft.name == "margin_draft");
  std::vector<double> mins = nv.min_margin;
  std::sort(mins.begin(), mins.end());
  const double dcut = (mins[mins.size() / 2 - 1] + mins[mins.size() / 2]) / 2;
  REQUIRE(mins[mins.size() / 2 - 1] < mins[mins.size() / 2]);
  auto esc3 = naive;
  esc3.escalation = relokv_rag::policy_of(draft, -dcut);
  CHECK(esc3.escalation.label().ends_with("@draft"));
  const auto run3 = relokv_rag::run(m, w, codec, {full, esc3}, o);
  const auto dsim = relokv_rag::simulate(nv, draft, -dcut, all);
  CHECK(dsim.escalated == 0.5);
  double dagree = 0;
  for (std::size_t k = 0; k < w.requests.size(); ++k) {
    CHECK(run3[1].escalated[k] == (nv.min_margin[k] < dcut ? 1.0 : 0.0));
    if (run3[1].escalated[k] > 0) CHECK(run3[1].agreement[k] == 1.0);
    dagree += run3[1].agreement[k];
  }
  CHECK(dagree / double(all.size()) == Approx(dsim.agreement));
}

TEST_CASE("profile: the escalation policy travels with it; a bad one is named", "[rag]") {
  const auto m = relokv_engine::llama_model::synthetic();
  relokv_engine::strategy_profile p;
  p.model = m.cfg.name;
  p.arch = m.cfg.arch;
  p.n_layers = m.cfg.n_layers;
  p.safe = true;
  p.strategy = {"question", 0, 0.15f};
  p.escalation = relokv::recompute::escalation_policy::parse("margin<0.25@every");
  p.escalated = 0.3;
  const std::string path = "relokv_profile_esc_test.json";
  relokv_engine::save_profile(path, p);
  const auto q = relokv_engine::load_profile(path);
  CHECK(q.escalation.label() == "margin<0.25@every");
  CHECK(q.escalated == 0.3);
  std::string text;
  {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = text.find("margin<0.25@every");
  REQUIRE(at != std::string::npos);
  std::ofstream(path) << text.substr(0, at) + "margin<7@every" + text.substr(at + 17);
  CHECK_THROWS_WITH(relokv_engine::load_profile(path), Catch::Contains("escalation.policy"));
  std::remove(path.c_str());
}

TEST_CASE("engine API: generate_escalating recomputes once, where the policy says",
          "[rag][escalation]") {
  const auto m =
      std::make_shared<const relokv_engine::llama_model>(relokv_engine::llama_model::synthetic());
  relokv_engine::llama_engine<relokv::block_relative, relokv::bf16> eng(m, 256);
  std::vector<relokv::token_t> a, b, q;
  for (int i = 0; i < 40; ++i) {
    a.push_back(5 + i % 50);
    b.push_back(60 + i % 40);
  }
  for (int i = 0; i < 8; ++i) q.push_back(100 + i);
  // Cache the spans on their own, then read them in the other order.
  for (const auto* s : {&b, &a}) {
    (void)eng.prefill(relokv::layout_builder(16).span(*s).build(), relokv::recompute::full{});
    eng.end(true);
  }
  std::vector<relokv::token_t> flat(a);
  flat.insert(flat.end(), b.begin(), b.end());
  flat.insert(flat.end(), q.begin(), q.end());
  const auto spans = relokv::layout_builder(16).span(a).span(b).question(q).build();
  const auto whole = relokv::layout_builder(16).prefix(flat).build();
  relokv_engine::prefill_stats fst;
  const auto full = eng.generate(eng.prefill(whole, relokv::recompute::full{}, &fst), 6);
  eng.end(false);
  using relokv::recompute::escalation_policy;
  // Never: the reuse strategy's own answer, its own work.
  relokv_engine::prefill_stats st;
  const auto own = eng.generate(eng.prefill(spans, relokv::recompute::none{}, &st), 6);
  eng.end(false);
  auto r = relokv_engine::generate_escalating(eng, spans, whole, relokv::recompute::none{},
                                              escalation_policy{}, 6);
  eng.end(false);
  CHECK(r.tokens == own);
  CHECK(r.escalated_at == -1);
  CHECK(r.token_layers == st.token_layers);
  // Before the first token whatever the margin: full recompute's answer; both prefills count.
  r = relokv_engine::generate_escalating(eng, spans, whole, relokv::recompute::none{},
                                         escalation_policy::parse("entropy>0@first"), 6);
  eng.end(false);
  CHECK(r.tokens == full);
  CHECK(r.escalated_at == 0);
  CHECK(r.token_layers == st.token_layers + fst.token_layers);
  r = relokv_engine::generate_escalating(eng, spans, whole, relokv::recompute::none{},
                                         escalation_policy::parse("entropy>0@every"), 6);
  eng.end(false);
  CHECK(r.escalated_at == 0);  // @every looks before the first token too
  // A draft: generated, then replaced whole by full recompute's answer.
  r = relokv_engine::generate_escalating(eng, spans, whole, relokv::recompute::none{},
                                         escalation_policy::parse("entropy>0@draft"), 6);
  eng.end(false);
  CHECK(r.tokens == full);
  CHECK(r.escalated_at == 0);
  CHECK(r.token_layers == st.token_layers + fst.token_layers);
  r = relokv_engine::generate_escalating(eng, spans, whole, relokv::recompute::none{},
                                         escalation_policy::parse("margin<0@draft"), 6);
  eng.end(false);
  CHECK(r.tokens == own);  // a margin is never below 0: the draft is sent
  CHECK_THROWS_AS(relokv_engine::generate_escalating(eng, spans, whole, relokv::recompute::none{},
                                                     escalation_policy{true, {}, {}, 2.0f}, 6),
                  relokv::error);
}

TEST_CASE("escalation: the least-work strategy and threshold for a target, held out",
          "[rag][escalation]") {
  // Eight requests. Variant 1 is cheap (work 0.1): its sure answers (margin 0.9) are full's,
  // its unsure ones (margin 0.1) are not. Variant 2 costs 0.5 and agrees on 7 of 8.
  relokv_rag::variant_result full, cheap, mid;
  for (int k = 0; k < 8; ++k) {
    const bool unsure = k == 2 || k == 5;  // one in each half
    for (auto* v : {&full, &cheap, &mid}) {
      v->f1.push_back(0.5);
      v->tf_agreement.push_back(1.0);
      v->naive_kl.push_back(-1);
      v->escalated.push_back(0);
      v->escalated_at.push_back(-1);
      v->prompt_tokens.push_back(100);
    }
    full.agreement.push_back(1.0);
    full.work.push_back(1.0);
    full.diverged_at.push_back(-1);
    for (auto* v : {&full, &mid}) {
      v->margin0.push_back(0.5);
      v->entropy0.push_back(1.0);
      v->min_margin.push_back(0.5);
      v->max_entropy.push_back(1.0);
      v->step_margins.push_back({0.5});
      v->step_entropies.push_back({1.0});
    }
    cheap.margin0.push_back(unsure ? 0.1 : 0.9);
    cheap.entropy0.push_back(unsure ? 2.0 : 0.2);
    cheap.min_margin.push_back(unsure ? 0.1 : 0.9);
    cheap.max_entropy.push_back(unsure ? 2.0 : 0.2);
    cheap.step_margins.push_back({unsure ? 0.1 : 0.9});
    cheap.step_entropies.push_back({unsure ? 2.0 : 0.2});
    cheap.agreement.push_back(unsure ? 0.0 : 1.0);
    cheap.diverged_at.push_back(unsure ? 0 : -1);
    cheap.work.push_back(0.1);
    mid.agreement.push_back(k == 5 ? 0.0 : 1.0);
    mid.diverged_at.push_back(k == 5 ? 0 : -1);
    mid.work.push_back(0.5);
  }
  const std::vector<relokv_rag::variant_result> res = {full, cheap, mid};
  // The margin tells the cheap variant's divergent requests apart: AUC 1.
  std::vector<bool> div;
  for (double d : cheap.diverged_at) div.push_back(d >= 0);
  CHECK(relokv_rag::roc_auc(relokv_rag::risk_of(cheap, relokv_rag::escalation_signals()[0]), div) ==
        1.0);
  const auto c = relokv_rag::choose_escalation(res, 0.95, /*use_split=*/true);
  REQUIRE(c.has_value());
  CHECK(c->variant == 1);
  CHECK(c->held_out.agreement == 1.0);
  CHECK(c->held_out.escalated == 0.25);
  CHECK(c->held_out.work == Approx(0.1 + 0.25));
  CHECK(relokv_rag::policy_of(c->signal, c->fit.threshold).enabled);
  // Nothing below full recompute's work reaches an impossible target.
  auto hopeless = res;
  for (auto& a : hopeless[1].agreement) a = 0.0;
  for (auto& d : hopeless[1].diverged_at) d = 0;
  for (auto& m : hopeless[1].margin0) m = 0.5;
  for (auto& a : hopeless[2].agreement) a = 0.0;
  for (auto& d : hopeless[2].diverged_at) d = 0;
  hopeless[1].work.assign(8, 0.1);
  const auto none = relokv_rag::choose_escalation(hopeless, 0.95, true);
  CHECK_FALSE(none.has_value());
  // The foresight bound: the cheap variant's one divergent held-out request of four.
  const auto oracle = relokv_rag::escalation_signals().back();
  REQUIRE(oracle.name == "oracle");
  CHECK_FALSE(oracle.engine_policy);
  const auto b = relokv_rag::fit_threshold(cheap, oracle, 0.95, relokv_rag::split_half(8, true));
  REQUIRE(b.has_value());
  CHECK(b->escalated == 0.25);
  CHECK(b->agreement == 1.0);
}
