// request_kv: one request's KV in the library's words. The toy model's K and V depend on the
// token alone, so reused blocks hold exactly what a fresh computation would write: attention
// through request_kv must then equal the oracle's attention over freshly rotated keys, under
// every placement, for prefill and for decode across block boundaries.
#include <relokv/engine/request_kv.hpp>
#include <relokv/hash/xxh3.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/lru_block_pool.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "support/attention_oracle.hpp"
#include "support/catch.hpp"

namespace {

constexpr int kBlock = 16, kHq = 4, kHk = 2, kD = 64, kLayers = 2;

// Context-free K, V, Q of a token in a layer, in [-1, 1).
float toy(relokv::token_t t, int layer, int which, int i) {
  std::uint32_t x = static_cast<std::uint32_t>(t) * 2654435761u ^
                    static_cast<std::uint32_t>(layer * 7919 + which * 104729 + i * 31);
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return static_cast<float>(x % 2048) / 1024.0f - 1.0f;
}
std::vector<float> toy_vec(relokv::token_t t, int layer, int which, int n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = toy(t, layer, which, i);
  return v;
}

std::vector<relokv::token_t> run(relokv::token_t first, int n) {
  std::vector<relokv::token_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = first + i;
  return t;
}

relokv::rope_config rope_cfg() {
  relokv::rope_config c;
  c.head_dim = c.rotary_dim = kD;
  return c;
}

template <class P>
using cache_t = relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, P,
                                          relokv::recompute::any_strategy>;

// Computes the given tokens in every layer through req and checks each output row against
// the oracle over the request's tokens (all of them visible by position).
// With `geometry`, each layer's oracle takes that layer's RoPE and window.
template <class Req>
double compute_and_check(Req& req, const std::vector<relokv::token_t>& all,
                         std::span<const relokv::token_slot> slots,
                         const relokv::layer_rope* geometry = nullptr) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  double worst = 0.0;
  const auto n = static_cast<std::int32_t>(slots.size());
  for (int l = 0; l < kLayers; ++l) {
    std::vector<float> q, out(static_cast<std::size_t>(n) * kHq * kD);
    std::vector<relokv::pos_t> pos;
    for (const auto& s : slots) {
      const auto t = all[static_cast<std::size_t>(s.pos())];
      req.write(l, s, toy_vec(t, l, 1, kHk * kD).data(), toy_vec(t, l, 2, kHk * kD).data());
      const auto qt = toy_vec(t, l, 0, kHq * kD);
      q.insert(q.end(), qt.begin(), qt.end());
      pos.push_back(s.pos());
    }
    req.attend(l, q.data(), pos.data(), n, kHq, scale, out.data());
    std::vector<oracle::key_token> keys;
    for (std::size_t p = 0; p < all.size(); ++p)
      keys.push_back(
          {static_cast<int>(p), toy_vec(all[p], l, 1, kHk * kD), toy_vec(all[p], l, 2, kHk * kD)});
    for (std::int32_t i = 0; i < n; ++i) {
      const std::vector<float> qi(q.begin() + i * kHq * kD, q.begin() + (i + 1) * kHq * kD);
      const auto ref =
          oracle::attend(geometry != nullptr ? geometry->table(l).config() : rope_cfg(), keys, qi,
                         pos[static_cast<std::size_t>(i)], kHq, kHk, scale, nullptr,
                         geometry != nullptr ? geometry->window(l) : 0);
      for (int d = 0; d < kHq * kD; ++d)
        worst = std::max(worst, std::abs(ref[static_cast<std::size_t>(d)] -
                                         out[static_cast<std::size_t>(i * kHq * kD + d)]));
    }
  }
  return worst;
}

}  // namespace

