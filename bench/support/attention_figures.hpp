#pragma once
// Decode-attention figures: bandwidth against a plain streaming read, rotation overheads, and
// the cost of pre_rotated relocation. Shape: 32k-token context, 32 query heads over 8 KV heads,
// head_dim 128, block size 16, one layer; one thread, and the KV heads split over the machine's
// threads (kv_head_range) for the bandwidth lines.
#include <relokv/attention/host_attention.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/measure.hpp"

namespace relokv_bench {

struct decode_setup {
  static constexpr int kContext = 32768, kBlock = 16, kHq = 32, kHkv = 8, kDim = 128;
  relokv::rope_config cfg;
  relokv::rope_table rope;
  std::vector<relokv::block_entry> table;
  std::int32_t indptr[2] = {0, kContext / kBlock};
  std::vector<float> q, out;
  relokv::pos_t m = kContext;

  static relokv::rope_config make_cfg() {
    relokv::rope_config c;
    c.head_dim = c.rotary_dim = kDim;
    c.theta = 500000;
    return c;
  }
  decode_setup() : cfg(make_cfg()), rope(cfg, kContext + 1) {
    for (int b = 0; b < kContext / kBlock; ++b) table.push_back({b, b * kBlock, kBlock});
    std::mt19937 rng(1);
    std::normal_distribution<float> d;
    q.resize(kHq * kDim);
    for (auto& x : q) x = d(rng);
    out.resize(q.size());
  }
  relokv::block_table_view view() const { return {table.data(), indptr, 1}; }
};

/// A pool of one layer of `shape` filled with standard normal values.
template <class T>
relokv::host_kv_storage<T> random_pool(const relokv::kv_shape& shape, unsigned seed) {
  relokv::host_kv_storage<T> st(shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  T* p = st.data();
  for (std::size_t i = 0; i < st.shape().total_elems(); ++i) p[i] = relokv::from_f32<T>(d(rng));
  return st;
}

/// The decode workload's pool.
template <class T>
relokv::host_kv_storage<T> random_pool(const decode_setup&) {
  return random_pool<T>(
      relokv::kv_shape{1, decode_setup::kContext / decode_setup::kBlock, decode_setup::kHkv,
                       decode_setup::kBlock, decode_setup::kDim},
      2);
}

/// A plain streaming read of n bytes (the bandwidth reference).
inline std::uint64_t stream_read(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const std::uint64_t*>(data);
  std::uint64_t acc[8] = {};
  const std::size_t n = bytes / 8;
  for (std::size_t i = 0; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] ^= p[i + static_cast<std::size_t>(l)];
  std::uint64_t r = 0;
  for (auto a : acc) r ^= a;
  return r;
}

template <class P, class T>
void run_decode(decode_setup& s, const relokv::host_kv_storage<T>& st,
                relokv::kv_head_range heads = {}) {
  relokv::decode_attention<P>(s.rope, st.layer(0), s.view(), s.q.data(), &s.m, decode_setup::kHq,
                              0.0884f, s.out.data(), heads);
  keep(s.out[0]);
}

/// The same decode through a sliding window of `window` tokens (the last blocks only).
template <class P, class T>
void run_decode_window(decode_setup& s, const relokv::host_kv_storage<T>& st, std::int32_t window,
                       relokv::kv_head_range heads = {}) {
  relokv::attention_params<T> p;
  p.rope = &s.rope;
  p.kv = st.layer(0);
  p.table = s.view();
  p.q = s.q.data();
  p.q_pos = &s.m;
  p.num_tokens = 1;
  p.num_q_heads = decode_setup::kHq;
  p.scale = 0.0884f;
  p.out = s.out.data();
  p.heads = heads;
  p.window = window;
  relokv::paged_attention<P>(p);
  keep(s.out[0]);
}

/// Threads for the split decode: the machine's, at most one per KV head.
inline int decode_threads() {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hw, 1, decode_setup::kHkv);
}

/// Runs f(t) for t in [0, threads): t = 0 on the calling thread, the others on threads started
/// per call (so their cost is in the figures).
template <class F>
void on_threads(int threads, F f) {
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(f, t);
  f(0);
  for (auto& th : pool) th.join();
}

/// One decode call split over KV heads, one share per thread.
template <class P, class T>
void run_decode_threads(decode_setup& s, const relokv::host_kv_storage<T>& st, int threads) {
  const int H = decode_setup::kHkv;
  on_threads(threads, [&](int t) {
    run_decode<P>(s, st, {H * t / threads, H * (t + 1) / threads});
  });
}

using figure_lines = std::vector<std::pair<std::string, double>>;

struct bw_figures {
  double fraction;     ///< median of time(stream) / time(kernel) over the repetitions
  double stream_gb_s;  ///< the plain read's median bandwidth in the same repetitions
};

/// The kernel against a plain read of the `total` bytes at `base` that it reads, split over the
/// same number of threads, alternated `reps` times after a warm-up (first touch, tables):
/// time(stream) / time(kernel) = (bytes/time(kernel)) / (bytes/time(stream)).
template <class K>
bw_figures against_stream(K&& kernel, const char* base, std::size_t total, int reps, int threads) {
  const std::size_t share = total / static_cast<std::size_t>(threads) / 64 * 64;
  auto stream = [&] {
    on_threads(threads, [&](int t) {
      const std::size_t begin = share * static_cast<std::size_t>(t);
      const std::size_t end = t + 1 == threads ? total : begin + share;
      keep(stream_read(base + begin, end - begin));
    });
  };
  kernel();
  std::vector<double> ratio, gb_s;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_ns();
    kernel();
    const double t1 = now_ns();
    stream();
    const double t2 = now_ns();
    ratio.push_back((t2 - t1) / (t1 - t0));
    gb_s.push_back(static_cast<double>(total) / (t2 - t1));
  }
  return {median(ratio), median(gb_s)};
}

