// Decode GEMV kernels (one activation row against a matrix straight from its blocks), one
// thread, in bytes of weights per second: a matrix that sits in L2 (the kernel's compute
// ceiling) and one of 48 MB (what a decode streams), for every quantized type, with the plain
// read of the same bytes beside them (gemv_bw_fraction in relokv_report is the 2-lane ratio).
//   ./build/bench/relokv_bench_gemv --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "lanes.hpp"
#include "qgemm.hpp"

namespace {

using relokv_engine::ggml_type;

struct gemv_case {
  std::shared_ptr<std::vector<std::uint8_t>> bytes;
  relokv_engine::qmatrix w;
  std::vector<float> x, y;
  relokv_engine::q8_activations xq;
};

gemv_case make_case(ggml_type t, double megabytes, int cols) {
  gemv_case c;
  const auto tr = relokv_engine::traits_of(t);
  const auto row_bytes = static_cast<std::size_t>(cols) / tr.block_elems * tr.block_bytes;
  const auto rows = static_cast<int>(megabytes * 1024 * 1024 / static_cast<double>(row_bytes));
  c.bytes = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(rows) * row_bytes);
  std::mt19937 rng(5);
  for (auto& b : *c.bytes) b = static_cast<std::uint8_t>(rng() & 0x77);  // finite fp16 scales
  c.w = relokv_engine::qmatrix::over(t, rows, cols, c.bytes->data(), c.bytes);
  c.x.resize(static_cast<std::size_t>(cols));
  c.y.resize(static_cast<std::size_t>(rows));
  for (auto& v : c.x) v = static_cast<float>(rng() % 1000) / 500.0f - 1.0f;
  c.xq.quantize(c.x.data(), 1, cols);
  return c;
}

// state.range(0): the type; range(1): the matrix in KiB; range(2): the columns.
void BM_gemv(benchmark::State& state) {
  const auto t = static_cast<ggml_type>(state.range(0));
  auto c =
      make_case(t, static_cast<double>(state.range(1)) / 1024.0, static_cast<int>(state.range(2)));
  for (auto _ : state) {
    relokv_engine::qmatmul_rows(c.w, c.x.data(), &c.xq, 1, c.y.data(), c.w.rows, 0, c.w.rows);
    benchmark::DoNotOptimize(c.y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c.w.bytes()));
  state.SetLabel(relokv_engine::traits_of(t).name);
}

// The same product with its rows split over the engine's two lanes (the engine's decode and
// relokv_report's gemv_bw_fraction).
void BM_gemv_lanes(benchmark::State& state) {
  const auto t = static_cast<ggml_type>(state.range(0));
  auto c =
      make_case(t, static_cast<double>(state.range(1)) / 1024.0, static_cast<int>(state.range(2)));
  auto& lanes = relokv_engine::lanes::get();
  const int mid = c.w.rows / 2;
  for (auto _ : state) {
    lanes.run([&](int lane) {
      relokv_engine::qmatmul_rows(c.w, c.x.data(), &c.xq, 1, c.y.data(), c.w.rows,
                                  lane == 0 ? 0 : mid, lane == 0 ? mid : c.w.rows);
    });
    benchmark::DoNotOptimize(c.y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c.w.bytes()));
  state.SetLabel(relokv_engine::traits_of(t).name);
}

// The plain read of n bytes at p (eight 64-bit sums, which the compiler vectorizes).
std::uint64_t read_sum(const std::uint8_t* p, std::size_t n) {
  const auto* q = reinterpret_cast<const std::uint64_t*>(p);
  std::uint64_t s[8] = {};
  for (std::size_t i = 0; i + 8 <= n / 8; i += 8)
    for (std::size_t k = 0; k < 8; ++k) s[k] += q[i + k];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

void BM_read(benchmark::State& state) {
  auto c = make_case(ggml_type::kQ8_0, static_cast<double>(state.range(1)) / 1024.0, 4096);
  for (auto _ : state) benchmark::DoNotOptimize(read_sum(c.bytes->data(), c.bytes->size()));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c.bytes->size()));
}

void BM_read_lanes(benchmark::State& state) {
  auto c = make_case(ggml_type::kQ8_0, static_cast<double>(state.range(1)) / 1024.0, 4096);
  auto& lanes = relokv_engine::lanes::get();
  const std::size_t half = c.bytes->size() / 2 / 64 * 64;
  std::uint64_t sink[2] = {};
  for (auto _ : state) {
    lanes.run(
        [&](int lane) { sink[lane] = read_sum(c.bytes->data() + (lane == 0 ? 0 : half), half); });
    benchmark::DoNotOptimize(sink);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(2 * half));
}

void gemv_args(benchmark::internal::Benchmark* b) {
  for (const ggml_type t : {ggml_type::kQ4_1, ggml_type::kQ8_0, ggml_type::kQ4_0, ggml_type::kQ5_0,
                            ggml_type::kQ4_K, ggml_type::kQ6_K})
    for (const std::int64_t kib : {32, 1024, 48 * 1024})  // in L1; in L2; streamed
      b->Args({static_cast<std::int64_t>(t), kib, 4096});
  // SmolLM2's shapes: 576 columns (Q/K/V/O, gate, up), 1,536 (down)
  for (const ggml_type t : {ggml_type::kQ4_1, ggml_type::kQ8_0})
    for (const std::int64_t kib : {1024, 48 * 1024})
      for (const std::int64_t cols : {576, 1536})
        b->Args({static_cast<std::int64_t>(t), kib, cols});
}

}  // namespace

BENCHMARK(BM_gemv)->Apply(gemv_args);
BENCHMARK(BM_gemv_lanes)
    ->Args({static_cast<std::int64_t>(ggml_type::kQ4_1), 48 * 1024, 4096})
    ->Args({static_cast<std::int64_t>(ggml_type::kQ8_0), 48 * 1024, 4096})
    ->UseRealTime();
BENCHMARK(BM_read)->Args({0, 1024})->Args({0, 48 * 1024});
BENCHMARK(BM_read_lanes)->Args({0, 48 * 1024})->UseRealTime();
BENCHMARK_MAIN();
