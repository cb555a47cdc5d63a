#pragma once
// Store figures: fetching blocks from Redis and from a directory, each over the plain read of
// the same bytes in the same run, and what a stored block carries besides its K and V.
//  - store_redis_get_gb_s:  redis_store::get (a pipeline of GETs) of 64 SmolLM2-sized blocks (30
//  layers,
//    3 KV heads, head_dim 64, 16 slots, fp32: 720 KiB of K and V each), each decoded and
//    checked (structure, fingerprint, layout, XXH3 checksum);
//  - store_redis_over_raw:  that over plain hiredis GETs (pipelined, replies held until the
//    batch is in, as the store's are) of the same keys;
//  - store_file_get_gb_s, store_file_over_read: file_store::get (bounded reads into its
//    reused buffers) plus the same checks, over read() of the same files into one buffer
//    (page cache warm in both);
//  - store_block_kv_bytes (a SmolLM2 block's K and V), store_block_format_bytes_{1k,8k,32k}
//    (what a stored block carries besides them: header, identity, padding, checksum), for the
//    block at position 1,024, 8,192 and 32,768 of one long prompt as the cache commits it
//    (format 2: a digest of what precedes the block, so the same at every position), and
//    store_overhead_fraction_at_32k (the last over the block's K and V);
//  - store_seal_gb_s: sealed_store's seal then open (AES-256-GCM, libcrypto) of those blocks on
//    one core: block bytes per second through both (each byte is sealed once and opened once);
//  - store_redis_sealed_over_raw: a sealed fetch (sealed_store<redis_store>::get, every entry
//    opened, decoded and checked) over the plain hiredis GETs of the same sealed bytes;
//  - store_redis_index_bytes (what Redis
//    holds per entry beyond its value: MEMORY USAGE of an entry with a 1-byte value under a
//    key of the same length, minus 1) and store_redis_value_slack_bytes (the allocator's
//    rounding of a block-sized value, which is not index but is memory).
// The Redis lines need redis-server (started here on a free loopback port, stopped after).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/hash/xxh3.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/memory/lru_block_pool.hpp>
#include <relokv/recompute/none.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/store/block_format.hpp>
#include <relokv/store/file_store.hpp>
#include <relokv/store/sealed_store.hpp>
#if defined(RELOKV_WITH_REDIS) && RELOKV_WITH_REDIS
#include <relokv/store/redis_store.hpp>

#include "support/redis_server.hpp"
#endif

#include "support/measure.hpp"

