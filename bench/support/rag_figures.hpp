#pragma once
// Main-job figures: TTFT speedup and answer agreement of EPIC-style first_k against full
// recompute, on the synthetic model unless a model is present (rag_on_real_model says which).
// With a model, the questions come from the 2WikiMultihopQA sample when it is found
// ($RELOKV_RAG_DATA, or the sample next to the source tree at configure time; rag_on_real_data
// says which), else from the generator (random passages, which a real model cannot answer).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "escalation_study.hpp"
#include "load_model.hpp"
#include "model_path.hpp"
#include "rag.hpp"
#include "store_mode.hpp"
#include "support/engine_figures.hpp"
#include "support/provenance_figures.hpp"
#if defined(RELOKV_WITH_REDIS) && RELOKV_WITH_REDIS
#include "support/redis_server.hpp"
#endif

namespace relokv_bench {

/// The QA sample: $RELOKV_RAG_DATA, or the one next to the source tree at configure time.
inline std::string qa_sample() {
  if (const char* env = std::getenv("RELOKV_RAG_DATA"); env != nullptr && *env != '\0') return env;
#ifdef RELOKV_RAG_SAMPLE
  return RELOKV_RAG_SAMPLE;
#else
  return {};
#endif
}

/// The escalation study (relokv_rag --escalation) on SmolLM2 over `requests` questions of the
/// sample: naive PIC, EPIC k=16 and the question's attention 15% with every signal, the policy
/// fitted for agreement 0.95 on the even-numbered questions and run in the engine loop on the
/// odd-numbered ones. Minutes; relokv_report --filter rag_escalation runs it alone.
inline std::vector<std::pair<std::string, double>> escalation_report(std::size_t requests) {
  const std::string path = relokv_engine::default_model_path();
  const std::string data = qa_sample();
  if (path.empty() || data.empty() || !std::ifstream(data).good()) {
    std::fprintf(stderr,
                 "relokv_report: rag_escalation_* skipped: needs SmolLM2 (scripts/get-model) and "
                 "the QA sample\n");
    return {};
  }
  const auto loaded = relokv_engine::load_model(path);
  const relokv_rag::text_codec codec{loaded.tokenizer.get(), loaded.model->cfg.vocab};
  const auto w = relokv_rag::load_jsonl(data, requests, 1, codec);
  std::vector<relokv_rag::variant> vars;
  for (const auto& v : relokv_rag::default_variants())
    if (v.key == "full" || v.key == "naive" || v.key == "epic" || v.key == "question")
      vars.push_back(v);
  relokv_rag::run_options opt;
  opt.max_answer = 12;
  const auto st = relokv_rag::run_escalation_study(loaded.model, w, codec, vars, opt, 0.95);
  auto out = relokv_rag::escalation_figures(st);
  out.emplace_back("rag_escalation_questions", double(w.requests.size()));
  return out;
}

/// The QA job on Gemma 3 270M (sliding windows, two RoPE bases): every default variant over
/// `requests` questions of the sample against full recompute, KV bf16, placement
/// block_relative. Lines: naive and EPIC k=16 (first-token KL, greedy agreement, work), the
/// question's attention (15%; its probe reads windowed layers through their windows), and the
/// best variant at <= 20% of full's work by agreement (KL beside it). Minutes; relokv_report
/// --filter rag_gemma3 runs it alone ($RELOKV_GEMMA3_REQUESTS, default 32).
inline std::vector<std::pair<std::string, double>> gemma3_report(std::size_t requests) {
  const std::string path = relokv_engine::default_model_path("gemma3-270m");
  const std::string data = qa_sample();
  if (path.empty() || data.empty() || !std::ifstream(data).good()) {
    std::fprintf(stderr,
                 "relokv_report: rag_gemma3_* skipped: needs Gemma 3 270M (scripts/get-model "
                 "gemma3-270m) and the QA sample\n");
    return {};
  }
  const auto loaded = relokv_engine::load_model(path);
  const relokv_rag::text_codec codec{loaded.tokenizer.get(), loaded.model->cfg.vocab};
  const auto w = relokv_rag::load_jsonl(data, requests, 1, codec);
  const auto variants = relokv_rag::default_variants();
  relokv_rag::run_options opt;
  opt.max_answer = 8;
  const auto res = relokv_rag::run(loaded.model, w, codec, variants, opt);
  using relokv_rag::mean;
  std::vector<std::pair<std::string, double>> out;
  out.emplace_back("rag_gemma3_questions", double(w.requests.size()));
  double best_agree = -1, best_kl = 0;
  std::string best = "none_within_20pct";
  for (std::size_t v = 0; v < variants.size(); ++v) {
    const auto& key = variants[v].key;
    const auto& r = res[v];
    if (key == "naive" || key == "epic" || key == "question") {
      out.emplace_back("rag_gemma3_" + key + "_kl", mean(r.kl));
      out.emplace_back("rag_gemma3_" + key + "_agreement", mean(r.agreement));
      out.emplace_back("rag_gemma3_" + key + "_work", mean(r.work));
    }
    if (key == "full" || key == "prefix" || !variants[v].spans || mean(r.work) > 0.20) continue;
    if (mean(r.agreement) > best_agree) {
      best_agree = mean(r.agreement);
      best_kl = mean(r.kl);
      best = key;
    }
  }
  out.emplace_back("rag_gemma3_best_agreement_at_20pct", std::max(best_agree, 0.0));
  out.emplace_back("rag_gemma3_best_kl_at_20pct", best_kl);
  out.emplace_back("rag_gemma3_best_at_20pct_is_" + best, 1.0);
  return out;
}

/// What run_with_adapter ran: one result per variant, in order.
struct adapter_run {
  std::vector<relokv_rag::variant_result> results;
  std::size_t questions = 0;
  std::int32_t rows = 0;  ///< the adapter's learned rows
};

/// `variants` in relokv's engine on the QA sample's first `requests`, `max_answer`-token answers,
/// with tools/links/adapters/`file` read into scripts/get-model's `model`; none (saying why, naming
/// the lines `prefix` skipped) when the model, the adapter or the sample is absent.
inline std::optional<adapter_run> run_with_adapter(const char* model, const char* file,
                                                   const char* prefix, std::size_t requests,
                                                   const std::vector<relokv_rag::variant>& vars,
                                                   std::int32_t max_answer = 16) {
  const std::string data = qa_sample();
  const std::string path = relokv_engine::default_model_path(model);
#ifdef RELOKV_LINKS_ADAPTERS
  const std::string adapter = std::string(RELOKV_LINKS_ADAPTERS) + "/" + file;
#else
  const std::string adapter;
  (void)file;
#endif
  if (path.empty() || data.empty() || !std::ifstream(adapter).good()) {
    std::fprintf(stderr,
                 "relokv_report: %s* skipped: needs %s (scripts/get-model), its adapter %s and "
                 "the QA sample\n",
                 prefix, model, adapter.c_str());
    return std::nullopt;
  }
  const auto loaded = relokv_engine::load_model(path);
  const auto adapted =
      relokv_engine::with_links(loaded.model, relokv_engine::load_links(adapter, *loaded.model));
  const relokv_rag::text_codec codec{loaded.tokenizer.get(), adapted->cfg.vocab};
  const auto w = relokv_rag::load_jsonl(data, requests, 1, codec);
  relokv_rag::run_options opt;
  opt.max_answer = max_answer;
  return adapter_run{relokv_rag::run(adapted, w, codec, vars, opt), w.requests.size(),
                     adapted->links->n};
}

/// Span links (tools/links) on the held-out questions (the sample's first `requests`; the
/// trainer never saw them nor their passages), for each shipped adapter whose model is here:
/// full, naive, EPIC k=2 (about the links' work) and k=16, the question's attention 12%, and
/// links, links + EPIC k=2, links + question 12% (both within 20% of the work), KV bf16,
/// 16-token answers. Lines, with PFX
/// rag_links_ for SmolLM2 and rag_links_gemma3_, rag_links_qwen05_ for the others: PFX
/// {agreement, kl, work} of links, PFX{naive,epic2,question}_{agreement,kl,work} beside it, and
/// the best links variant at <= 20% of the work (PFX best_agreement_at_20pct, best_kl_at_20pct).
/// Minutes per model; relokv_report --filter rag_links runs it alone ($RELOKV_LINKS_REQUESTS,
/// default 24; $RELOKV_LINKS_MODELS, default smollm2,gemma3-270m,qwen2.5-0.5b).
inline std::vector<std::pair<std::string, double>> links_report(std::size_t requests) {
  std::vector<std::pair<std::string, double>> out;
  std::string models = "smollm2,gemma3-270m,qwen2.5-0.5b";
  if (const char* e = std::getenv("RELOKV_LINKS_MODELS"); e != nullptr && *e != '\0') models = e;
  struct entry {
    const char *name, *file, *prefix;
  };
  const entry all[] = {{"smollm2", "smollm2-135m.gguf", "rag_links_"},
                       {"gemma3-270m", "gemma3-270m.gguf", "rag_links_gemma3_"},
                       {"qwen2.5-0.5b", "qwen2.5-0.5b.gguf", "rag_links_qwen05_"}};
  for (const entry& e : all) {
    if (("," + models + ",").find("," + std::string(e.name) + ",") == std::string::npos) continue;
    using relokv_engine::strategy_spec;
    std::vector<relokv_rag::variant> vars = {
        relokv_rag::variant_of(strategy_spec{"full"}),
        relokv_rag::variant_of(strategy_spec{"none"}),
        relokv_rag::variant_of(strategy_spec{"first_k", 2}),
        relokv_rag::variant_of(strategy_spec{"first_k", 16}),
        relokv_rag::variant_of(strategy_spec{"question", 0, 0.12f})};
    for (auto& v : relokv_rag::link_variants(2, 0.12f, false)) vars.push_back(std::move(v));
    const auto ran = run_with_adapter(e.name, e.file, e.prefix, requests, vars);
    if (!ran) continue;
    const auto& res = ran->results;
    using relokv_rag::mean;
    const std::string p = e.prefix;
    out.emplace_back(p + "questions", double(ran->questions));
    out.emplace_back(p + "rows", double(ran->rows));
    const auto put = [&](const std::string& name, const relokv_rag::variant_result& r) {
      out.emplace_back(p + name + "agreement", mean(r.agreement));
      out.emplace_back(p + name + "kl", mean(r.kl));
      out.emplace_back(p + name + "work", mean(r.work));
    };
    put("", res[5]);  // links
    put("naive_", res[1]);
    put("epic2_", res[2]);
    put("epic16_", res[3]);
    put("question_", res[4]);
    put("epic_links_", res[6]);
    put("question_links_", res[7]);
    double best = -1, best_kl = 0;
    for (std::size_t v = 5; v < vars.size(); ++v)
      if (mean(res[v].work) <= 0.20 && mean(res[v].agreement) > best) {
        best = mean(res[v].agreement);
        best_kl = mean(res[v].kl);
      }
    out.emplace_back(p + "best_agreement_at_20pct", std::max(best, 0.0));
    out.emplace_back(p + "best_kl_at_20pct", best_kl);
  }
  return out;
}

/// The best learned adapter of each model at <= 5% of the work (tools/links/distill.py; which
/// one and why: docs/links.md) on the held-out questions (the sample's first `requests`, never
/// trained or validated on), beside naive reuse at the same work: rag_learned_{agreement, kl,
/// work} for SmolLM2, rag_learned_gemma3_* for Gemma 3 270M, rag_learned_qwen05_* for
/// Qwen2.5-0.5B and rag_learned_qwen15_* for Qwen2.5-Coder-1.5B (greedy agreement and
/// first-token KL with full recompute, the share of prefill computed), *_naive_{agreement, kl}
/// and *_questions. The 1.5B, the one model that answers these questions, is measured as its
/// issue asks: at least 64 questions, 12-token answers, and its task accuracy against the gold
/// answers beside full recompute's (rag_learned_qwen15_{em, f1, full_em, full_f1,
/// f1_over_full}). A model whose weights or adapter are absent is skipped, saying so.
/// relokv_report --filter rag_learned runs it alone ($RELOKV_LEARNED_REQUESTS, default 48);
/// --filter rag_learned_qwen15 the 1.5B alone (about 30 minutes on two cores).
inline std::vector<std::pair<std::string, double>> learned_report(std::size_t requests,
                                                                  const std::string& only = {}) {
  struct shipped {
    const char* model;    // scripts/get-model's name
    const char* adapter;  // in tools/links/adapters/
    const char* prefix;   // of its lines
    std::int32_t answer;  // tokens
    std::size_t min_requests;
    bool task;  // EM and F1 against the gold answers
  };
  static constexpr shipped kShipped[] = {
      {"smollm2", "smollm2-135m-learned.gguf", "rag_learned_", 16, 0, false},
      {"gemma3-270m", "gemma3-270m-learned.gguf", "rag_learned_gemma3_", 16, 0, false},
      {"qwen2.5-0.5b", "qwen2.5-0.5b-learned.gguf", "rag_learned_qwen05_", 16, 0, false},
      {"qwen2.5-1.5b", "qwen2.5-1.5b-learned.gguf", "rag_learned_qwen15_", 12, 64, true},
  };
  using relokv_engine::strategy_spec;
  std::vector<relokv_rag::variant> vars = {relokv_rag::variant_of(strategy_spec{"full"}),
                                           relokv_rag::variant_of(strategy_spec{"none"})};
  vars.push_back(relokv_rag::link_variants(2, 0.12f, false).front());  // links: naive + rows
  std::vector<std::pair<std::string, double>> out;
  // Which models `only` (relokv_report's filter) names: those whose lines all start with it,
  // or else the one whose prefix is the longest that it starts with.
  std::string chosen;
  bool any = false;
  for (const shipped& s : kShipped) any = any || std::string(s.prefix).rfind(only, 0) == 0;
  if (!any)
    for (const shipped& s : kShipped)
      if (only.rfind(s.prefix, 0) == 0 && std::string(s.prefix).size() > chosen.size())
        chosen = s.prefix;
  for (const shipped& s : kShipped) {
    const std::string p = s.prefix;
    if (any ? p.rfind(only, 0) != 0 : p != chosen) continue;
    const auto ran = run_with_adapter(s.model, s.adapter, s.prefix,
                                      std::max(requests, s.min_requests), vars, s.answer);
    if (!ran) continue;
    const auto& res = ran->results;
    using relokv_rag::mean;
    out.emplace_back(p + "questions", double(ran->questions));
    out.emplace_back(p + "agreement", mean(res[2].agreement));
    out.emplace_back(p + "kl", mean(res[2].kl));
    out.emplace_back(p + "work", mean(res[2].work));
    out.emplace_back(p + "naive_agreement", mean(res[1].agreement));
    out.emplace_back(p + "naive_kl", mean(res[1].kl));
    if (!s.task) continue;
    out.emplace_back(p + "em", mean(res[2].em));
    out.emplace_back(p + "f1", mean(res[2].f1));
    out.emplace_back(p + "full_em", mean(res[0].em));
    out.emplace_back(p + "full_f1", mean(res[0].f1));
    out.emplace_back(p + "naive_f1", mean(res[1].f1));
    out.emplace_back(p + "f1_over_full",
                     mean(res[0].f1) > 0 ? mean(res[2].f1) / mean(res[0].f1) : 0.0);
  }
  return out;
}

inline std::vector<std::pair<std::string, double>> rag_figures() {
  const std::string path = relokv_engine::default_model_path();
  const auto loaded = relokv_engine::load_model(path);
  const auto& model = loaded.model;
  const relokv_rag::text_codec codec{loaded.tokenizer.get(), model->cfg.vocab};
  const std::string data = qa_sample();
  const bool real_data = !path.empty() && !data.empty() && std::ifstream(data).good();
  const auto w = real_data ? relokv_rag::load_jsonl(data, 8, 1, codec)
                           : relokv_rag::generate(6, 30, 10, 1.0, 7, model->cfg.vocab);
  using relokv_engine::strategy_spec;
  const std::vector<relokv_rag::variant> variants = {
      relokv_rag::variant_of(strategy_spec{"full"}),
      relokv_rag::variant_of(strategy_spec{"first_k", 16}),
      relokv_rag::variant_of(strategy_spec{"none"}),
      relokv_rag::variant_of(strategy_spec{"deviation_topk", 0, 0.15f}),
      relokv_rag::variant_of(strategy_spec{"union", 16, 0.15f}),
      relokv_rag::default_variants()[1],  // prefix caching: exact hits only
      relokv_rag::variant_of(strategy_spec{"question", 0, 0.15f}),
      relokv_rag::variant_of(strategy_spec{"question", 2, 0.12f})};
  relokv_rag::run_options opt;
  opt.max_answer = 8;
  opt.noise_floor = true;  // one more row, last: full prefill with fp32 KV
  const auto res = relokv_rag::run(model, w, codec, variants, opt);
  using relokv_rag::mean;
  // Prompt tokens first_k computes per token full prefill computes: the speedup's ceiling
  // where the cost is linear in the tokens computed (these questions' prompts are short).
  double computed[2] = {0, 0};
  for (int v = 0; v < 2; ++v)
    for (auto c : res[static_cast<std::size_t>(v)].computed) computed[v] += double(c);
  // The same questions with the passages compiled behind the chat header alone (a
  // sink-absorbing compile, --compile-behind absorber:3): full, naive, question, qepic.
  const std::vector<relokv_rag::variant> absorbed = {variants[0], variants[2], variants[6],
                                                     variants[7]};
  relokv_rag::run_options aopt;
  aopt.max_answer = opt.max_answer;
  aopt.compile = "absorber:3";
  const auto ares = relokv_rag::run(model, w, codec, absorbed, aopt);
  // The best reuse variant at no more than 20% of full's prefill work (honest work: every
  // token computed at every layer, question_topk's probe included), over both compiles, and
  // which one it is (by first-token KL).
  double best_agree = 0, best_kl = 1e30;
  std::string best_name = "none_within_20pct";
  const auto consider = [&](const relokv_rag::variant_result& r, const strategy_spec& s,
                            const char* suffix) {
    if (mean(r.work) > 0.20) return;
    best_agree = std::max(best_agree, mean(r.agreement));
    if (mean(r.kl) < best_kl) {
      best_kl = mean(r.kl);
      best_name = s.kind + "_k" + std::to_string(s.k) + "_r" +
                  std::to_string(static_cast<int>(std::lround(100.0 * s.ratio))) + suffix;
    }
  };
  for (std::size_t v = 1; v < variants.size(); ++v)
    if (v != 5) consider(res[v], variants[v].spec, "");  // 5: prefix caching, no relocation
  for (std::size_t v = 1; v < absorbed.size(); ++v)
    consider(ares[v], absorbed[v].spec, "_behind_absorber3");
  std::vector<std::pair<std::string, double>> out = {
      {"rag_ttft_speedup_first_k",
       relokv_rag::percentile(res[0].ttft_ms, 50) / relokv_rag::percentile(res[1].ttft_ms, 50)},
      {"rag_computed_fraction_first_k", computed[1] / computed[0]},
      {"rag_agreement_first_k", mean(res[1].agreement)},
      {"rag_cacheblend_kl_over_naive", mean(res[3].kl) / std::max(mean(res[2].kl), 1e-12)},
      {"rag_exact_reuse_agreement", mean(res[5].agreement)},
      {"rag_exact_reuse_kl", mean(res[5].kl)},
      {"rag_noise_floor_kl", mean(res.back().kl)},
      {"rag_noise_floor_agreement", mean(res.back().agreement)},
      {"rag_best_agreement_at_20pct", best_agree},
      {"rag_best_kl_at_20pct", best_kl},
      {"rag_best_at_20pct_is_" + best_name, 1.0},
      {"rag_question_kl", mean(res[6].kl)},
      {"rag_question_agreement", mean(res[6].agreement)},
      {"rag_question_work", mean(res[6].work)},
      {"rag_question_epic_kl", mean(res[7].kl)},
      {"rag_question_epic_agreement", mean(res[7].agreement)},
      {"rag_question_epic_work", mean(res[7].work)},
      {"rag_absorber_naive_kl", mean(ares[1].kl)},
      {"rag_absorber_naive_agreement", mean(ares[1].agreement)},
      {"rag_absorber_question_kl", mean(ares[2].kl)},
      {"rag_absorber_question_agreement", mean(ares[2].agreement)},
      {"rag_absorber_question_work", mean(ares[2].work)},
      {"rag_on_real_model", path.empty() ? 0.0 : 1.0},
      {"rag_on_real_data", real_data ? 1.0 : 0.0}};
  // Which model the rag_* figures are for (RELOKV_MODEL chooses): its file name, as a name.
  std::string model_name = path.empty() ? "synthetic" : path.substr(path.find_last_of('/') + 1);
  if (const auto dot = model_name.rfind(".gguf"); dot != std::string::npos) model_name.erase(dot);
  for (char& c : model_name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  out.emplace_back("rag_model_is_" + model_name, 1.0);
  // The provenance policy's cost in reuse, over more of the same questions (no model runs).
  const auto wide = real_data ? relokv_rag::load_jsonl(data, 64, 1, codec)
                              : relokv_rag::generate(64, 30, 10, 1.0, 7, model->cfg.vocab);
  for (auto& f : provenance_figures(wide)) out.push_back(std::move(f));
#if defined(RELOKV_WITH_REDIS) && RELOKV_WITH_REDIS
  // Two instances, one Redis: the writer caches the passages, the reader (empty pool, nothing
  // kept between questions: every span is fetched) answers with EPIC; its TTFT over full's.
  if (!relokv_test::find_redis_server().empty()) {
    relokv_test::redis_server server;
    relokv_rag::store_mode_options so;
    so.url = server.url();
    so.max_answer = 8;
    (void)relokv_rag::run_writer(model, w, so);
    const std::vector<relokv_rag::variant> rv = {variants[0], variants[1]};
    const auto rr = relokv_rag::run_reader(model, w, codec, rv, so);
    out.emplace_back("rag_ttft_store_hit_speedup",
                     relokv_rag::percentile(rr.rows[0].ttft_ms, 50) /
                         relokv_rag::percentile(rr.rows[1].ttft_ms, 50));
    out.emplace_back("rag_store_blocks_fetched_per_question",
                     double(rr.rows[1].store) / double(w.requests.size()));
  }
#endif
  return out;
}

}  // namespace relokv_bench
