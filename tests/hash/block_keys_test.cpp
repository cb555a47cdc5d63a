#include <relokv/hash/block_keys.hpp>
#include <relokv/hash/xxh3.hpp>
#include <relokv/layout/builder.hpp>

#include <vector>

#include "support/catch.hpp"
#include "support/test_data.hpp"
#include "support/weak_hash.hpp"

using relokv::token_t;

namespace {
std::vector<token_t> seq(token_t first, int n) { return relokv_test::iota_tokens(first, n); }
}  // namespace

TEST_CASE("xxh3 schemes are stable across processes and builds", "[hash]") {
  // Golden values pin the documented byte layout: a change here breaks persisted caches.
  const relokv::xxh3_128 h128(42);
  const relokv::xxh3_64 h64(42);
  const std::vector<token_t> t = {1, 2, 3, 4};
  const auto k128 =
      h128.digest(std::as_bytes(std::span<const token_t>(t)), relokv::hash_domain::kTokens);
  const auto k64 =
      h64.digest(std::as_bytes(std::span<const token_t>(t)), relokv::hash_domain::kTokens);
  // Independent recomputation through xxHash's own API with the documented seed derivation.
  const std::uint64_t seed = 42ull ^ (2ull * 0x9E3779B97F4A7C15ull);
  const unsigned char bytes[16] = {1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0};
  const XXH128_hash_t ref = XXH3_128bits_withSeed(bytes, 16, seed);
  CHECK(k128.lo == ref.low64);
  CHECK(k128.hi == ref.high64);
  CHECK(k64 == XXH3_64bits_withSeed(bytes, 16, seed));
  // Seeds and domains separate.
  CHECK(relokv::xxh3_128(43).digest(std::as_bytes(std::span<const token_t>(t)),
                                    relokv::hash_domain::kTokens) != k128);
  CHECK(h128.digest(std::as_bytes(std::span<const token_t>(t)), relokv::hash_domain::kWindow) !=
        k128);
}

TEST_CASE("context keys chain, content keys restart at each span", "[hash]") {
  const relokv::xxh3_128 h(7);
  const auto sys = seq(100, 20), a = seq(200, 32), b = seq(300, 17), q = seq(400, 5);
  const auto ab = relokv::layout_builder(16).prefix(sys).span(a).span(b).question(q).build();
  const auto ba = relokv::layout_builder(16).prefix(sys).span(b).span(a).question(q).build();
  const auto kab = relokv::derive_block_keys(h, ab);
  const auto kba = relokv::derive_block_keys(h, ba);
  // blocks: sys(2) a(2) b(2) q(1)
  REQUIRE(kab.context.size() == 7);
  // The prefix is shared exactly.
  CHECK(kab.context[0] == kba.context[0]);
  CHECK(kab.context[1] == kba.context[1]);
  CHECK(kab.content[1] == kab.context[1]);
  // Span a sits at blocks 2-3 in ab and 4-5 in ba: same content keys, different context keys.
  CHECK(kab.content[2] == kba.content[4]);
  CHECK(kab.content[3] == kba.content[5]);
  CHECK(kab.context[2] != kba.context[4]);
  CHECK(kab.content[4] == kba.content[2]);
  // The question binds to everything: content == context, and it differs between orders.
  CHECK(kab.content[6] == kab.context[6]);
  CHECK(kab.content[6] != kba.content[6]);
}

TEST_CASE("content keys depend on the span's context and on the extra keys", "[hash]") {
  const relokv::xxh3_128 h(7);
  const auto a = seq(200, 16);
  const auto k1 =
      relokv::derive_block_keys(h, relokv::layout_builder(16).prefix(seq(1, 5)).span(a).build());
  const auto k2 =
      relokv::derive_block_keys(h, relokv::layout_builder(16).prefix(seq(2, 5)).span(a).build());
  CHECK(k1.content[1] != k2.content[1]);
  relokv::extra_keys tenant;
  tenant.tenant_salt = 99;
  const auto k3 = relokv::derive_block_keys(
      h, relokv::layout_builder(16).prefix(seq(1, 5)).span(a).build(), tenant);
  CHECK(k3.content[1] != k1.content[1]);
  CHECK(k3.context[0] != k1.context[0]);
  relokv::extra_keys adapter;
  adapter.adapter_id = 3;
  CHECK(relokv::derive_block_keys(h, relokv::layout_builder(16).prefix(seq(1, 5)).build(), adapter)
            .context[0] != k1.context[0]);
}

TEST_CASE("segment structure is part of the keys", "[hash]") {
  const relokv::xxh3_64 h(1);
  const auto x = seq(10, 16), y = seq(50, 16);
  // Same tokens, one as prefix+prefix vs prefix+span: block 1 keys differ.
  const auto as_prefix = relokv::layout_builder(16)
                             .prefix([&] {
                               auto v = x;
                               v.insert(v.end(), y.begin(), y.end());
                               return v;
                             }())
                             .build();
  const auto as_span = relokv::layout_builder(16).prefix(x).span(y).build();
  CHECK(relokv::derive_block_keys(h, as_prefix).context[1] !=
        relokv::derive_block_keys(h, as_span).context[1]);
}

TEST_CASE("dependent segments bind to the last n tokens only", "[hash]") {
  const relokv::xxh3_128 h(3);
  const auto q = seq(900, 8);
  const auto l1 =
      relokv::layout_builder(4).prefix(seq(1, 6)).span(seq(20, 6)).dependent(q, 2).build();
  // The last two tokens before q are {24, 25} in both requests; everything else differs.
  const auto l2 = relokv::layout_builder(4)
                      .prefix(seq(5, 6))
                      .span(std::vector<token_t>{77, 78, 24, 25})
                      .dependent(q, 2)
                      .build();
  const auto k1 = relokv::derive_block_keys(h, l1);
  const auto k2 = relokv::derive_block_keys(h, l2);
  const auto& s1 = l1.segments.back();
  const auto& s2 = l2.segments.back();
  CHECK(k1.content[static_cast<std::size_t>(s1.first_block)] ==
        k2.content[static_cast<std::size_t>(s2.first_block)]);
  CHECK(k1.context[static_cast<std::size_t>(s1.first_block)] !=
        k2.context[static_cast<std::size_t>(s2.first_block)]);
}
