// Google Benchmark: bf16 decode attention from DRAM beside the memory reads that bound it.
//   ./build/bench/relokv_bench_decode --benchmark_repetitions=5 --benchmark_report_aggregates_only
// The workload of decode_bw_fraction (32k tokens, 32 query heads over 8 KV heads, head_dim 128,
// bf16, block_relative; 128 MiB of K/V, past the last-level cache). Every line reports the K/V
// bytes it reads per second (bytes_per_second), each byte once, on 1 and 2 threads (wall time):
//   decode_heads   the kernel, the KV heads shared out over the threads (kv_head_range);
//   decode_heads_scattered  the same over physical blocks in shuffled order (a used pool): the
//                  software prefetches do not depend on blocks lying in order;
//   decode_blocks  the kernel, the blocks shared out (each part with its log-sum-exp; the merge,
//                  a few microseconds, is left out);
//   read_contiguous       a plain read of each thread's contiguous share (the report's reference);
//   prefetch_contiguous   the same with software prefetches 32 KiB ahead;
//   read_tiles_heads      plain loads of the 4 KiB tiles a thread's heads own, in the kernel's
//                         order: the page pattern alone, without arithmetic;
//   prefetch_tiles_heads  the same tiles brought in by software prefetches a span ahead, as the
//                         kernel does, without arithmetic: what software prefetching gets.
// The kernel is measured against these: it cannot beat the prefetched read of its own pattern.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#include "support/attention_figures.hpp"

namespace {

using relokv_bench::decode_setup;

struct shared_pool {
  decode_setup setup;
  relokv::host_kv_storage<relokv::bf16> st = relokv_bench::random_pool<relokv::bf16>(setup);
  /// The same logical sequence over physical blocks in shuffled order, as a pool that has
  /// served many requests hands them out.
  std::vector<relokv::block_entry> scattered = [this] {
    std::vector<relokv::block_entry> t = setup.table;
    std::vector<relokv::block_id> phys;
    for (const auto& e : t) phys.push_back(e.block);
    std::shuffle(phys.begin(), phys.end(), std::mt19937(11));
    for (std::size_t i = 0; i < t.size(); ++i) t[i].block = phys[i];
    return t;
  }();
};

/// One pool for every benchmark and thread (built on first use).
shared_pool& pool() {
  static shared_pool p;
  return p;
}

constexpr int kBlocks = decode_setup::kContext / decode_setup::kBlock;
constexpr int kHeads = decode_setup::kHkv;
constexpr std::size_t kTile =
    std::size_t{decode_setup::kBlock} * decode_setup::kDim * sizeof(relokv::bf16);

std::size_t share_bytes(const benchmark::State& s) {
  return pool().st.bytes() / static_cast<std::size_t>(s.threads());
}

/// The kernel over `table`, this thread's share of the KV heads.
void decode_heads(benchmark::State& s, const relokv::block_entry* table) {
  auto& p = pool();
  const int t = s.thread_index(), n = s.threads();
  // Each thread its own output (the calls write disjoint rows anyway).
  std::vector<float> out(p.setup.out.size());
  const relokv::pos_t m = p.setup.m;
  const relokv::block_table_view view{table, p.setup.indptr, 1};
  for (auto _ : s) {
    relokv::decode_attention<relokv::block_relative>(
        p.setup.rope, p.st.layer(0), view, p.setup.q.data(), &m, decode_setup::kHq, 0.0884f,
        out.data(), {kHeads * t / n, kHeads * (t + 1) / n});
    benchmark::DoNotOptimize(out.data());
  }
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations()) *
                      static_cast<std::int64_t>(share_bytes(s)));
}

void BM_decode_heads(benchmark::State& s) { decode_heads(s, pool().setup.table.data()); }
BENCHMARK(BM_decode_heads)->Threads(1)->Threads(2)->UseRealTime();

void BM_decode_heads_scattered(benchmark::State& s) { decode_heads(s, pool().scattered.data()); }
BENCHMARK(BM_decode_heads_scattered)->Threads(1)->Threads(2)->UseRealTime();

/// Start of this thread's contiguous share of the pool.
const char* own_share(const benchmark::State& s) {
  return reinterpret_cast<const char*>(pool().st.data()) +
         share_bytes(s) * static_cast<std::size_t>(s.thread_index());
}