TEMPLATE_TEST_CASE("request_kv: prefill and decode over relocated blocks match fresh rotation",
                   "[request]", relokv::pre_rotated, relokv::at_attention, relokv::block_relative) {
  const relokv::rope_table rope(rope_cfg(), 512);
  relokv::host_kv_storage<float> storage(relokv::kv_shape{kLayers, 64, kHk, kBlock, kD});
  cache_t<TestType> cache(relokv::lru_block_pool(64), kBlock);
  const auto sys = run(100, 20), a = run(200, 37), b = run(300, 16), qn = run(400, 9);
  {
    const auto l1 = relokv::layout_builder(kBlock).prefix(sys).span(a).span(b).question(qn).build();
    relokv::request_kv req(cache, storage, rope, l1, cache.plan(l1));
    CHECK(req.prefill_tokens().size() == l1.tokens.size());  // nothing cached yet
    CHECK(compute_and_check(req, l1.tokens, req.prefill_tokens()) < 1e-5);
    req.commit();
  }                                           // released here
  CHECK(cache.allocator().num_free() == 64);  // released: cached, evictable

  // The same documents in the other order: the spans are relocated.
  const auto l2 = relokv::layout_builder(kBlock).prefix(sys).span(b).span(a).question(qn).build();
  relokv::request_kv req(cache, storage, rope, l2, cache.plan(l2, relokv::recompute::none{}));
  CHECK(req.plan().relocated_hits > 0);
  const auto slots = req.prefill_tokens();
  // The question's blocks are missed, so the last token is computed and written.
  REQUIRE(!slots.empty());
  CHECK(slots.back().pos() == l2.num_tokens() - 1);
  CHECK(slots.back().writes());
  CHECK(static_cast<std::int32_t>(slots.size()) == req.plan().tokens_to_compute);
  for (const auto& s : slots) {
    const auto& e = *std::find_if(req.blocks().begin(), req.blocks().end(),
                                  [&](const auto& be) { return be.block == s.block(); });
    CHECK(s.pos() == e.pos0 + s.slot());
  }
  CHECK(compute_and_check(req, l2.tokens, slots) < 1e-5);

  // Decode 40 tokens: across the open block, then blocks of its own.
  auto all = l2.tokens;
  const auto blocks_before = req.blocks().size();
  for (int i = 0; i < 40; ++i) {
    const auto s = req.append_token();
    REQUIRE(s.has_value());
    CHECK(s->pos() == static_cast<relokv::pos_t>(all.size()));
    all.push_back(9000 + i);
    const relokv::token_slot one[1] = {*s};
    CHECK(compute_and_check(req, all, one) < 1e-5);
  }
  CHECK(req.blocks().size() > blocks_before);
  CHECK(req.num_tokens() == static_cast<std::int32_t>(all.size()));
}

TEMPLATE_TEST_CASE("request_kv: per-layer RoPE bases and a sliding window over relocated spans",
                   "[request][window]", relokv::pre_rotated, relokv::at_attention,
                   relokv::block_relative) {
  // Gemma 3's shape in two layers: layer 0 local (base 10,000, a window of 20 that cuts the
  // spans and their blocks), layer 1 global (base 1,000,000). pre_rotated's relocation must
  // rotate each layer by the delta in its own base.
  auto local = rope_cfg(), global = rope_cfg();
  global.theta = 1000000.0;
  const std::vector<relokv::layer_rope::layer> layers = {{local, 20}, {global, 0}};
  const relokv::layer_rope geometry(layers, 512);
  relokv::host_kv_storage<float> storage(relokv::kv_shape{kLayers, 64, kHk, kBlock, kD});
  cache_t<TestType> cache(relokv::lru_block_pool(64), kBlock);
  const auto sys = run(100, 20), a = run(200, 37), b = run(300, 16), qn = run(400, 9);
  {
    const auto l1 = relokv::layout_builder(kBlock).prefix(sys).span(a).span(b).question(qn).build();
    relokv::request_kv req(cache, storage, geometry, l1, cache.plan(l1));
    CHECK(req.window_of(0) == 20);
    CHECK(req.window_of(1) == 0);
    CHECK(compute_and_check(req, l1.tokens, req.prefill_tokens(), &geometry) < 1e-5);
    req.commit();
  }
  const auto l2 = relokv::layout_builder(kBlock).prefix(sys).span(b).span(a).question(qn).build();
  relokv::request_kv req(cache, storage, geometry, l2, cache.plan(l2, relokv::recompute::none{}));
  CHECK(req.plan().relocated_hits > 0);
  CHECK(compute_and_check(req, l2.tokens, req.prefill_tokens(), &geometry) < 1e-5);
  auto all = l2.tokens;
  for (int i = 0; i < 20; ++i) {
    const auto s = req.append_token();
    REQUIRE(s.has_value());
    all.push_back(9000 + i);
    const relokv::token_slot one[1] = {*s};
    CHECK(compute_and_check(req, all, one, &geometry) < 1e-5);
  }
  // The geometry must have the storage's layers.
  const relokv::layer_rope three(local, 3, 64);
  const auto l3 = relokv::layout_builder(kBlock).prefix(run(700, 5)).build();
  CHECK_THROWS_WITH(relokv::request_kv(cache, storage, three, l3, cache.plan(l3)),
                    Catch::Contains("3 layers of RoPE for a storage of 2 layers"));
}

