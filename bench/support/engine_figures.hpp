#pragma once
// Reference-engine figures on a synthetic Llama (runs offline): prefill and decode throughput
// at a 2k-token context, and relokv's overhead against a plain contiguous KV buffer.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <relokv/layout/builder.hpp>

#include "llama.hpp"
#include "load_model.hpp"
#include "support/measure.hpp"

namespace relokv_bench {

inline std::vector<std::pair<std::string, double>> engine_figures(int reps) {
  std::vector<std::pair<std::string, double>> out;
  const auto model = std::make_shared<const relokv_engine::llama_model>(
      relokv_engine::llama_model::synthetic(relokv_engine::demo_config()));
  constexpr int kContext = 2048;
  std::vector<relokv::token_t> prompt(kContext);
  for (int i = 0; i < kContext; ++i) prompt[static_cast<std::size_t>(i)] = (i * 7919) % 4096;
  const auto layout = relokv::layout_builder(16).prefix(prompt).build();
  relokv_engine::llama_engine<relokv::pre_rotated> pre(model, kContext / 16 + 64);
  relokv_engine::llama_engine<relokv::block_relative> rel(model, kContext / 16 + 64);
  auto via_relokv = [&] {
    keep(pre.prefill(layout, relokv::recompute::none{}));
    pre.end(false);  // nothing is kept: every prefill computes everything
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
  return out;
}

}  // namespace relokv_bench
