// The engine's batch-invariant fp32 product (examples/engine/sgemm.hpp) against OpenBLAS's
// SGEMM, which it replaced because OpenBLAS's AVX2 kernels sum a row differently depending on
// how many rows come with it (issue 45). Same shapes, side by side in one run: the cost of
// invariance. Shapes: SmolLM2's and Qwen2.5-0.5B's prefill products (n prompt rows x k inputs
// x m outputs), and a decode-sized n.
//   build/bench/relokv_bench_sgemm --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <cblas.h>

#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "sgemm.hpp"

namespace {

struct operands {
  std::vector<float> x, w, y;
  operands(int n, int k, int m)
      : x(static_cast<std::size_t>(n) * k),
        w(static_cast<std::size_t>(m) * k),
        y(static_cast<std::size_t>(n) * m) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = nd(rng);
  }
};

void counters(benchmark::State& st, int n, int k, int m) {
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * n * k * m * static_cast<double>(st.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void BM_sgemm_owned(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0)), k = static_cast<int>(st.range(1)),
            m = static_cast<int>(st.range(2));
  operands o(n, k, m);
  for (auto _ : st) {
    relokv_engine::sgemm_nt(o.x.data(), k, n, o.w.data(), k, m, k, o.y.data(), m);
    benchmark::DoNotOptimize(o.y.data());
  }
  counters(st, n, k, m);
}

void BM_sgemm_openblas(benchmark::State& st) {
  const int n = static_cast<int>(st.range(0)), k = static_cast<int>(st.range(1)),
            m = static_cast<int>(st.range(2));
  operands o(n, k, m);
  openblas_set_num_threads(1);  // the engine's lanes each run one thread
  for (auto _ : st) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, o.x.data(), k, o.w.data(),
                k, 0.0f, o.y.data(), m);
    benchmark::DoNotOptimize(o.y.data());
  }
  counters(st, n, k, m);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({256, 576, 1536})     // SmolLM2: a 256-token prompt's gate/up
      ->Args({256, 1536, 576})  // and its down projection
      ->Args({256, 896, 4864})  // Qwen2.5-0.5B's gate/up
      ->Args({8, 576, 1536})    // a short remainder after exact hits
      ->Args({1, 576, 49152})   // a prefill's logits row (SmolLM2's vocabulary)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_sgemm_owned)->Apply(shapes);
BENCHMARK(BM_sgemm_openblas)->Apply(shapes);
BENCHMARK_MAIN();
