// Sink-absorbing compiles (EPIC's LegoLink-0, MEPIC): a span cached behind a few neutral
// tokens (the absorber) is reused by any request that names the absorber as its span_context,
// whatever its own prefix; the keys, the context check and the provenance bind to the absorber.
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/hash/block_keys.hpp>
#include <relokv/layout/builder.hpp>

#include <vector>

#include "support/catch.hpp"
#include "support/test_data.hpp"

using relokv::block_status;
using relokv::token_t;

namespace {

std::vector<token_t> seq(token_t first, int n) { return relokv_test::iota_tokens(first, n); }
const auto kAbsorber = seq(7000, 4);
const auto kOtherAbsorber = seq(7100, 4);
const auto kSysA = seq(1000, 20);
const auto kSysB = seq(5000, 24);
const auto kDoc = seq(2000, 32);  // two blocks
const auto kQ = seq(4000, 5);

using cache_t = relokv::relocatable_cache<>;

relokv::reuse_plan serve(cache_t& c, const relokv::request_layout& l, std::uint64_t principal = 0) {
  auto p = c.plan(l, {}, principal);
  REQUIRE(p.ok());
  c.commit(p.id);
  c.release(p.id);
  return p;
}
/// A request of prefix `sys` reading kDoc, its spans computed behind `ctx` (none: the prefix).
relokv::request_layout reader(const std::vector<token_t>& sys, const std::vector<token_t>* ctx) {
  relokv::layout_builder b(16);
  b.prefix(sys);
  if (ctx) b.span_context(*ctx);
  return b.span(kDoc).question(kQ).build();
}
/// kDoc's two blocks: after a prefix of 2 blocks (20 or 24 tokens).
std::vector<block_status> doc_status(const relokv::reuse_plan& p) {
  return {p.blocks[2].status, p.blocks[3].status};
}
const std::vector<block_status> kRelocated{block_status::kRelocatedHit,
                                           block_status::kRelocatedHit};
const std::vector<block_status> kMissed{block_status::kMiss, block_status::kMiss};

}  // namespace

TEST_CASE("span_context: a span compiled behind an absorber serves every prefix that names it",
          "[cache][span_context]") {
  cache_t c(relokv::lru_block_pool(64), 16);
  const auto compiled = serve(c, relokv::layout_builder(16).prefix(kAbsorber).span(kDoc).build());
  // The compile is canonical: the span starts right after its context.
  CHECK(c.origin_of(compiled.blocks[1].physical).canonical);
  CHECK(c.origin_of(compiled.blocks[2].physical).canonical);

  // Same keys: the span's content keys bind to the absorber, not to the reader's prefix.
  const relokv::xxh3_128 h;
  const auto kc = relokv::derive_block_keys(
      h, relokv::layout_builder(16).prefix(kAbsorber).span(kDoc).build(), {});
  const auto kr = relokv::derive_block_keys(h, reader(kSysA, &kAbsorber), {});
  CHECK(kr.content[2] == kc.content[1]);
  CHECK(kr.content[3] == kc.content[2]);

  SECTION("two different prefixes reuse the one compile") {
    CHECK(doc_status(serve(c, reader(kSysA, &kAbsorber), 1)) == kRelocated);
    CHECK(doc_status(serve(c, reader(kSysB, &kAbsorber), 2)) == kRelocated);
    CHECK(c.stats().provenance_denied == 0);
  }
  SECTION("without span_context the span binds to the prefix: not found") {
    CHECK(doc_status(serve(c, reader(kSysA, nullptr))) == kMissed);
  }
  SECTION("another absorber: not found") {
    CHECK(doc_status(serve(c, reader(kSysA, &kOtherAbsorber))) == kMissed);
  }
}

TEST_CASE(
    "span_context: a span computed behind other tokens of the absorber's length is not "
    "canonical",
    "[cache][span_context]") {
  // The reader's prefix has the absorber's length, so its span starts where a canonical one
  // would; but it was computed behind kSysA's 4 tokens, not the absorber: the default policy
  // must not serve it to another principal as if it were.
  cache_t c(relokv::lru_block_pool(64), 16);
  const auto same_length = seq(1000, 4);
  const auto l = relokv::layout_builder(16)
                     .prefix(same_length)
                     .span_context(kAbsorber)
                     .span(kDoc)
                     .question(kQ)
                     .build();
  const auto p = serve(c, l, 1);
  REQUIRE(p.blocks[1].status == block_status::kMiss);
  CHECK_FALSE(c.origin_of(p.blocks[1].physical).canonical);
  const auto other = serve(c, reader(kSysA, &kAbsorber), 2);
  CHECK(doc_status(other) == kMissed);
  CHECK(c.stats().provenance_denied == 2);
}

TEST_CASE("span_context: tokens are checked like the request's", "[cache][span_context][layout]") {
  CHECK_THROWS_AS(relokv::layout_builder(16, 100)
                      .prefix(seq(1, 4))
                      .span_context(seq(98, 4))
                      .span(seq(1, 8))
                      .build(),
                  relokv::layout_error);
  auto l = reader(kSysA, &kAbsorber);
  (*l.span_context)[2] = -3;
  cache_t c(relokv::lru_block_pool(64), 16);
  CHECK_THROWS_WITH(c.plan(l, relokv::recompute::none{}), Catch::Contains("span_context[2] = -3"));
  // An empty span_context: spans computed at position 0, nothing before them.
  const std::vector<token_t> none;
  serve(c, relokv::layout_builder(16).span(kDoc).build());
  CHECK(doc_status(serve(c, reader(kSysA, &none))) == kRelocated);
}
