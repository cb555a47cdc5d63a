// The span finder's cost per prompt token (relokv::find_spans with a warm span_index), on the
// format suite's prompts tokenized by a real model's tokenizer: what --spans auto adds to a
// request before its prefill. Prints `span_finder_ns_per_token N` (the median of 15 rounds).
//   relokv_span_finder_bench --model SmolLM2-135M-Instruct.Q4_1.gguf [--rounds 15]
// bench/plain_prompt_reuse sets it beside the prefill the spans save.
#include <relokv/layout/span_finder.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gguf.hpp"
#include "support/prompt_formats.hpp"
#include "tokenizer.hpp"

int main(int argc, char** argv) {
  std::string model;
  int rounds = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model")
      model = argv[i + 1];
    else if (a == "--rounds")
      rounds = std::max(1, std::atoi(argv[i + 1]));
  }
  if (model.empty()) {
    std::fprintf(stderr, "usage: relokv_span_finder_bench --model GGUF [--rounds N]\n");
    return 2;
  }
  try {
    const auto gguf = relokv_engine::gguf_file::open(model);
    const relokv_engine::tokenizer tok(gguf);
    // Ten passages a prompt (the suite's eight, two of them twice), every format, two orders.
    auto passages = relokv_test::test_passages();
    passages.push_back(passages[0]);
    passages.push_back(passages[3]);
    std::vector<relokv_test::token_prompt> prompts;
    std::size_t tokens = 0;
    for (const auto& [name, f] : relokv_test::named_formats()) {
      for (int order = 0; order < 2; ++order) {
        auto ps = passages;
        if (order) std::reverse(ps.begin(), ps.end());
        relokv_test::token_prompt p;
        p.ids = tok.encode(relokv_test::render(f, ps, "Where was the engineer born?", order + 1));
        for (const auto id : p.ids) p.pieces.push_back(tok.decode({id}));
        tokens += p.ids.size();
        prompts.push_back(std::move(p));
      }
    }
    relokv::span_index known;
    std::vector<double> ns;
    std::size_t spans = 0;
    for (int r = 0; r < rounds + 1; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& p : prompts) {
        const std::vector<std::int32_t> forced{1};
        spans += relokv::find_spans(p.ids, p.pieces, {}, forced, &known).size();
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (r > 0)  // the first round fills the index
        ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                     static_cast<double>(tokens));
    }
    std::sort(ns.begin(), ns.end());
    std::printf("# %zu prompts, %zu tokens a round, %d rounds, %zu segments\n", prompts.size(),
                tokens, rounds, spans);
    std::printf("span_finder_ns_per_token %.1f\n", ns[ns.size() / 2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relokv_span_finder_bench: %s\n", e.what());
    return 1;
  }
}
