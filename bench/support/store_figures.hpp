#pragma once
// Store figures: fetching blocks from Redis and from a directory, each over the plain read of
// the same bytes in the same run, and what a stored block carries besides its K and V.
//  - store_redis_get_gb_s:  redis_store::get (a pipeline of GETs) of 64 SmolLM2-sized blocks (30
//  layers,
//    3 KV heads, head_dim 64, 16 slots, fp32: 720 KiB of K and V each), each decoded and
//    checked (structure, fingerprint, layout, XXH3 checksum);
//  - store_redis_over_raw:  that over plain hiredis GETs (pipelined, replies held until the
//    batch is in, as the store's are) of the same keys;
//  - store_file_get_gb_s, store_file_over_read: file_store::get (mmap) plus the same checks,
//    over read() of the same files into a buffer (page cache warm in both);
//  - store_block_kv_bytes, store_block_format_bytes (header, identity, padding, checksum of a
//    span's 4th block after a 40-token system prompt), store_redis_index_bytes (what Redis
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

#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/store/block_format.hpp>
#include <relokv/store/file_store.hpp>
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
  std::size_t format_bytes = 0;
  store_sample() {
    std::vector<std::uint32_t> chain;
    for (int i = 0; i < 4; ++i) chain.insert(chain.end(), {i == 0 ? 0x101u : 1u, 16u});
    std::vector<relokv::token_t> ctx(40), toks(64);
    for (int i = 0; i < 40; ++i) ctx[static_cast<std::size_t>(i)] = 100 + i;
    for (int b = 0; b < kBlocks; ++b) {
      for (int i = 0; i < 64; ++i) toks[static_cast<std::size_t>(i)] = 1000 * b + i;
      relokv::block_header h;
      h.fingerprint = fingerprint;
      h.key = {static_cast<std::uint64_t>(b) * 0x9E3779B97F4A7C15ull + 1, 77};
      h.layout = layout;
      h.kind = relokv::store_entry_kind::kContent;
      h.len = 16;
      h.pos0 = 40 + 64 * b;
      std::vector<std::byte> out;
      relokv::encode_block(
          h, {chain, ctx, toks},
          [b](std::span<std::byte> p) {
            for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(i * 13 + b);
          },
          out);
      format_bytes = out.size() - layout.payload_bytes(16);
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

inline std::vector<std::pair<std::string, double>> store_figures(int reps) {
  std::vector<std::pair<std::string, double>> out;
  const store_sample s;
  const double gb = double(s.total_bytes()) / 1e9;
  reps = std::max(reps, 3);
  out.emplace_back("store_block_kv_bytes", double(s.layout.payload_bytes(16)));
  out.emplace_back("store_block_format_bytes", double(s.format_bytes));

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
    redisFree(c);
    if (!ok) out.emplace_back("store_redis_check_failed", 1);
  }
#endif
  return out;
}

}  // namespace relokv_bench
