#pragma once
// Workloads shared by the Google Benchmark programs and relokv_report.
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>

#include <cstdint>
#include <random>
#include <vector>

namespace relokv_bench {

inline std::vector<relokv::token_t> random_tokens(int n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<relokv::token_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<relokv::token_t>(rng() % 49152);
  return t;
}

/// One 1024-token span of 16-token blocks after a 32-token prefix: key derivation per block.
inline relokv::request_layout keys_layout() {
  return relokv::layout_builder(16)
      .prefix(random_tokens(32, 1))
      .span(random_tokens(1024, 2))
      .build();
}

/// A RAG request: 64-token system prompt, 8 passages of 128..240 tokens in a shuffled order,
/// a 32-token question (ending in an open block).
struct rag_workload {
  std::vector<relokv::token_t> system = random_tokens(64, 10);
  std::vector<std::vector<relokv::token_t>> passages;
  std::vector<relokv::token_t> question = random_tokens(32, 11);
  rag_workload() {
    for (int i = 0; i < 8; ++i) passages.push_back(random_tokens(128 + 16 * i, 100 + i));
  }
  relokv::request_layout layout(std::uint32_t order_seed) const {
    std::vector<int> order = {0, 1, 2, 3, 4, 5, 6, 7};
    std::mt19937 rng(order_seed);
    std::shuffle(order.begin(), order.end(), rng);
    relokv::layout_builder b(16);
    b.prefix(system);
    for (int i : order) b.span(passages[static_cast<std::size_t>(i)]);
    return b.question(question).build();
  }
};

}  // namespace relokv_bench
