#pragma once
// What the provenance policy costs in reuse on the demo's workload (the same questions, the same
// passages, the same layouts; the cache alone, with no model to run):
//  - provenance_reuse_kept_demo: passage tokens served from the cache under the default policy
//    over those served under the permissive one, when passages are warmed as the demo warms
//    them (each compiled right after the system prompt) and every question comes from a
//    principal of its own;
//  - provenance_reuse_kept_unwarmed: the same without warming: passages are cached only as
//    the questions compute them, after whatever passages precede them in that prompt.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>

#include "rag.hpp"

namespace relokv_bench {

/// Passage tokens served from the cache (exact or relocated) over the workload.
inline double passage_tokens_reused(const relokv_rag::workload& w, bool warm,
                                    relokv::provenance_policy policy) {
  relokv::relocatable_cache<> cache(relokv::lru_block_pool(1 << 16), 16);
  cache.set_provenance_policy(policy);
  const auto serve = [&](const relokv::request_layout& l, std::uint64_t principal) {
    auto p = cache.plan(l, {}, principal);
    double reused = 0;
    if (!p.ok()) return reused;
    for (std::size_t b = 0; b < p.blocks.size(); ++b) {
      const auto& seg = l.segments[static_cast<std::size_t>(l.blocks[b].segment)];
      if (seg.kind == relokv::segment_kind::kSpan &&
          p.blocks[b].status != relokv::block_status::kMiss)
        reused += p.blocks[b].len;
    }
    cache.commit(p.id);
    cache.release(p.id);
    return reused;
  };
  double reused = 0;
  std::uint64_t principal = 1;
  for (const auto& r : w.requests) {
    if (warm)
      for (std::size_t p : r.passages)
        (void)serve(relokv::layout_builder(16).prefix(w.prefix).span(w.corpus[p].tokens).build(),
                    0);
    relokv::layout_builder b(16);
    b.prefix(w.prefix);
    for (std::size_t p : r.passages) b.span(w.corpus[p].tokens);
    reused += serve(b.question(r.question_tokens).build(), principal++);
  }
  return reused;
}

inline std::vector<std::pair<std::string, double>> provenance_figures(
    const relokv_rag::workload& w) {
  using relokv::provenance_policy;
  const auto kept = [&](bool warm) {
    const double strict =
        passage_tokens_reused(w, warm, provenance_policy::kCanonicalOrSamePrincipal);
    const double loose = passage_tokens_reused(w, warm, provenance_policy::kPermissive);
    return loose > 0 ? strict / loose : 1.0;
  };
  return {{"provenance_reuse_kept_demo", kept(true)},
          {"provenance_reuse_kept_unwarmed", kept(false)}};
}

}  // namespace relokv_bench
