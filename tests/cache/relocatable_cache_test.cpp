#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/recompute/full.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <vector>

#include "support/catch.hpp"
#include "support/test_data.hpp"
#include "support/weak_hash.hpp"

using relokv::block_status;
using relokv::token_t;

namespace {
std::vector<token_t> seq(token_t first, int n) { return relokv_test::iota_tokens(first, n); }
using cache_t = relokv::relocatable_cache<>;
const auto kSys = seq(1000, 20);
const auto kA = seq(2000, 32);
const auto kB = seq(3000, 20);
const auto kQ = seq(4000, 5);

relokv::request_layout rag(std::initializer_list<const std::vector<token_t>*> docs,
                           const std::vector<token_t>& sys = kSys) {
  relokv::layout_builder b(16);
  b.prefix(sys);
  for (const auto* d : docs) b.span(*d);
  return b.question(kQ).build();
}
}  // namespace

TEST_CASE("cache: a repeated request is an exact hit, a reordered one relocates", "[cache]") {
  cache_t cache(relokv::lru_block_pool(64), 16);
  const auto l1 = rag({&kA, &kB});  // sys(2) A(2) B(2) Q(1)
  auto p1 = cache.plan(l1);
  REQUIRE(p1.ok());
  CHECK(p1.misses == 7);
  CHECK(p1.tokens_to_compute == l1.num_tokens());
  cache.commit(p1.id);
  cache.release(p1.id);

  auto p2 = cache.plan(l1);
  CHECK(p2.exact_hits == 6);  // the question block is the request's open last block
  CHECK(p2.misses == 1);
  CHECK(p2.tokens_to_compute == 5);
  for (int b = 0; b < 6; ++b)
    CHECK(p2.blocks[static_cast<std::size_t>(b)].physical ==
          p1.blocks[static_cast<std::size_t>(b)].physical);
  cache.release(p2.id);

  const auto l3 = rag({&kB, &kA});  // sys(2) B(2) A(2) Q(1)
  auto p3 = cache.plan(l3);
  CHECK(p3.exact_hits == 2);
  CHECK(p3.relocated_hits == 4);
  // B now sits at blocks 2-3 and reads the blocks computed at 4-5, at new positions.
  CHECK(p3.blocks[2].physical == p1.blocks[4].physical);
  CHECK(p3.blocks[2].pos0 == 20);
  CHECK(p1.blocks[4].pos0 == 52);
  CHECK(p3.blocks[4].physical == p1.blocks[2].physical);
  CHECK(p3.copies.empty());  // at_attention relocates without touching a key
  cache.release(p3.id);
}

TEST_CASE("cache: a span computed in another context is not relocated", "[cache]") {
  cache_t cache(relokv::lru_block_pool(64), 16);
  auto p1 = cache.plan(rag({&kA}));
  cache.commit(p1.id);
  auto p2 = cache.plan(rag({&kA}, seq(5000, 20)));  // other system prompt
  CHECK(p2.relocated_hits == 0);
  CHECK(p2.exact_hits == 0);
  cache.release(p1.id);
  cache.release(p2.id);
}

TEST_CASE("cache: one physical block serves concurrent requests at different positions",
          "[cache]") {
  cache_t cache(relokv::lru_block_pool(64), 16);
  auto seed = cache.plan(rag({&kA}));
  cache.commit(seed.id);
  cache.release(seed.id);
  auto p1 = cache.plan(rag({&kA, &kB}));
  auto p2 = cache.plan(rag({&kB, &kA}));
  const auto a0 = seed.blocks[2].physical;
  CHECK(p1.blocks[2].physical == a0);
  CHECK(p2.blocks[4].physical == a0);
  CHECK(p1.blocks[2].pos0 != p2.blocks[4].pos0);
  CHECK(cache.allocator().ref_count(a0) == 2);
  cache.release(p1.id);
  cache.release(p2.id);
  CHECK(cache.allocator().ref_count(a0) == 0);
  CHECK(cache.allocator().is_cached(a0));
}

TEST_CASE("cache: tenants with different salts never share a block", "[cache]") {
  cache_t cache(relokv::lru_block_pool(64), 16);
  relokv::extra_keys t1, t2;
  t1.tenant_salt = 1;
  t2.tenant_salt = 2;
  auto p1 = cache.plan(rag({&kA}), t1);
  cache.commit(p1.id);
  cache.release(p1.id);
  auto p2 = cache.plan(rag({&kA}), t2);
  CHECK(p2.exact_hits == 0);
  CHECK(p2.relocated_hits == 0);
  cache.release(p2.id);
  auto p3 = cache.plan(rag({&kA}), t1);
  CHECK(p3.exact_hits == 4);
  cache.release(p3.id);
}