template <class T>
bw_figures bw_fraction(decode_setup& s, int reps, int threads) {
  const auto st = random_pool<T>(s);
  return against_stream([&] { run_decode_threads<relokv::block_relative>(s, st, threads); },
                        reinterpret_cast<const char*>(st.data()), st.bytes(), reps, threads);
}

/// decode_bw_fraction through a sliding window of `window` tokens over the 32k context: the
/// kernel reads the window's blocks (and skips the others by their positions), the stream
/// reference reads the same bytes.
inline bw_figures bw_fraction_window(decode_setup& s, int reps, int threads, std::int32_t window) {
  const auto st = random_pool<relokv::bf16>(s);
  const int H = decode_setup::kHkv;
  auto kernel = [&] {
    on_threads(threads, [&](int t) {
      run_decode_window<relokv::block_relative>(s, st, window,
                                                {H * t / threads, H * (t + 1) / threads});
    });
  };
  const std::size_t block_bytes = st.bytes() / (decode_setup::kContext / decode_setup::kBlock);
  const std::size_t total =
      block_bytes * (static_cast<std::size_t>(window / decode_setup::kBlock) + 1);
  return against_stream(kernel, reinterpret_cast<const char*>(st.data()) + st.bytes() - total,
                        total, reps, threads);
}

/// MQA decode (8 query heads over one KV head, head_dim 256, as Gemma 2B; bf16, 64k tokens, 64
/// MiB: from DRAM) split over the sequence's blocks on `threads` threads, the parts merged by
/// their log-sum-exps: time of one call on one thread over time of the split call. kv_head_range
/// cannot share one KV head out; this is what the split gives such models.
inline double mqa_split_speedup(int reps, int threads) {
  constexpr int kCtx = 65536, kBs = 16, kHq = 8, kDim = 256, kBlocks = kCtx / kBs;
  relokv::rope_config c;
  c.head_dim = c.rotary_dim = kDim;
  const relokv::rope_table rope(c, kCtx + 1);
  const auto st = random_pool<relokv::bf16>(relokv::kv_shape{1, kBlocks, 1, kBs, kDim}, 3);
  std::mt19937 rng(4);
  std::normal_distribution<float> d;
  std::vector<relokv::block_entry> table;
  for (int b = 0; b < kBlocks; ++b) table.push_back({b, b * kBs, kBs});
  std::vector<float> q(kHq * kDim);
  for (auto& x : q) x = d(rng);
  const auto parts = static_cast<std::size_t>(threads);
  std::vector<float> out(parts * q.size()), lse(parts * kHq);
  const relokv::pos_t m = kCtx;
  const relokv::paged_kv_view<const relokv::bf16> kv(st.layer(0));
  const auto part = [&](int t, int n) {  // blocks of part t of n into out/lse row t
    const std::int32_t b0 = kBlocks * t / n, b1 = kBlocks * (t + 1) / n;
    const std::int32_t indptr[2] = {0, b1 - b0};
    const auto i = static_cast<std::size_t>(t);
    relokv::decode_attention<relokv::block_relative>(
        rope, kv, {table.data() + b0, indptr, 1}, q.data(), &m, kHq, 0.0625f,
        out.data() + i * q.size(), {}, lse.data() + i * kHq);
  };
  auto one = [&] {
    part(0, 1);
    keep(out[0]);
  };
  auto split = [&] {
    on_threads(threads, [&](int t) { part(t, threads); });
    for (std::size_t t = 1; t < parts; ++t)
      relokv::merge_attention_states(kHq, kDim, out.data(), lse.data(), out.data() + t * q.size(),
                                     lse.data() + t * kHq);
    keep(out[0]);
  };
  split();
  return median_ratio(one, split, reps, 1);
}

