#pragma once
// Greedy generation under a per-request escalation policy (relokv/recompute/escalation.hpp), for
// any sequence_engine (its one-request loop: prefill, decode, end): the request is served
// with its reuse strategy, and recomputed in full, once, where the policy reads doubt in the
// next-token distribution. relokv_chat serves a calibrated profile's policy with it; relokv_rag's
// loop (examples/rag/run_engine.cpp) does the same while it measures.
#include <cstdint>
#include <vector>

#include <relokv/layout/request_layout.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/escalation.hpp>
#include <relokv/recompute/full.hpp>

#include "sequence.hpp"

namespace relokv_engine {

struct escalated_answer {
  std::vector<relokv::token_t> tokens;
  /// The answer step where the request was recomputed in full (0: before its first token), or
  /// -1. The tokens before it were produced by the reuse strategy, and may already be sent.
  std::int32_t escalated_at = -1;
  /// Prefill work, in tokens computed summed over the layers: the first attempt, the full
  /// prefill and the answer tokens fed back after it.
  std::int64_t token_layers = 0;
};

/// Greedy answer of up to `max_tokens` (stopping after `stop` when >= 0) to `layout`, planned
/// with `strategy` and escalated to full recompute of `full_layout` under `policy` (a draft
/// policy generates the whole answer first, then keeps it or replaces it). The request
/// is still live when it returns (end() it, as after prefill). @throws what prefill throws, and
/// relokv::error for non-finite logits
inline escalated_answer generate_escalating(
    sequence_engine& eng, const relokv::request_layout& layout,
    const relokv::request_layout& full_layout, const relokv::recompute::any_strategy& strategy,
    const relokv::recompute::escalation_policy& policy, std::int32_t max_tokens,
    relokv::token_t stop = -1, const relokv::extra_keys& keys = {}, std::uint64_t principal = 0) {
  policy.validate();
  escalated_answer a;
  const auto layers = static_cast<std::int64_t>(eng.n_layers());
  prefill_stats st;
  auto logits = eng.prefill(layout, strategy, &st, keys, principal);
  a.token_layers = st.token_layers;
  const bool draft = policy.enabled && policy.stage == relokv::recompute::escalation_stage::draft;
  relokv::recompute::logit_summary worst;  // margin 1, entropy 0: nothing yet
  for (std::int32_t i = 0; i < max_tokens; ++i) {
    if (draft) {
      worst = policy.worst(worst, relokv::recompute::summarize_logits(logits));
    } else if (policy.enabled && a.escalated_at < 0 &&
               policy.escalate(relokv::recompute::summarize_logits(logits), i)) {
      eng.end(false);
      prefill_stats fs;
      logits = eng.prefill(full_layout, relokv::recompute::full{}, &fs, keys, principal);
      a.token_layers += fs.token_layers;
      for (const relokv::token_t t : a.tokens) {
        logits = eng.decode(t);
        a.token_layers += layers;
      }
      a.escalated_at = i;
    }
    const relokv::token_t t = argmax(logits);
    a.tokens.push_back(t);
    if (t == stop || i + 1 == max_tokens) break;
    logits = eng.decode(t);
  }
  if (draft && policy.escalate(worst, 0)) {
    // The draft, held back, is replaced by full recompute's answer.
    eng.end(false);
    prefill_stats fs;
    logits = eng.prefill(full_layout, relokv::recompute::full{}, &fs, keys, principal);
    a.token_layers += fs.token_layers;
    a.escalated_at = 0;
    a.tokens.clear();
    for (std::int32_t i = 0; i < max_tokens; ++i) {
      const relokv::token_t t = argmax(logits);
      a.tokens.push_back(t);
      if (t == stop || i + 1 == max_tokens) break;
      logits = eng.decode(t);
    }
  }
  return a;
}

}  // namespace relokv_engine
