#pragma once
// Headline figures of the host core (keys, planning), shared by relokv_report.
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/hash/block_keys.hpp>

#include <string>
#include <utility>
#include <vector>

#include "support/measure.hpp"
#include "support/sha256_chain.hpp"
#include "support/workloads.hpp"

namespace relokv_bench {

using figure_lines = std::vector<std::pair<std::string, double>>;

inline figure_lines core_figures(int reps) {
  figure_lines out;
  const auto l = keys_layout();
  const double nb = l.num_blocks();
  const relokv::xxh3_128 h(42);
  relokv::block_keys<relokv::xxh3_128> keys;
  auto derive = [&] {
    relokv::derive_block_keys(h, l, relokv::extra_keys{1, 2, 3}, keys);
    keep(keys.content.back());
  };
  out.emplace_back("key_ns_per_block", median_ns(derive, reps, 2000) / nb);

  sha256_chain sha;
  auto sha_run = [&] { keep(sha.run(l)); };
  out.emplace_back("sha256_over_relokv", median_ratio(sha_run, derive, reps, 200));

  // Planning a RAG request whose blocks are all cached (prefix exact, passages relocated).
  rag_workload w;
  relokv::relocatable_cache<> cache(relokv::lru_block_pool(4096), 16, relokv::xxh3_128(42));
  const auto seed_layout = w.layout(1);
  auto p = cache.plan(seed_layout);
  cache.commit(p.id);
  cache.release(p.id);
  const auto hit_layout = w.layout(2);
  relokv::reuse_plan plan;
  auto plan_hit = [&] {
    cache.plan_into(hit_layout, cache.strategy(), {}, plan);
    cache.release(plan.id);
  };
  out.emplace_back("plan_hit_ns_per_block",
                   median_ns(plan_hit, reps, 200) / hit_layout.num_blocks());
  return out;
}

}  // namespace relokv_bench
