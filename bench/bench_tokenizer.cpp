// Google Benchmark: BPE encode of one long word, 1,000 to 16,000 characters (O(n log n)).
//   ./build/bench/relokv_bench_tokenizer --benchmark_repetitions=5
//   --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include "support/engine_figures.hpp"

namespace {

void BM_bpe_long_word(benchmark::State& s) {
  static const auto tok = relokv_bench::bench_tokenizer();
  const std::string w = relokv_bench::bench_word(static_cast<int>(s.range(0)));
  for (auto _ : s) benchmark::DoNotOptimize(tok.encode(w));
  s.SetComplexityN(s.range(0));
}
BENCHMARK(BM_bpe_long_word)->RangeMultiplier(2)->Range(1000, 16000)->Complexity();

}  // namespace

BENCHMARK_MAIN();