void BM_decode_blocks(benchmark::State& s) {
  auto& p = pool();
  const int t = s.thread_index(), n = s.threads();
  std::vector<float> out(p.setup.out.size()), lse(decode_setup::kHq);
  const relokv::pos_t m = p.setup.m;
  const std::int32_t b0 = kBlocks * t / n, b1 = kBlocks * (t + 1) / n;
  const std::int32_t indptr[2] = {0, b1 - b0};
  for (auto _ : s) {
    relokv::decode_attention<relokv::block_relative>(
        p.setup.rope, p.st.layer(0), {p.setup.table.data() + b0, indptr, 1}, p.setup.q.data(), &m,
        decode_setup::kHq, 0.0884f, out.data(), {}, lse.data());
    benchmark::DoNotOptimize(out.data());
  }
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations()) *
                      static_cast<std::int64_t>(share_bytes(s)));
}
BENCHMARK(BM_decode_blocks)->Threads(1)->Threads(2)->UseRealTime();

void BM_read_contiguous(benchmark::State& s) {
  const std::size_t share = share_bytes(s);
  const char* base = own_share(s);
  for (auto _ : s) benchmark::DoNotOptimize(relokv_bench::stream_read(base, share));
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations()) * static_cast<std::int64_t>(share));
}
BENCHMARK(BM_read_contiguous)->Threads(1)->Threads(2)->UseRealTime();

void BM_prefetch_contiguous(benchmark::State& s) {
  const std::size_t share = share_bytes(s);
  const char* base = own_share(s);
  constexpr std::size_t kAhead = 32 * 1024;  // about what the kernel keeps in flight
  for (auto _ : s) {
    std::uint64_t acc = 0;
    for (std::size_t o = 0; o < share; o += 64) {
      if (o + kAhead < share) __builtin_prefetch(base + o + kAhead, 0, 1);
      acc ^= *reinterpret_cast<const std::uint64_t*>(base + o);
    }
    benchmark::DoNotOptimize(acc);
  }
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations()) * static_cast<std::int64_t>(share));
}
BENCHMARK(BM_prefetch_contiguous)->Threads(1)->Threads(2)->UseRealTime();

/// The tiles of this thread's heads in the order the bf16 span kernel reads them: per span of
/// four blocks, each block's K tiles (the heads together), then each head's V tiles across the
/// four blocks.
std::vector<const char*> tile_order(const benchmark::State& s) {
  const auto& st = pool().st;
  const int t = s.thread_index(), n = s.threads();
  const int h0 = kHeads * t / n, h1 = kHeads * (t + 1) / n;
  const relokv::paged_kv_view<const relokv::bf16> kv(st.layer(0));
  std::vector<const char*> order;
  for (int b0 = 0; b0 < kBlocks; b0 += 4) {
    for (int b = b0; b < b0 + 4; ++b)
      for (int h = h0; h < h1; ++h) order.push_back(reinterpret_cast<const char*>(kv.k(b, h)));
    for (int h = h0; h < h1; ++h)
      for (int b = b0; b < b0 + 4; ++b) order.push_back(reinterpret_cast<const char*>(kv.v(b, h)));
  }
  return order;
}

std::uint64_t read_tile(const char* p) {
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < kTile; i += 64) acc ^= *reinterpret_cast<const std::uint64_t*>(p + i);
  return acc;
}

void BM_read_tiles_heads(benchmark::State& s) {
  const auto order = tile_order(s);
  for (auto _ : s) {
    std::uint64_t acc = 0;
    for (const char* p : order) acc ^= read_tile(p);
    benchmark::DoNotOptimize(acc);
  }
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations()) *
                      static_cast<std::int64_t>(order.size() * kTile));
}
BENCHMARK(BM_read_tiles_heads)->Threads(1)->Threads(2)->UseRealTime();

void BM_prefetch_tiles_heads(benchmark::State& s) {
  const auto order = tile_order(s);
  // A span's worth of tiles ahead (8 per block and span for 4 heads), one line prefetched per
  // line read.
  const std::size_t ahead = 4 * 2 * static_cast<std::size_t>(kHeads / s.threads());
  for (auto _ : s) {
    std::uint64_t acc = 0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const char* p = order[i];
      const char* pf = i + ahead < order.size() ? order[i + ahead] : nullptr;
      for (std::size_t o = 0; o < kTile; o += 64) {
        if (pf != nullptr) __builtin_prefetch(pf + o, 0, 1);
        acc ^= *reinterpret_cast<const std::uint64_t*>(p + o);
      }
    }
    benchmark::DoNotOptimize(acc);
  }
  s.SetBytesProcessed(static_cast<std::int64_t>(s.iterations()) *
                      static_cast<std::int64_t>(order.size() * kTile));
}
BENCHMARK(BM_prefetch_tiles_heads)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
