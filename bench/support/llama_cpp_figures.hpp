#pragma once
// relokv inside llama.cpp (examples/llama_cpp), on SmolLM2 (skipped, with the reason on
// stderr, without the model; the report prints llama_cpp_built 0 where the build has no
// llama.cpp):
//   llama_cpp_prefill_tok_s     llama.cpp's own prefill of 1,024 tokens (the reference)
//   llama_cpp_relokv_overhead   TTFT through the adapter with every token computed (full) over
//                               llama.cpp serving the same tokens alone, side by side
//   llama_cpp_epic_ttft_speedup full prefill's median TTFT over EPIC's (k = 16, through relokv),
//                               on the demo's questions (the shipped 2WikiMultihopQA sample)
//   llama_cpp_naive_ttft_speedup, llama_cpp_epic_agreement, llama_cpp_epic_kl: beside it
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <relokv/layout/builder.hpp>
#include <relokv/recompute/full.hpp>

#include "llama_cpp_engine.hpp"
#include "load_model.hpp"
#include "model_path.hpp"
#include "rag.hpp"
#include "support/measure.hpp"

namespace relokv_bench {

inline std::vector<std::pair<std::string, double>> llama_cpp_figures(int reps) {
  std::vector<std::pair<std::string, double>> out = {{"llama_cpp_built", 1.0}};
  const std::string path = relokv_engine::default_model_path();
  if (path.empty()) {
    std::fprintf(stderr, "relokv_report: llama_cpp_* skipped: no SmolLM2 (scripts/get-model)\n");
    return out;
  }
  const int r = reps < 3 ? 3 : reps;
  {
    relokv_llama_cpp::engine_options eo;
    eo.n_ctx = 2048;
    eo.num_blocks = 256;
    relokv_llama_cpp::engine<relokv::fp16> e(path, std::move(eo));
    std::vector<relokv::token_t> tokens(1024);
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<relokv::token_t>(100 + (i * 7919) % 20000);
    const double ns = median_ns([&] { keep(e.plain_prefill(tokens)); }, r, 1);
    out.emplace_back("llama_cpp_prefill_tok_s", 1024.0 / (ns * 1e-9));
    // The same 1,024 tokens as a request of a prefix and spans, every token computed.
    relokv::layout_builder b(16);
    b.prefix(std::span(tokens).first(64));
    for (std::size_t s = 64; s + 96 <= 1024 - 32; s += 96) b.span(std::span(tokens).subspan(s, 96));
    const auto layout = b.question(std::span(tokens).last(32)).build();
    const double over = median_ratio(
        [&] {
          keep(e.prefill(layout, relokv::recompute::full{}));
          e.end(false);
        },
        [&] { keep(e.plain_prefill(layout.tokens)); }, r, 1);
    out.emplace_back("llama_cpp_relokv_overhead", over);
  }
  // The demo's questions through relokv_rag's loop on the llama.cpp engine.
  const auto loaded = relokv_engine::load_model(path);
  const relokv_rag::text_codec codec{loaded.tokenizer.get(), loaded.model->cfg.vocab};
  std::string data;
#ifdef RELOKV_RAG_SAMPLE
  data = RELOKV_RAG_SAMPLE;
#endif
  if (data.empty() || !std::ifstream(data).good()) {
    std::fprintf(stderr, "relokv_report: llama_cpp_epic_* skipped: no QA sample\n");
    return out;
  }
  const auto w = relokv_rag::load_jsonl(data, 8, 1, codec);
  const auto all = relokv_rag::default_variants();
  const std::vector<relokv_rag::variant> variants = {all[0], all[4], all[2]};  // full, epic, naive
  relokv_rag::run_options opt;
  opt.engine = "llama.cpp";
  opt.model_path = path;
  opt.max_answer = 8;
  const auto res = relokv_rag::run(loaded.model, w, codec, variants, opt);
  const auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / double(v.size());
  };
  const double full = relokv_rag::percentile(res[0].ttft_ms, 50);
  out.emplace_back("llama_cpp_epic_ttft_speedup",
                   full / relokv_rag::percentile(res[1].ttft_ms, 50));
  out.emplace_back("llama_cpp_naive_ttft_speedup",
                   full / relokv_rag::percentile(res[2].ttft_ms, 50));
  out.emplace_back("llama_cpp_epic_agreement", mean(res[1].agreement));
  out.emplace_back("llama_cpp_epic_kl", mean(res[1].kl));
  return out;
}

}  // namespace relokv_bench