/// Microseconds to relocate 1k cached tokens under a placement that rotates no key: plan
/// (lookup, verification, strategy, refcounts), the copies the plan asks for, the block table.
template <class P>
double relocate_by_table_us(const decode_setup& s, int reps) {
  constexpr int kSpan = 256;
  std::vector<std::vector<relokv::token_t>> spans(4);
  for (int d = 0; d < 4; ++d)
    for (int i = 0; i < kSpan; ++i)
      spans[static_cast<std::size_t>(d)].push_back(10000 * (d + 1) + i);
  std::vector<relokv::token_t> sys(32);
  for (int i = 0; i < 32; ++i) sys[static_cast<std::size_t>(i)] = 7 + i;
  auto layout = [&](std::initializer_list<int> order) {
    relokv::layout_builder b(decode_setup::kBlock);
    b.prefix(sys);
    for (int d : order) b.span(spans[static_cast<std::size_t>(d)]);
    return b.build();
  };
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, P> cache(
      relokv::lru_block_pool(256), decode_setup::kBlock);
  auto seed = cache.plan(layout({0, 1, 2, 3}));
  cache.commit(seed.id);
  cache.release(seed.id);
  const auto moved = layout({3, 2, 1, 0});
  relokv::host_kv_storage<relokv::bf16> st(
      relokv::kv_shape{1, 256, decode_setup::kHkv, decode_setup::kBlock, decode_setup::kDim});
  relokv::reuse_plan plan;
  std::vector<relokv::block_entry> table;
  auto relocate = [&] {
    cache.plan_into(moved, cache.strategy(), {}, plan);
    relokv::apply_copies<P>(s.rope, st, plan.copies);
    table.clear();
    for (const auto& pb : plan.blocks) table.push_back({pb.physical, pb.pos0, pb.len});
    keep(table.back());
    cache.release(plan.id);
  };
  relocate();
  const double tokens = 4.0 * kSpan;
  return median_ns(relocate, reps, 20) / 1000.0 * (1000.0 / tokens);
}

inline figure_lines attention_figures(int reps) {
  figure_lines out;
  decode_setup s;
  // Kernel and stream reference run on the same number of threads.
  const int threads = decode_threads();
  out.emplace_back("decode_bw_fraction_fp32", bw_fraction<float>(s, reps, threads).fraction);
  const bw_figures bf16 = bw_fraction<relokv::bf16>(s, reps, threads);
  out.emplace_back("decode_bw_fraction_bf16", bf16.fraction);
  // The reference's own bandwidth: on a shared host it moves with the neighbours' traffic
  // (about 36-40 GB/s or 65 GB/s on two threads here), and the fraction with it.
  out.emplace_back("decode_stream_gb_s", bf16.stream_gb_s);
  out.emplace_back("decode_bw_fraction_bf16_one_thread",
                   bw_fraction<relokv::bf16>(s, reps, 1).fraction);
  out.emplace_back("decode_threads", threads);
  out.emplace_back("decode_split_speedup_mqa", mqa_split_speedup(reps, threads));
  {
    const auto st = random_pool<relokv::bf16>(s);
    auto base = [&] { run_decode<relokv::pre_rotated>(s, st); };
    auto at = [&] { run_decode<relokv::at_attention>(s, st); };
    auto rel = [&] { run_decode<relokv::block_relative>(s, st); };
    base();
    out.emplace_back("rotate_overhead_at_attention", median_ratio(at, base, reps, 1));
    out.emplace_back("rotate_overhead_block_relative", median_ratio(rel, base, reps, 1));
    // The same with a sliding window of 8,192 tokens (Mistral's 4k, Gemma's 512-1k: the
    // shape of a windowed layer), beside off: bf16 decode reads block by block under a window
    // (its multi-block spans take none), so the window's own cost shows in these.
    constexpr std::int32_t kWindow = 8192;
    auto wbase = [&] { run_decode_window<relokv::pre_rotated>(s, st, kWindow); };
    auto wat = [&] { run_decode_window<relokv::at_attention>(s, st, kWindow); };
    auto wrel = [&] { run_decode_window<relokv::block_relative>(s, st, kWindow); };
    wbase();
    out.emplace_back("rotate_overhead_at_attention_window", median_ratio(wat, wbase, reps, 1));
    out.emplace_back("rotate_overhead_block_relative_window", median_ratio(wrel, wbase, reps, 1));
  }
  out.emplace_back("decode_bw_fraction_bf16_window",
                   bw_fraction_window(s, reps, threads, 8192).fraction);
  {
    // Relocating 1k pre-rotated tokens (64 blocks) of one layer: copy + delta rotation.
    relokv::host_kv_storage<relokv::bf16> st(
        relokv::kv_shape{1, 128, decode_setup::kHkv, decode_setup::kBlock, decode_setup::kDim});
    auto relocate = [&] {
      for (int b = 0; b < 64; ++b) relokv::relocate_block(s.rope, st.layer(0), b, 64 + b, 777, 16);
      keep(st.data()[0]);
    };
    out.emplace_back("relocate_pre_rotated_us_per_1k_tokens",
                     median_ns(relocate, reps, 3) / 1000.0);
    // The other placements relocate by changing pos0 in the block table: no key is touched.
    // What remains is measured: planning 1k relocated tokens (four 256-token spans cached in
    // one order, read in the reverse one), the plan's copies (none) and its block table.
    out.emplace_back("relocate_at_attention_us_per_1k_tokens",
                     relocate_by_table_us<relokv::at_attention>(s, reps));
    out.emplace_back("relocate_block_relative_us_per_1k_tokens",
                     relocate_by_table_us<relokv::block_relative>(s, reps));
  }
  return out;
}

}  // namespace relokv_bench
