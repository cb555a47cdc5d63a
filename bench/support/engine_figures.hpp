#pragma once
// Reference-engine figures on a synthetic Llama (runs offline): prefill and decode throughput
// at a 2k-token context, and relokv's overhead against a plain contiguous KV buffer.
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <relokv/layout/builder.hpp>

#include "llama.hpp"
#include "load_model.hpp"
#include "support/measure.hpp"
#include "tokenizer.hpp"

namespace relokv_bench {

/// BPE encode of one long word (the merge is O(n log n)): milliseconds for 8,000 characters,
/// and the time ratio 8,000 / 2,000 characters (4 is linear; quadratic would be 16).
/// A BPE vocabulary over a..z grown by 2,000 merges of existing tokens (up to 8 letters).
inline relokv_engine::bpe_tokenizer bench_tokenizer() {
  std::mt19937 rng(3);
  std::vector<std::string> tokens, merges;
  for (char c = 'a'; c <= 'z'; ++c) tokens.emplace_back(1, c);
  while (merges.size() < 2000) {
    const std::string l = tokens[rng() % tokens.size()], r = tokens[rng() % tokens.size()];
    if (l.size() + r.size() > 8) continue;
    merges.push_back(l + " " + r);
    tokens.push_back(l + r);
  }
  return relokv_engine::bpe_tokenizer(tokens, merges, {});
}
/// One word of n random letters (no pre-tokenizer split inside it).
inline std::string bench_word(int n, std::uint32_t seed = 4) {
  std::mt19937 rng(seed);
  std::string w;
  for (int i = 0; i < n; ++i) w += static_cast<char>('a' + rng() % 26);
  return w;
}

inline void tokenizer_figures(int reps, std::vector<std::pair<std::string, double>>& out) {
  const auto tok = bench_tokenizer();
  const std::string w2k = bench_word(2000), w8k = bench_word(8000);
  const int r = reps < 5 ? 5 : reps;
  auto enc2 = [&] { keep(tok.encode(w2k)); };
  auto enc8 = [&] { keep(tok.encode(w8k)); };
  out.emplace_back("bpe_word_8k_ms", median_ns(enc8, r, 1) * 1e-6);
  out.emplace_back("bpe_growth_8k_over_2k", median_ratio(enc8, enc2, r, 1));
}

inline std::vector<std::pair<std::string, double>> engine_figures(int reps) {
  std::vector<std::pair<std::string, double>> out;
  const auto model = std::make_shared<const relokv_engine::llama_model>(
      relokv_engine::llama_model::synthetic(relokv_engine::demo_config()));
  constexpr int kContext = 2048;
  std::vector<relokv::token_t> prompt(kContext);
  for (int i = 0; i < kContext; ++i) prompt[static_cast<std::size_t>(i)] = (i * 7919) % 4096;
  const auto layout = relokv::layout_builder(16).prefix(prompt).build();
  // The placement the engine serves with (relokv_rag, relokv_chat): block_relative.
  relokv_engine::llama_engine<relokv::block_relative> rel(model, kContext / 16 + 64);
  auto via_relokv = [&] {
    keep(rel.prefill(layout, relokv::recompute::none{}));
    rel.end(false);  // nothing is kept: every prefill computes everything
  };
  auto plain = [&] { keep(relokv_engine::plain_prefill(*model, prompt)); };
  const int r = reps < 3 ? reps : 3;
  const double t_prefill = median_ns(
      [&] {
        keep(rel.prefill(layout, relokv::recompute::none{}));
        rel.end(false);
      },
      r, 1);
  out.emplace_back("engine_prefill_tok_s", kContext / (t_prefill * 1e-9));
  // Decode at a 2k-token context: the median over 32 greedy steps.
  auto logits = rel.prefill(layout, relokv::recompute::none{});
  relokv::token_t t = relokv_engine::argmax(logits);
  const double t_decode = median_ns([&] { t = relokv_engine::argmax(rel.decode(t)); }, 32, 1);
  rel.end(false);
  out.emplace_back("engine_decode_tok_s", 1e9 / t_decode);
  out.emplace_back("engine_relokv_overhead", median_ratio(via_relokv, plain, r, 1));
  tokenizer_figures(reps, out);
  return out;
}

}  // namespace relokv_bench