namespace relokv_bench {

struct store_sample {
  static constexpr int kBlocks = 64;
  relokv::kv_block_layout layout{30, 3, 64, 16, static_cast<std::uint8_t>(relokv::dtype::kF32), 4};
  std::uint64_t fingerprint = 0x5eed;
  std::vector<relokv::store_key> keys;
  std::vector<std::vector<std::byte>> values;
  store_sample() {
    std::vector<relokv::token_t> ctx(40), toks(16);
    for (int i = 0; i < 40; ++i) ctx[static_cast<std::size_t>(i)] = 100 + i;
    relokv::identity_chain chain;
    for (int b = 0; b < kBlocks; ++b) {
      for (int i = 0; i < 16; ++i) toks[static_cast<std::size_t>(i)] = 1000 * b + i;
      chain.begin_content(ctx);
      relokv::block_header h;
      h.fingerprint = fingerprint;
      h.key = {static_cast<std::uint64_t>(b) * 0x9E3779B97F4A7C15ull + 1, 77};
      h.layout = layout;
      h.kind = relokv::store_entry_kind::kContent;
      h.len = 16;
      h.pos0 = 40 + 64 * b;
      std::vector<std::byte> out;
      relokv::encode_block(
          h, {chain.digest(), 1, toks},
          [b](std::span<std::byte> p) {
            for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(i * 13 + b);
          },
          out);
      keys.push_back(h.key);
      values.push_back(std::move(out));
    }
  }
  [[nodiscard]] std::size_t total_bytes() const {
    std::size_t n = 0;
    for (const auto& v : values) n += v.size();
    return n;
  }
  [[nodiscard]] std::vector<std::span<const std::byte>> views() const {
    std::vector<std::span<const std::byte>> v;
    for (const auto& x : values) v.emplace_back(x);
    return v;
  }
  /// Decodes and checks every fetched blob; false if any fails.
  bool check(const std::vector<relokv::store_blob>& blobs) const {
    bool ok = blobs.size() == values.size();
    for (const auto& b : blobs)
      ok = ok &&
           relokv::decode_block(b.bytes(), fingerprint, layout).check == relokv::block_check::kOk;
    return ok;
  }
};

/// A store that keeps what it is given, in order (the format figures read the blobs back).
struct recording_store {
  std::shared_ptr<std::vector<std::vector<std::byte>>> puts =
      std::make_shared<std::vector<std::vector<std::byte>>>();
  relokv::store_status get(std::span<const relokv::store_key> k,
                           std::vector<relokv::store_blob>& o) const {
    o.assign(k.size(), {});
    return relokv::store_status::kOk;
  }
  relokv::store_status put(std::span<const relokv::store_key>,
                           std::span<const std::span<const std::byte>> v) const {
    for (const auto& x : v) puts->emplace_back(x.begin(), x.end());
    return relokv::store_status::kOk;
  }
  relokv::store_status contains(std::span<const relokv::store_key> k,
                                std::vector<std::uint8_t>& o) const {
    o.assign(k.size(), 0);
    return relokv::store_status::kOk;
  }
  relokv::store_status erase(std::span<const relokv::store_key>) const {
    return relokv::store_status::kOk;
  }
  [[nodiscard]] relokv::store_counters counters() const { return {}; }
};

/// Bytes of a stored block that are not K/V, for the blocks holding positions `at` of one
/// 32,768-token prompt committed by a cache with a store (blocks of 16; the K/V layout does
/// not change these bytes, so a one-layer, one-head layout stands in for the model's).
inline std::vector<std::size_t> format_bytes_at(const std::vector<relokv::pos_t>& at) {
  constexpr int kTokens = 32768 + 16, kBlock = 16;
  relokv::host_kv_storage<float> kv(relokv::kv_shape{1, kTokens / kBlock, 1, kBlock, 8});
  recording_store rec;
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, relokv::block_relative,
                            relokv::recompute::none, recording_store>
      cache(relokv::lru_block_pool(kTokens / kBlock), kBlock, relokv::xxh3_128{},
            relokv::recompute::none{}, rec, relokv::store_options{0x5eed, kv.block_layout()});
  std::vector<relokv::token_t> prompt(kTokens);
  for (int i = 0; i < kTokens; ++i) prompt[static_cast<std::size_t>(i)] = (i * 7919) % 49152;
  const auto layout = relokv::layout_builder(kBlock).prefix(prompt).build();
  auto plan = cache.plan(layout);
  if (!plan.ok()) return std::vector<std::size_t>(at.size(), 0);
  cache.commit(plan.id, kv);
  cache.release(plan.id);
  std::vector<std::size_t> out(at.size(), 0);
  for (const auto& blob : *rec.puts) {
    const auto d = relokv::decode_block(blob, 0x5eed, kv.block_layout());
    if (d.check != relokv::block_check::kOk) continue;
    for (std::size_t i = 0; i < at.size(); ++i)
      if (at[i] >= d.header.pos0 && at[i] < d.header.pos0 + d.header.len)
        out[i] = blob.size() - d.payload.size();
  }
  return out;
}

inline std::vector<std::pair<std::string, double>> store_figures(int reps) {
  std::vector<std::pair<std::string, double>> out;
  const store_sample s;
  const double gb = double(s.total_bytes()) / 1e9;
  reps = std::max(reps, 3);
  out.emplace_back("store_block_kv_bytes", double(s.layout.payload_bytes(16)));
  const auto fb = format_bytes_at({1024, 8192, 32768});
  out.emplace_back("store_block_format_bytes_1k", double(fb[0]));
  out.emplace_back("store_block_format_bytes_8k", double(fb[1]));
  out.emplace_back("store_block_format_bytes_32k", double(fb[2]));
  out.emplace_back("store_overhead_fraction_at_32k",
                   double(fb[2]) / double(s.layout.payload_bytes(16)));

  // Sealing: seal then open every block on this core.
  const relokv::seal_key seal = relokv::seal_key::from_hex(
      "8f0e1d2c3b4a59687766554433221100ffeeddccbbaa99887766554433221100", "bench");
  {
    relokv::sealed_store<recording_store> sealer(recording_store{}, seal);
    std::vector<std::byte> sealed, opened;
    bool ok = true;
    const auto seal_open = [&] {
      for (const auto& v : s.values) {
        ok = ok && sealer.seal(v, sealed) && sealer.open(sealed, opened);
      }
    };
    seal_open();
    const double t = median_ns(seal_open, reps, 1);
    out.emplace_back("store_seal_gb_s", gb / (t * 1e-9));
    if (!ok) out.emplace_back("store_seal_check_failed", 1);
  }

  // Files, page cache warm.
  {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("relokv_store_bench_" + std::to_string(::getpid()));
    relokv::file_store fs(dir);
    const auto views = s.views();
    (void)fs.put(s.keys, views);
    std::vector<relokv::store_blob> blobs;
    std::vector<std::byte> buf(s.values.front().size() + 4096);
    bool ok = true;
    const auto store_get = [&] {
      (void)fs.get(s.keys, blobs);
      ok = ok && s.check(blobs);
      blobs.clear();
    };
    const auto plain_read = [&] {
      std::uint64_t acc = 0;
      for (const auto& k : s.keys) {
        const int fd = ::open(fs.path_of(k).c_str(), O_RDONLY);
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        ::close(fd);
        acc += static_cast<std::uint64_t>(n);
      }
      keep(acc);
    };
    store_get();
    plain_read();
    const double t = median_ns(store_get, reps, 1);
    out.emplace_back("store_file_get_gb_s", gb / (t * 1e-9));
    out.emplace_back("store_file_over_read", 1.0 / median_ratio(store_get, plain_read, reps, 1));
    std::filesystem::remove_all(dir);
    if (!ok) out.emplace_back("store_file_check_failed", 1);
  }

#if defined(RELOKV_WITH_REDIS) && RELOKV_WITH_REDIS
  if (!relokv_test::find_redis_server().empty()) {
    relokv_test::redis_server server;
    auto opt = relokv::redis_store_options::from_url(server.url());
    opt.command_timeout = std::chrono::milliseconds(10000);
    relokv::redis_store rs(opt);
    const auto views = s.views();
    (void)rs.put(s.keys, views);
    std::vector<relokv::store_blob> blobs;
    bool ok = true;
    const auto store_get = [&] {
      (void)rs.get(s.keys, blobs);
      ok = ok && s.check(blobs);
      blobs.clear();
    };
    // The same GETs through hiredis (one pipeline), with nothing on top.
    redisContext* c = redisConnect("127.0.0.1", server.port());
    std::vector<std::string> names;
    for (const auto& k : s.keys) names.push_back(rs.name_of(k));
    const auto raw_get = [&] {
      for (const auto& n : names) {
        const char* argv[2] = {"GET", n.data()};
        const std::size_t lens[2] = {3, n.size()};
        redisAppendCommandArgv(c, 2, argv, lens);
      }
      // Held until the batch is in, as the store's blobs are (a plan needs them all).
      std::vector<void*> replies(names.size(), nullptr);
      for (auto& r : replies) ok = ok && redisGetReply(c, &r) == REDIS_OK && r != nullptr;
      for (void* r : replies)
        if (r) freeReplyObject(r);
    };
    store_get();
    raw_get();
    const double t = median_ns(store_get, reps, 1);
    out.emplace_back("store_redis_get_gb_s", gb / (t * 1e-9));
    out.emplace_back("store_redis_over_raw", 1.0 / median_ratio(store_get, raw_get, reps, 1));
    // Per-entry index cost: an entry with a 1-byte value under a key of the same length; the
    // allocator's rounding of a block-sized value is reported apart (it is not index).
    const auto usage = [&](const std::string& key) {
      auto* mu =
          static_cast<redisReply*>(redisCommand(c, "MEMORY USAGE %s SAMPLES 0", key.c_str()));
      const double v = mu && mu->type == REDIS_REPLY_INTEGER ? double(mu->integer) : -1;
      if (mu) freeReplyObject(mu);
      return v;
    };
    std::string tiny = names[0];
    tiny[tiny.size() - 1] = tiny[tiny.size() - 1] == 'x' ? 'y' : 'x';
    if (auto* r = static_cast<redisReply*>(redisCommand(c, "SET %s x", tiny.c_str())))
      freeReplyObject(r);
    out.emplace_back("store_redis_index_bytes", usage(tiny) - 1);
    out.emplace_back("store_redis_value_slack_bytes",
                     usage(names[0]) - usage(tiny) + 1 - double(s.values[0].size()));
    // The same entries sealed: the sealed fetch over plain GETs of the sealed bytes.
    relokv::sealed_store<relokv::redis_store> sealed(relokv::redis_store(opt), seal);
    (void)sealed.put(s.keys, views);
    const auto sealed_get = [&] {
      (void)sealed.get(s.keys, blobs);
      ok = ok && s.check(blobs);
      blobs.clear();
    };
    sealed_get();
    raw_get();
    out.emplace_back("store_redis_sealed_over_raw",
                     1.0 / median_ratio(sealed_get, raw_get, reps, 1));
    redisFree(c);
    if (!ok) out.emplace_back("store_redis_check_failed", 1);
  }
#endif
  return out;
}

}  // namespace relokv_bench
