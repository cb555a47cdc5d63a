#pragma once
// Shared by the store tests: a small request shape, a fake model whose K and V are a function
// of the token (so fetched bytes can be checked value by value), and an engine instance (cache,
// storage, store) that serves a request start to end.
#include <relokv/attention/kv_append.hpp>
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/host_kv_storage.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "support/catch.hpp"
#include "support/test_data.hpp"

namespace relokv_test::store_fixture {

using relokv::block_tier;
using relokv::token_t;

inline std::vector<token_t> seq(token_t first, int n) { return relokv_test::iota_tokens(first, n); }
inline const auto kSys = seq(1000, 20);
inline const auto kA = seq(2000, 32);
inline const auto kB = seq(3000, 20);
inline const auto kQ = seq(4000, 5);

inline relokv::request_layout rag(std::initializer_list<const std::vector<token_t>*> docs) {
  relokv::layout_builder b(16);
  b.prefix(kSys);
  for (const auto* d : docs) b.span(*d);
  return b.question(kQ).build();
}

inline constexpr relokv::kv_shape kShape{2, 32, 2, 16, 8};  // layers, blocks, kv heads, block, dim
inline constexpr std::uint64_t kFp = 0x1234;

/// The K and V a fake model gives a token: a function of the token alone (what at_attention
/// stores), so that a fetched block can be checked value by value.
inline float kv_value(token_t t, int layer, int which, int head, int d) {
  return static_cast<float>(t) + 0.25f * static_cast<float>(layer) + 0.125f * float(which) +
         0.0625f * float(head) + 0.001f * float(d);
}

/// "Computes" what a plan asks for: writes every masked token's K and V into its block.
inline void compute(relokv::host_kv_storage<float>& kv, const relokv::request_layout& l,
                    const relokv::reuse_plan& p) {
  relokv::apply_fetches(kv, p.fetches);
  for (const auto& c : p.copies) kv.copy_block(c.src, c.dst);
  for (const auto& pb : p.blocks)
    for (std::int32_t j = 0; j < pb.len; ++j) {
      const auto pos = static_cast<std::size_t>(pb.pos0 + j);
      if (!p.compute[pos]) continue;
      for (int layer = 0; layer < kShape.num_layers; ++layer)
        for (int w = 0; w < 2; ++w)
          for (int h = 0; h < kShape.num_kv_heads; ++h)
            for (int d = 0; d < kShape.head_dim; ++d)
              kv.tile(layer, pb.physical, w, h)[j * kShape.head_dim + d] =
                  kv_value(l.tokens[pos], layer, w, h, d);
    }
}

/// True when every slot of every block of the plan holds its token's K and V.
inline bool holds_request(const relokv::host_kv_storage<float>& kv, const relokv::request_layout& l,
                          const relokv::reuse_plan& p) {
  for (const auto& pb : p.blocks)
    for (std::int32_t j = 0; j < pb.len; ++j)
      for (int layer = 0; layer < kShape.num_layers; ++layer)
        for (int w = 0; w < 2; ++w)
          for (int h = 0; h < kShape.num_kv_heads; ++h)
            for (int d = 0; d < kShape.head_dim; ++d)
              if (kv.tile(layer, pb.physical, w, h)[j * kShape.head_dim + d] !=
                  kv_value(l.tokens[static_cast<std::size_t>(pb.pos0 + j)], layer, w, h, d))
                return false;
  return true;
}

template <class Store, class Hash = relokv::xxh3_128, class Placement = relokv::at_attention,
          class Strategy = relokv::recompute::none>
struct instance {
  using cache_t =
      relokv::relocatable_cache<Hash, relokv::lru_block_pool, Placement, Strategy, Store>;
  relokv::host_kv_storage<float> kv{kShape};
  cache_t cache;
  explicit instance(Store s, std::uint64_t fp = kFp, Strategy strat = Strategy(),
                    std::int32_t blocks = kShape.num_blocks)
      : cache(relokv::lru_block_pool(blocks), 16, Hash(), std::move(strat), std::move(s),
              relokv::store_options{fp, kv.block_layout()}) {}
  /// One request, start to end: plan, compute, commit (writing through), release.
  relokv::reuse_plan serve(const relokv::request_layout& l, bool commit = true,
                           const relokv::extra_keys& x = {}, std::uint64_t principal = 0) {
    auto p = cache.plan(l, x, principal);
    REQUIRE(p.ok());
    compute(kv, l, p);
    CHECK(holds_request(kv, l, p));
    if (commit) cache.commit(p.id, kv);
    cache.release(p.id);
    return p;
  }
  /// serve() for a thread other than the test's own, which must not assert (Catch's
  /// assertions are not thread-safe): false when the plan failed or the K/V read back differ.
  bool serve_from_thread(const relokv::request_layout& l, bool commit = true) {
    auto p = cache.plan(l);
    if (!p.ok()) return false;
    compute(kv, l, p);
    const bool ok = holds_request(kv, l, p);
    if (commit) cache.commit(p.id, kv);
    cache.release(p.id);
    return ok;
  }
};

/// The forgery anyone who can write to the store can make of an unsealed entry: its header and
/// identity kept, the K/V replaced (every byte 0x7f), the checksum recomputed.
inline std::vector<std::byte> forge(std::vector<std::byte> b) {
  std::uint32_t off = 0, len = 0;
  std::memcpy(&off, b.data() + 96, 4);
  std::memcpy(&len, b.data() + 100, 4);
  std::fill_n(b.begin() + off, len, std::byte{0x7f});
  const std::uint64_t sum = XXH3_64bits(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &sum, 8);
  return b;
}
/// The best a writer without the key can do with a sealed entry: strip the seal, then forge.
inline std::vector<std::byte> strip_and_forge(std::vector<std::byte> b) {
  b.resize(b.size() - 16);
  b[60] = std::byte{0};
  std::fill_n(b.begin() + 112, 12, std::byte{0});
  return forge(std::move(b));
}

inline int count_tier(const relokv::reuse_plan& p, block_tier t) {
  int n = 0;
  for (const auto& pb : p.blocks) n += pb.tier == t;
  return n;
}

}  // namespace relokv_test::store_fixture
