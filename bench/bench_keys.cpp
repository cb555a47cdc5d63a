// Google Benchmark: key derivation, the SHA-256 baseline, XXH3 alone, and planning.
//   ./build/bench/relokv_bench_keys --benchmark_repetitions=10 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <relokv/hash/block_keys.hpp>

#include "support/sha256_chain.hpp"
#include "support/workloads.hpp"

namespace {

void BM_xxh3_128_64_bytes(benchmark::State& s) {
  const auto t = relokv_bench::random_tokens(16, 3);
  const relokv::xxh3_128 h(42);
  for (auto _ : s)
    benchmark::DoNotOptimize(
        h.digest(std::as_bytes(std::span<const relokv::token_t>(t)), relokv::hash_domain::kTokens));
}
BENCHMARK(BM_xxh3_128_64_bytes);

void BM_derive_block_keys(benchmark::State& s) {
  const auto l = relokv_bench::keys_layout();
  const relokv::xxh3_128 h(42);
  relokv::block_keys<relokv::xxh3_128> keys;
  for (auto _ : s) {
    relokv::derive_block_keys(h, l, {}, keys);
    benchmark::DoNotOptimize(keys.content.back());
  }
  s.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(s.iterations()) * l.num_blocks(),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_derive_block_keys);

void BM_sha256_chain(benchmark::State& s) {
  const auto l = relokv_bench::keys_layout();
  relokv_bench::sha256_chain sha;
  for (auto _ : s) benchmark::DoNotOptimize(sha.run(l));
  s.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(s.iterations()) * l.num_blocks(),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_sha256_chain);

void BM_plan_all_hits(benchmark::State& s) {
  relokv_bench::rag_workload w;
  relokv::relocatable_cache<> cache(relokv::lru_block_pool(4096), 16, relokv::xxh3_128(42));
  auto p = cache.plan(w.layout(1));
  cache.commit(p.id);
  cache.release(p.id);
  const auto l = w.layout(2);
  relokv::reuse_plan plan;
  for (auto _ : s) {
    cache.plan_into(l, cache.strategy(), {}, plan);
    cache.release(plan.id);
  }
  s.counters["ns_per_block"] =
      benchmark::Counter(static_cast<double>(s.iterations()) * l.num_blocks(),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_plan_all_hits);

}  // namespace

BENCHMARK_MAIN();