TEST_CASE("cache: a colliding hash never hands back a wrong block", "[cache]") {
  relokv::relocatable_cache<weak_hash> cache(relokv::lru_block_pool(256), 16);
  // Many different requests: with 2-bit keys nearly every lookup finds a candidate.
  std::vector<std::vector<token_t>> docs;
  for (int d = 0; d < 12; ++d) docs.push_back(seq(100 * (d + 1), 16 + d));
  for (int r = 0; r < 40; ++r) {
    relokv::layout_builder b(16);
    b.prefix(seq(r % 3, 10));
    for (int k = 0; k < 3; ++k) b.span(docs[static_cast<std::size_t>((r * 7 + k * 5) % 12)]);
    const auto l = b.question(kQ).build();
    auto p = cache.plan(l);
    REQUIRE(p.ok());
    for (std::size_t bi = 0; bi < p.blocks.size(); ++bi) {
      const auto& pb = p.blocks[bi];
      if (pb.status == block_status::kMiss) continue;
      const auto want = l.block_tokens(static_cast<std::int32_t>(bi));
      const auto got = cache.tokens_of(pb.physical);
      REQUIRE(std::vector<token_t>(want.begin(), want.end()) ==
              std::vector<token_t>(got.begin(), got.end()));
      if (pb.status == block_status::kExactHit && bi > 0)
        REQUIRE(p.blocks[bi - 1].status == block_status::kExactHit);
    }
    cache.commit(p.id);
    cache.release(p.id);
  }
  // The weak hash still lets some identical requests hit (correctness, not hit rate, is the
  // point; but the path is exercised).
  CHECK(cache.stats().exact_hits + cache.stats().relocated_hits > 0);
}

TEST_CASE("cache: running out of blocks is a status and takes nothing", "[cache]") {
  cache_t cache(relokv::lru_block_pool(8), 16);
  auto p1 = cache.plan(rag({&kA, &kB}));  // 7 blocks
  REQUIRE(p1.ok());
  const auto free_before = cache.allocator().num_free();
  auto p2 = cache.plan(rag({&kB, &kA}, seq(7000, 20)));
  CHECK(p2.status == relokv::plan_status::kOutOfBlocks);
  CHECK(p2.blocks_short == 6);
  CHECK(cache.allocator().num_free() == free_before);
  CHECK(cache.live_requests() == 1);
  CHECK(cache.stats().out_of_blocks == 1);
  cache.commit(p1.id);
  cache.release(p1.id);
  auto p3 = cache.plan(rag({&kB, &kA}, seq(7000, 20)));  // now fits by evicting
  CHECK(p3.ok());
  CHECK(cache.stats().evictions > 0);
  cache.release(p3.id);
}

TEST_CASE("cache: protocol misuse is a clear error", "[cache]") {
  cache_t cache(relokv::lru_block_pool(8), 16);
  CHECK_THROWS_AS(cache.release(99), relokv::error);
  CHECK_THROWS_AS(cache.commit(99), relokv::error);
  auto p = cache.plan(rag({&kA}));
  cache.commit(p.id);
  CHECK_THROWS_AS(cache.commit(p.id), relokv::error);
  cache.release(p.id);
  CHECK_THROWS_AS(cache.release(p.id), relokv::error);
  CHECK_THROWS_AS(cache.plan(relokv::layout_builder(8).prefix(kA).build()), relokv::error);
  CHECK_THROWS_AS(cache_t(relokv::lru_block_pool(8), 12), relokv::error);
}

TEST_CASE("cache: the full strategy recomputes everything and shares nothing it writes",
          "[cache]") {
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, relokv::at_attention,
                            relokv::recompute::full>
      cache(relokv::lru_block_pool(64), 16);
  auto p1 = cache.plan(rag({&kA}));
  cache.commit(p1.id);
  cache.release(p1.id);
  auto p2 = cache.plan(rag({&kA}));
  CHECK(p2.exact_hits == 4);                               // found...
  CHECK(p2.tokens_to_compute == rag({&kA}).num_tokens());  // ...and recomputed anyway
  for (std::size_t b = 0; b < p2.blocks.size(); ++b) {
    CHECK(p2.blocks[b].fresh);
    CHECK(p2.blocks[b].physical != p1.blocks[b].physical);  // never writes a shared block
  }
  CHECK(p2.copies.empty());
  cache.release(p2.id);
}

TEST_CASE("cache: pre_rotated relocation copies and rotates, exact hits do not", "[cache]") {
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, relokv::pre_rotated> cache(
      relokv::lru_block_pool(64), 16);
  auto p1 = cache.plan(rag({&kA, &kB}));
  cache.commit(p1.id);
  cache.release(p1.id);
  auto p2 = cache.plan(rag({&kB, &kA}));
  CHECK(p2.relocated_hits == 4);
  REQUIRE(p2.copies.size() == 4);
  for (const auto& c : p2.copies) {
    CHECK(c.rotates());
    CHECK(c.dst != c.src);
  }
  CHECK(p2.copies[0].src == p1.blocks[4].physical);
  CHECK(p2.copies[0].src_pos0 == 52);
  CHECK(p2.copies[0].dst_pos0 == 20);
  cache.release(p2.id);
  auto p3 = cache.plan(rag({&kA, &kB}));
  CHECK(p3.copies.empty());
  cache.release(p3.id);
}

TEST_CASE("cache: the same span twice in one request", "[cache]") {
  cache_t cache(relokv::lru_block_pool(64), 16);
  auto p0 = cache.plan(rag({&kA}));
  cache.commit(p0.id);
  cache.release(p0.id);
  auto p = cache.plan(rag({&kA, &kA}));
  CHECK(p.blocks[2].physical == p.blocks[4].physical);
  CHECK(cache.allocator().ref_count(p.blocks[2].physical) == 2);
  cache.release(p.id);
  CHECK(cache.allocator().ref_count(p0.blocks[2].physical) == 0);
}