TEST_CASE("request_kv: the last-token rule when the whole prompt is reused", "[request]") {
  const relokv::rope_table rope(rope_cfg(), 512);
  relokv::host_kv_storage<float> storage(relokv::kv_shape{kLayers, 32, kHk, kBlock, kD});
  cache_t<relokv::at_attention> cache(relokv::lru_block_pool(32), kBlock);
  // The question fills its last block exactly: the block is sealed and cached.
  const auto layout =
      relokv::layout_builder(kBlock).prefix(run(100, 16)).question(run(500, 16)).build();
  REQUIRE(layout.blocks.back().sealed);
  {
    relokv::request_kv req(cache, storage, rope, layout, cache.plan(layout));
    CHECK(compute_and_check(req, layout.tokens, req.prefill_tokens()) < 1e-5);
    req.commit();
  }
  relokv::request_kv req(cache, storage, rope, layout, cache.plan(layout));
  CHECK(req.plan().exact_hits == 2);
  CHECK(req.plan().tokens_to_compute == 0);
  // One token to compute, for its hidden state; not written into the shared block.
  REQUIRE(req.prefill_tokens().size() == 1);
  const auto last = req.prefill_tokens()[0];
  CHECK(last.pos() == 31);
  CHECK_FALSE(last.writes());
  const auto* k = req.layer(0).kv.k(last.block(), 0) + last.slot() * kD;
  const std::vector<float> before(k, k + kD);
  const std::vector<float> junk(kHk * kD, 42.0f);
  req.write(0, last, junk.data(), junk.data());
  CHECK(std::equal(before.begin(), before.end(), k));
  CHECK(compute_and_check(req, layout.tokens, req.prefill_tokens()) < 1e-5);
  // Decode never appends into the sealed, shared block: its token starts a new one.
  const auto s = req.append_token();
  REQUIRE(s.has_value());
  CHECK(s->slot() == 0);
  CHECK(s->block() != last.block());
}

