// Span links (layout_builder::links): the learned rows' ids, where they go, and the adapter's
// identity in every key, so that a span compiled under one adapter is never served under another
// or under none.
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/hash/block_keys.hpp>
#include <relokv/layout/builder.hpp>

#include <vector>

#include "support/catch.hpp"
#include "support/test_data.hpp"

using relokv::block_status;
using relokv::token_t;

namespace {

constexpr std::int64_t kVocab = 10000;
std::vector<token_t> seq(token_t first, int n) { return relokv_test::iota_tokens(first, n); }
const auto kSys = seq(1000, 16);
const auto kDoc = seq(2000, 32);  // two blocks
const auto kQ = seq(4000, 5);
const relokv::link_rows kA{0xA11CE, static_cast<token_t>(kVocab), 0, 4, 0};
const relokv::link_rows kB{0xB0B, static_cast<token_t>(kVocab), 0, 4, 0};
const relokv::link_rows kHeaded{0xA11CE, static_cast<token_t>(kVocab), 2, 3, 0};

using cache_t = relokv::relocatable_cache<>;

relokv::request_layout compile(const relokv::link_rows* r) {
  relokv::layout_builder b(16, kVocab);
  if (r) b.links(*r);
  return b.prefix(kSys).span(kDoc).build();
}
relokv::request_layout reader(const relokv::link_rows* r) {
  relokv::layout_builder b(16, kVocab);
  if (r) b.links(*r);
  return b.prefix(kSys).span(seq(3000, 16)).span(kDoc).question(kQ).build();
}
relokv::reuse_plan serve(cache_t& c, const relokv::request_layout& l,
                         const relokv::extra_keys& x = {}) {
  auto p = c.plan(l, x);
  REQUIRE(p.ok());
  c.commit(p.id);
  c.release(p.id);
  return p;
}
/// kDoc's two blocks in reader(): after the prefix (1 block) and the first span (1 block).
std::vector<block_status> doc(const relokv::reuse_plan& p) {
  return {p.blocks[2].status, p.blocks[3].status};
}
const std::vector<block_status> kRelocated{block_status::kRelocatedHit,
                                           block_status::kRelocatedHit};
const std::vector<block_status> kMissed{block_status::kMiss, block_status::kMiss};

}  // namespace

TEST_CASE("links: link rows open the question, header rows every span, ids past the vocabulary",
          "[layout][links]") {
  const auto l = relokv::layout_builder(16, kVocab)
                     .links(kHeaded)
                     .prefix(kSys)
                     .span(kDoc)
                     .question(kQ)
                     .build();
  CHECK(l.adapter_id == kHeaded.adapter_id);
  REQUIRE(l.segments.size() == 3);
  // The span: its 2 header rows (ids vocab, vocab+1), then its tokens.
  const auto& s = l.segments[1];
  CHECK(s.num_tokens == 2 + 32);
  CHECK(l.tokens[16] == kVocab);
  CHECK(l.tokens[17] == kVocab + 1);
  CHECK(l.tokens[18] == 2000);
  // The question: the 3 link rows after the header's ids, then the question, positions
  // contiguous (padding consumes none).
  const auto& q = l.segments[2];
  CHECK(q.kind == relokv::segment_kind::kDependent);
  CHECK(q.first_token == 16 + 34);
  CHECK(q.num_tokens == 3 + 5);
  for (int i = 0; i < 3; ++i)
    CHECK(l.tokens[static_cast<std::size_t>(q.first_token + i)] == kVocab + 2 + i);
  CHECK(l.tokens[static_cast<std::size_t>(q.first_token + 3)] == 4000);
  relokv::check_layout(l);
}

TEST_CASE("links: the caller's tokens stay within the vocabulary; bad rows are refused",
          "[layout][links]") {
  CHECK_THROWS_AS(relokv::layout_builder(16, kVocab)
                      .links(kA)
                      .prefix(kSys)
                      .span(seq(static_cast<token_t>(kVocab), 4))  // a link id, passed as text
                      .build(),
                  relokv::layout_error);
  relokv::layout_builder b(16, kVocab);
  CHECK_THROWS_AS(b.links({0, 100, 0, 4}), relokv::layout_error);   // no identity
  CHECK_THROWS_AS(b.links({1, 100, -1, 4}), relokv::layout_error);  // negative count
  CHECK_THROWS_AS(b.links({1, std::numeric_limits<token_t>::max(), 0, 4}), relokv::layout_error);
  // Without links a layout has no adapter.
  CHECK(reader(nullptr).adapter_id == 0);
}

TEST_CASE("links: spans compiled under one adapter are never served under another or none",
          "[cache][links]") {
  cache_t c(relokv::lru_block_pool(128), 16);
  serve(c, compile(&kA));
  SECTION("the same adapter relocates them") { CHECK(doc(serve(c, reader(&kA))) == kRelocated); }
  SECTION("another adapter misses") { CHECK(doc(serve(c, reader(&kB))) == kMissed); }
  SECTION("no adapter misses") { CHECK(doc(serve(c, reader(nullptr))) == kMissed); }
  SECTION("and spans compiled under none are not served to the adapter") {
    cache_t d(relokv::lru_block_pool(128), 16);
    serve(d, compile(nullptr));
    CHECK(doc(serve(d, reader(&kA))) == kMissed);
    CHECK(doc(serve(d, reader(nullptr))) == kRelocated);
  }
  SECTION("the keys differ from the first block on") {
    const relokv::xxh3_128 h;
    const auto ka = relokv::derive_block_keys(h, compile(&kA), {.adapter_id = kA.adapter_id});
    const auto kb = relokv::derive_block_keys(h, compile(&kB), {.adapter_id = kB.adapter_id});
    for (std::size_t i = 0; i < ka.content.size(); ++i) {
      CHECK_FALSE(ka.content[i] == kb.content[i]);
      CHECK_FALSE(ka.context[i] == kb.context[i]);
    }
  }
}

TEST_CASE("links: the link rows are computed in every request; a contrary adapter key is refused",
          "[cache][links]") {
  cache_t c(relokv::lru_block_pool(128), 16);
  serve(c, compile(&kA));
  const auto p = serve(c, reader(&kA));
  // The question's block (link rows and question) is computed: it counts as work.
  CHECK(p.blocks.back().status == block_status::kMiss);
  CHECK(p.tokens_to_compute >= kA.before_question + static_cast<std::int32_t>(kQ.size()));
  // A caller that names another adapter in its extra keys than the layout's: an error, nothing
  // taken.
  const auto free_before = c.allocator().num_free();
  CHECK_THROWS_AS((void)c.plan(reader(&kA), relokv::extra_keys{.adapter_id = kB.adapter_id}),
                  relokv::error);
  CHECK(c.allocator().num_free() == free_before);
  // Naming the same one is fine.
  CHECK(doc(serve(c, reader(&kA), {.adapter_id = kA.adapter_id})) == kRelocated);
}
