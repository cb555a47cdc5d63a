#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/recompute/any_strategy.hpp>
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

TEST_CASE("cache: a context slot reused between plan and commit forges no chain", "[cache]") {
  // With a hash blind to context, prefixes PA and PB (same last block) share every key. A plans
  // [PA, D] while PA's context entry exists; that entry dies and its slot is reused for PB; B's
  // last block of D is evicted; then A commits. A's blocks of D must not be chained under B's,
  // or B's next [PB, D] is handed a block computed after PA.
  // Keys (blind_hash: the digest of the block's own tokens, 2 bits) are chosen distinct where
  // a request needs its own blocks apart: PA, PB -> 2; D's blocks -> 0, 1, 3.
  relokv::relocatable_cache<blind_hash> cache(relokv::lru_block_pool(8), 2);
  const std::vector<token_t> pa = {4, 2}, pb = {8, 2}, d = {10, 10, 10, 11, 11, 12};
  const std::vector<token_t> d_other = {20, 21}, filler = {99};
  auto layout = [](const std::vector<token_t>& prefix, const std::vector<token_t>& span) {
    return relokv::layout_builder(2).prefix(prefix).span(span).build();
  };
  auto ballast = cache.plan(relokv::layout_builder(2).prefix(seq(500, 6)).build());
  REQUIRE(ballast.ok());  // holds 3 blocks, so that the rest of the pool is exactly used

  auto r0 = cache.plan(layout(pa, d_other));  // interns PA's context entry
  REQUIRE(r0.ok());
  cache.commit(r0.id);
  cache.release(r0.id);

  auto a = cache.plan(layout(pa, d));  // PA exact; D computed; commit comes late
  REQUIRE(a.ok());
  REQUIRE(a.misses == 3);

  auto f = cache.plan(relokv::layout_builder(2).prefix(filler).build());
  REQUIRE(f.ok());  // evicts r0's span block: PA's context entry is dropped
  cache.release(f.id);
  cache.release(ballast.id);

  auto b = cache.plan(layout(pb, d));  // PB's context takes the freed slot
  REQUIRE(b.ok());
  REQUIRE(b.misses == 4);
  cache.commit(b.id);
  cache.release(b.id);
  // B's last block of D was released first, so it is the first cached block to go (PB's block
  // shares PA's key, so it was never cached and goes before it).
  REQUIRE_FALSE(cache.extend(a.id).evicted);
  const auto ev = cache.extend(a.id);
  REQUIRE(ev.evicted);
  REQUIRE(ev.block == b.blocks[3].physical);
  cache.commit(a.id);
  cache.release(a.id);  // its two private blocks are uncached: C's PB block takes one

  auto c = cache.plan(layout(pb, d));
  REQUIRE(c.ok());
  for (std::size_t bi = 0; bi < c.blocks.size(); ++bi) {
    const auto& blk = c.blocks[bi];
    INFO("block " << bi);
    for (const auto& ab : a.blocks)
      if (ab.status == block_status::kMiss) CHECK(blk.source != ab.physical);
  }
  CHECK(c.relocated_hits == 2);  // B's D0 and D1; D2 is computed again
  cache.release(c.id);
}

TEST_CASE("cache: plan rejects a hand-built layout and takes nothing", "[cache]") {
  cache_t cache(relokv::lru_block_pool(16), 16);
  auto l = rag({&kA});
  l.blocks[1].len = 40;  // above the block size: would overwrite the next block's tokens
  const auto free_before = cache.allocator().num_free();
  CHECK_THROWS_AS(cache.plan(l), relokv::layout_error);
  l = rag({&kA});
  l.blocks.back().segment = 9;
  CHECK_THROWS_AS(cache.plan(l), relokv::layout_error);
  CHECK_THROWS_AS(cache.plan(relokv::request_layout{}), relokv::layout_error);
  CHECK(cache.allocator().num_free() == free_before);
  CHECK(cache.live_requests() == 0);
  CHECK_THROWS_AS(cache_t(relokv::lru_block_pool(4), 1 << 30), relokv::error);
}

TEST_CASE("cache: a failed plan carries no id and cannot end another request", "[cache]") {
  cache_t cache(relokv::lru_block_pool(8), 16);
  relokv::reuse_plan p;
  cache.plan_into(rag({&kB}), relokv::recompute::none{}, {}, p);  // 4 blocks
  REQUIRE(p.ok());
  const relokv::request_id live = p.id;
  cache.plan_into(rag({&kA, &kB}), relokv::recompute::none{}, {}, p);  // needs 5 more
  REQUIRE_FALSE(p.ok());
  CHECK(p.id == relokv::kNoRequest);
  CHECK(p.exact_hits == 0);
  CHECK(p.misses == 0);
  CHECK_THROWS_AS(cache.release(p.id), relokv::error);
  CHECK_THROWS_AS(cache.commit(p.id), relokv::error);
  CHECK(cache.live_requests() == 1);
  cache.commit(live);
  cache.release(live);
}

TEST_CASE("cache: a hit recomputed whole is what later blocks chain to", "[cache]") {
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, relokv::at_attention,
                            relokv::recompute::any_strategy>
      cache(relokv::lru_block_pool(64), 16);
  auto run = [&](const relokv::request_layout& l, const relokv::recompute::any_strategy& s) {
    auto p = cache.plan(l, s);
    REQUIRE(p.ok());
    cache.commit(p.id);
    cache.release(p.id);
    return p;
  };
  run(rag({&kA}), relokv::recompute::none{});
  // The same span at another position: relocated, and `full` recomputes it into new blocks.
  const auto other = rag({&kB, &kA});
  const auto recomputed = run(other, relokv::recompute::full{});
  REQUIRE(recomputed.relocated_hits == 2);
  const auto again = run(other, relokv::recompute::none{});
  // Every sealed block is an exact hit (the question's open last block is computed).
  CHECK(again.exact_hits == other.num_blocks() - 1);
  CHECK(again.relocated_hits == 0);
}

TEST_CASE("cache: a hit recomputed whole does not hold its source block", "[cache]") {
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, relokv::at_attention,
                            relokv::recompute::any_strategy>
      cache(relokv::lru_block_pool(6), 16);
  const auto l = relokv::layout_builder(16).prefix(kSys).span(kA).build();  // 4 blocks
  auto p = cache.plan(l, relokv::recompute::none{});
  REQUIRE(p.ok());
  cache.commit(p.id);
  cache.release(p.id);
  // Every block hits and `full` rewrites every one: 4 new blocks, none of the 4 sources read.
  // Holding the sources as well would need 8 of the 6 blocks.
  auto f = cache.plan(l, relokv::recompute::full{});
  REQUIRE(f.ok());
  CHECK(f.exact_hits == 4);
  CHECK(cache.allocator().num_free() == 2);
  for (const auto& pb : f.blocks) CHECK(pb.fresh);
  cache.commit(f.id);
  cache.release(f.id);
  auto again = cache.plan(l, relokv::recompute::none{});
  CHECK(again.exact_hits == 4);
  cache.release(again.id);
}