TEST_CASE("request_kv: an exhausted pool, misuse and a plan of another layout", "[request]") {
  const relokv::rope_table rope(rope_cfg(), 512);
  relokv::host_kv_storage<float> storage(relokv::kv_shape{kLayers, 4, kHk, kBlock, kD});
  cache_t<relokv::block_relative> cache(relokv::lru_block_pool(4), kBlock);
  const auto layout =
      relokv::layout_builder(kBlock).prefix(run(100, 16)).question(run(500, 20)).build();
  const auto other = relokv::layout_builder(kBlock).prefix(run(100, 40)).build();
  {
    auto p = cache.plan(other);  // three blocks of another layout
    CHECK_THROWS_AS(relokv::request_kv(cache, storage, rope, layout, std::move(p)), relokv::error);
  }
  CHECK(cache.allocator().num_free() == 4);  // the mismatched plan was released
  {
    auto failed = cache.plan(layout);
    auto hold = cache.plan(other);  // fails: three of the four blocks are taken
    CHECK_FALSE(hold.ok());
    CHECK_THROWS_WITH(relokv::request_kv(cache, storage, rope, layout, std::move(hold)),
                      Catch::Matchers::Contains("plan failed"));
    relokv::request_kv req(cache, storage, rope, layout, std::move(failed));
    CHECK(compute_and_check(req, layout.tokens, req.prefill_tokens()) < 1e-5);
    // Decode fills the open block (12 slots), then takes the last free block, then fails.
    for (int i = 0; i < 12 + 16; ++i) REQUIRE(req.append_token().has_value());
    const auto n = req.num_tokens();
    const auto blocks = req.blocks().size();
    CHECK_FALSE(req.append_token().has_value());
    CHECK(req.num_tokens() == n);  // nothing changed
    CHECK(req.blocks().size() == blocks);
    req.commit();
    CHECK_THROWS_AS(req.commit(), relokv::error);
    req.release();
    req.release();  // idempotent
    CHECK_THROWS_AS(req.append_token(), relokv::error);
  }
  CHECK(cache.allocator().num_free() == 4);
  // Storage of another block size, a rope of another head_dim.
  relokv::host_kv_storage<float> wrong(relokv::kv_shape{kLayers, 4, kHk, 32, kD});
  CHECK_THROWS_WITH(relokv::request_kv(cache, wrong, rope, layout, cache.plan(layout)),
                    Catch::Matchers::Contains("block_size"));
  relokv::rope_config c128 = rope_cfg();
  c128.head_dim = c128.rotary_dim = 128;
  const relokv::rope_table rope128(c128, 64);
  CHECK_THROWS_WITH(relokv::request_kv(cache, storage, rope128, layout, cache.plan(layout)),
                    Catch::Matchers::Contains("head_dim"));
  CHECK(cache.allocator().num_free() == 4);
}

TEST_CASE("request_kv: layer indices are checked and only the request's own slots write",
          "[request]") {
  const relokv::rope_table rope(rope_cfg(), 512);
  relokv::host_kv_storage<float> storage(relokv::kv_shape{kLayers, 16, kHk, kBlock, kD});
  cache_t<relokv::pre_rotated> cache(relokv::lru_block_pool(16), kBlock);
  const auto shared =
      relokv::layout_builder(kBlock).prefix(run(100, 16)).question(run(500, 16)).build();
  {
    relokv::request_kv req(cache, storage, rope, shared, cache.plan(shared));
    REQUIRE(compute_and_check(req, shared.tokens, req.prefill_tokens()) < 1e-5);
    req.commit();
  }
  // A reader of the shared blocks: its one slot is the reused last token (writes nothing).
  relokv::request_kv reader(cache, storage, rope, shared, cache.plan(shared));
  REQUIRE(reader.prefill_tokens().size() == 1);
  const relokv::token_slot last = reader.prefill_tokens()[0];
  REQUIRE_FALSE(last.writes());

  const std::vector<float> k(kHk * kD, 7.0f), q(kHq * kD, 0.5f);
  std::vector<float> out(kHq * kD);
  const relokv::pos_t pos = last.pos();
  for (const std::int32_t bad : {-1, kLayers, 1 << 30}) {
    CHECK_THROWS_WITH(reader.write(bad, last, k.data(), k.data()),
                      Catch::Matchers::Contains("out of range"));
    CHECK_THROWS_WITH(reader.attend(bad, q.data(), &pos, 1, kHq, 0.125f, out.data()),
                      Catch::Matchers::Contains("out of range"));
    CHECK_THROWS_AS(reader.layer(bad), relokv::error);
  }

  // Another request's writable slot does not write into this one's blocks, and neither does a
  // default-constructed one.
  const auto other_layout = relokv::layout_builder(kBlock).prefix(run(900, 20)).build();
  relokv::request_kv other(cache, storage, rope, other_layout, cache.plan(other_layout));
  const relokv::token_slot foreign = other.prefill_tokens()[0];
  REQUIRE(foreign.writes());
  CHECK_THROWS_WITH(reader.write(0, foreign, k.data(), k.data()),
                    Catch::Matchers::Contains("not made by this live request"));
  CHECK_THROWS_AS(reader.write(0, relokv::token_slot{}, k.data(), k.data()), relokv::error);
  // The shared block still holds what the first request wrote.
  const auto* kept = reader.layer(0).kv.k(last.block(), 0) + last.slot() * kD;
  CHECK(std::none_of(kept, kept + kD, [](float x) { return x == 7.0f; }));
  CHECK(compute_and_check(reader, shared.tokens, reader.prefill_tokens()) < 1e-5);
}

TEST_CASE("request_kv: slot_at names every position as prefill_tokens and append_token do",
          "[request]") {
  const relokv::rope_table rope(rope_cfg(), 512);
  relokv::host_kv_storage<float> storage(relokv::kv_shape{kLayers, 16, kHk, kBlock, kD});
  cache_t<relokv::block_relative> cache(relokv::lru_block_pool(16), kBlock);
  const std::vector<relokv::token_t> span = run(300, 20);
  {  // the span cached on its own
    const auto warm = relokv::layout_builder(kBlock).prefix(run(100, 16)).span(span).build();
    relokv::request_kv req(cache, storage, rope, warm, cache.plan(warm));
    REQUIRE(compute_and_check(req, warm.tokens, req.prefill_tokens()) < 1e-5);
    req.commit();
  }
  // The span relocated behind another prefix: its blocks are reused, the rest computed.
  const auto layout = relokv::layout_builder(kBlock)
                          .prefix(run(100, 16))
                          .span(run(700, 12))
                          .span(span)
                          .question(run(500, 5))
                          .build();
  relokv::request_kv req(cache, storage, rope, layout, cache.plan(layout));
  REQUIRE(req.plan().relocated_hits > 0);
  const auto n = static_cast<relokv::pos_t>(layout.tokens.size());
  std::size_t computed = 0;
  for (relokv::pos_t p = 0; p < n; ++p) {
    const relokv::token_slot s = req.slot_at(p);
    CHECK(s.pos() == p);
    // the block the table maps the position to, the slot from its first position
    const auto e = std::find_if(req.blocks().begin(), req.blocks().end(),
                                [&](const auto& b) { return b.pos0 <= p && p < b.pos0 + b.len; });
    REQUIRE(e != req.blocks().end());
    CHECK(s.block() == e->block);
    CHECK(s.slot() == p - e->pos0);
    CHECK(s.writes() == static_cast<bool>(req.plan().compute[static_cast<std::size_t>(p)]));
    computed += s.writes();
  }
  CHECK(computed == static_cast<std::size_t>(req.plan().tokens_to_compute));
  // The prefill tokens are the computing positions' slots, exactly.
  for (const relokv::token_slot& t : req.prefill_tokens())
    if (t.writes()) CHECK(req.slot_at(t.pos()) == t);
  CHECK(compute_and_check(req, layout.tokens, req.prefill_tokens()) < 1e-5);
  // Decode: the appended token's slot is the one append_token gave, and writes.
  const auto a = req.append_token();
  REQUIRE(a.has_value());
  CHECK(req.slot_at(n) == *a);
  CHECK(a->writes());
  for (const relokv::pos_t bad : {-1, n + 1, 1 << 30})
    CHECK_THROWS_WITH((void)req.slot_at(bad), Catch::Matchers::Contains("outside"));

  // attention(l) is attend()'s call: the same output bit for bit through paged_attention.
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  const auto q = toy_vec(7, 1, 0, kHq * kD);
  const relokv::pos_t qp = n - 1;
  std::vector<float> by_attend(kHq * kD), by_call(kHq * kD);
  req.attend(1, q.data(), &qp, 1, kHq, scale, by_attend.data());
  relokv::attention_params<float> p = req.attention(1);
  CHECK(p.rope == &req.rope_of(1));
  CHECK(p.table.indptr[1] == static_cast<std::int32_t>(req.blocks().size()));
  p.q = q.data();
  p.q_pos = &qp;
  p.num_tokens = 1;
  p.num_q_heads = kHq;
  p.scale = scale;
  p.out = by_call.data();
  relokv::paged_attention<relokv::block_relative>(p);
  CHECK(by_call == by_attend);
  CHECK_THROWS_WITH((void)req.attention(kLayers), Catch::Matchers::Contains("out of range"));
  req.release();
  CHECK_THROWS_WITH((void)req.slot_at(0), Catch::Matchers::Contains("released"));
}
