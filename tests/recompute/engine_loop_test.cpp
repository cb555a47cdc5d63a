// End to end with a toy one-layer "model" whose K/V depend on context: the reuse plan, copies
// on write, the strategy's mask and host attention together.
#include <relokv/attention/host_attention.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/deviation.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "support/catch.hpp"
#include "support/test_data.hpp"

using relokv::token_t;

namespace {

constexpr int kDim = 32, kBlock = 8;

// Token embedding: deterministic, id-dependent.
void embed(token_t t, float* out) {
  for (int d = 0; d < kDim; ++d) out[d] = std::sin(0.37f * static_cast<float>(t) + 0.11f * d);
}
// K/V of position i given the tokens before it: the context-dependent part is what reuse at
// another position gets wrong, and what recompute repairs.
void toy_kv(const std::vector<token_t>& ctx, int i, float* k, float* v) {
  float e[kDim], mean[kDim] = {};
  for (int j = 0; j < i; ++j) {
    embed(ctx[static_cast<std::size_t>(j)], e);
    for (int d = 0; d < kDim; ++d) mean[d] += e[d] / static_cast<float>(i);
  }
  embed(ctx[static_cast<std::size_t>(i)], e);
  for (int d = 0; d < kDim; ++d) {
    k[d] = e[d] + 0.8f * mean[d];
    v[d] = 0.5f * e[d] - mean[d];
  }
}

struct toy_engine {
  relokv::rope_config cfg = [] {
    relokv::rope_config c;
    c.head_dim = c.rotary_dim = kDim;
    return c;
  }();
  relokv::rope_table rope{cfg, 1024};
  relokv::host_kv_storage<float> pool{relokv::kv_shape{1, 64, 1, kBlock, kDim}};
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, relokv::at_attention,
                            relokv::recompute::any_strategy>
      cache{relokv::lru_block_pool(64), kBlock};

  /// Prefill: copies, then the masked tokens; returns the plan (not released).
  /// `kv(pos, k, v)` gives the K/V a computed token gets (default: toy_kv in this request).
  relokv::reuse_plan prefill(const relokv::request_layout& l,
                             const relokv::recompute::any_strategy& s,
                             const std::function<void(int, float*, float*)>& kv = {}) {
    auto plan = cache.plan(l, s);
    REQUIRE(plan.ok());
    relokv::apply_copies<relokv::at_attention>(rope, pool, plan.copies);
    for (std::size_t b = 0; b < plan.blocks.size(); ++b) {
      const auto& pb = plan.blocks[b];
      for (int j = 0; j < pb.len; ++j) {
        const int pos = pb.pos0 + j;
        if (!plan.compute[static_cast<std::size_t>(pos)]) continue;
        float k[kDim], v[kDim];
        if (kv)
          kv(pos, k, v);
        else
          toy_kv(l.tokens, pos, k, v);
        relokv::append_kv<relokv::at_attention>(rope, pool.layer(0), pb.physical, j, pos, k, v);
      }
    }
    return plan;
  }
  /// Attention output of a query at the last position over the plan's blocks.
  std::vector<float> attend(const relokv::reuse_plan& plan, const relokv::request_layout& l) {
    const auto table = plan.block_table();
    const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(table.size())};
    std::vector<float> q(kDim), out(kDim);
    embed(777, q.data());
    const relokv::pos_t m = l.num_tokens() - 1;
    relokv::decode_attention<relokv::at_attention>(
        rope, relokv::paged_kv_view<const float>(pool.layer(0)), {table.data(), indptr, 1},
        q.data(), &m, 1, 0.2f, out.data());
    return out;
  }
};

std::vector<token_t> seq(int n, token_t first) { return relokv_test::iota_tokens(first, n); }
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

const auto kSys = seq(10, 1), kA = seq(20, 100), kB = seq(13, 200), kQ = seq(6, 300);

relokv::request_layout req(const std::vector<token_t>& x, const std::vector<token_t>& y) {
  return relokv::layout_builder(kBlock).prefix(kSys).span(x).span(y).question(kQ).build();
}

}  // namespace

TEST_CASE("engine loop: full equals no caching, none computes only new tokens", "[recompute]") {
  toy_engine eng;
  // Cache A and B in the order A B.
  auto p0 = eng.prefill(req(kA, kB), relokv::recompute::none{});
  eng.cache.commit(p0.id);
  eng.cache.release(p0.id);

  const auto l = req(kB, kA);  // the same passages, reordered
  // Reference: a separate engine with nothing cached.
  toy_engine ref;
  auto pr = ref.prefill(l, relokv::recompute::full{});
  CHECK(pr.tokens_to_compute == l.num_tokens());
  const auto want = ref.attend(pr, l);

  auto pfull = eng.prefill(l, relokv::recompute::full{});
  CHECK(pfull.tokens_to_compute == l.num_tokens());
  CHECK(max_diff(eng.attend(pfull, l), want) < 1e-6);
  eng.cache.release(pfull.id);

  auto pnone = eng.prefill(l, relokv::recompute::none{});
  CHECK(pnone.relocated_hits > 0);
  CHECK(pnone.tokens_to_compute == static_cast<int>(kQ.size()));
  const double err_none = max_diff(eng.attend(pnone, l), want);
  CHECK(err_none > 1e-4);  // stale context in the relocated spans

  // EPIC: exactly the first 8 tokens of each relocated span, and the question, are computed;
  // attention over the result is closer to full recompute than naive reuse.
  auto pk = eng.prefill(l, relokv::recompute::first_k(8));
  CHECK(pk.tokens_to_compute == static_cast<int>(kQ.size()) + 8 + 8);
  std::vector<std::uint8_t> want_mask(static_cast<std::size_t>(l.num_tokens()), 0);
  for (const auto& seg : l.segments) {
    const int n = seg.kind == relokv::segment_kind::kSpan     ? std::min(8, seg.num_tokens)
                  : seg.kind == relokv::segment_kind::kPrefix ? 0
                                                              : seg.num_tokens;
    for (int i = 0; i < n; ++i) want_mask[static_cast<std::size_t>(seg.first_token + i)] = 1;
  }
  CHECK(pk.compute == want_mask);
  // What attention over that plan must give: the recomputed tokens' K/V from this context,
  // every other span token's from the context it was cached in (A B), computed here from
  // scratch in a separate engine.
  const auto l0 = req(kA, kB);
  const auto cached_pos = [&](int pos) {
    for (const auto& seg : l.segments) {
      if (seg.kind != relokv::segment_kind::kSpan || pos < seg.first_token ||
          pos >= seg.first_token + seg.num_tokens)
        continue;
      for (const auto& s0 : l0.segments)
        if (s0.kind == relokv::segment_kind::kSpan && s0.num_tokens == seg.num_tokens &&
            std::equal(l0.tokens.begin() + s0.first_token,
                       l0.tokens.begin() + s0.first_token + s0.num_tokens,
                       l.tokens.begin() + seg.first_token))
          return s0.first_token + (pos - seg.first_token);
    }
    return -1;
  };
  toy_engine mixed;
  auto pm = mixed.prefill(l, relokv::recompute::full{}, [&](int pos, float* k, float* v) {
    const int src = cached_pos(pos);
    if (src >= 0 && !want_mask[static_cast<std::size_t>(pos)])
      toy_kv(l0.tokens, src, k, v);  // reused as cached
    else
      toy_kv(l.tokens, pos, k, v);  // recomputed here (or the exact prefix and the question)
  });
  const auto got = eng.attend(pk, l);
  CHECK(max_diff(got, mixed.attend(pm, l)) < 1e-6);
  // ... which is neither full recompute nor naive reuse.
  CHECK(max_diff(got, want) > 1e-4);
  CHECK(max_diff(got, eng.attend(pnone, l)) > 1e-4);
  eng.cache.release(pk.id);
  eng.cache.release(pnone.id);

  // k = 32 covers both spans (20 and 13 tokens) whole: as exact as full, from copies.
  auto pall = eng.prefill(l, relokv::recompute::first_k(32));
  CHECK(pall.tokens_to_compute == l.num_tokens() - static_cast<int>(kSys.size()));
  CHECK(max_diff(eng.attend(pall, l), want) < 1e-6);
  eng.cache.release(pall.id);
}

TEST_CASE("engine loop: concurrent strategies never see each other's recomputed tokens",
          "[recompute]") {
  toy_engine eng;
  auto p0 = eng.prefill(req(kA, kB), relokv::recompute::none{});
  eng.cache.commit(p0.id);
  eng.cache.release(p0.id);
  const auto l = req(kB, kA);
  const auto shared_b = p0.blocks[5].physical;  // B's first block (sys: 2 blocks, A: 3 blocks)
  std::vector<float> before(
      eng.pool.data() + static_cast<std::size_t>(shared_b) * eng.pool.shape().block_elems(),
      eng.pool.data() + static_cast<std::size_t>(shared_b + 1) * eng.pool.shape().block_elems());

  auto pk = eng.prefill(l, relokv::recompute::first_k(4));  // writes into copies
  auto pn = eng.prefill(l, relokv::recompute::none{});      // reads the shared blocks
  auto pd = eng.prefill(l, relokv::recompute::deviation_topk(0.2f));
  REQUIRE(!pk.copies.empty());
  CHECK(pk.blocks[2].physical != shared_b);  // first_k got a private copy of B's first block
  CHECK(pk.blocks[2].copy_on_write);
  CHECK(pn.blocks[2].physical == shared_b);  // none reads the shared one
  CHECK(pd.blocks[2].copy_on_write);         // the dynamic strategy measures on copies
  CHECK(pd.blocks[2].physical != shared_b);
  const std::vector<float> after(
      eng.pool.data() + static_cast<std::size_t>(shared_b) * eng.pool.shape().block_elems(),
      eng.pool.data() + static_cast<std::size_t>(shared_b + 1) * eng.pool.shape().block_elems());
  CHECK(before == after);  // nobody's recompute touched the shared block
  // The private copy holds recomputed keys for its first 4 slots, the cached ones after.
  const float* priv = eng.pool.tile(0, pk.blocks[2].physical, 0, 0);
  const float* orig = eng.pool.tile(0, shared_b, 0, 0);
  CHECK(std::memcmp(priv, orig, 4 * kDim * sizeof(float)) != 0);
  CHECK(std::memcmp(priv + 4 * kDim, orig + 4 * kDim, 4 * kDim * sizeof(float)) == 0);
  for (auto* p : {&pk, &pn, &pd}) eng.cache.release(p->id);
}

TEST_CASE("engine loop: a dynamic strategy refines layer by layer", "[recompute]") {
  toy_engine eng;
  auto p0 = eng.prefill(req(kA, kB), relokv::recompute::none{});
  eng.cache.commit(p0.id);
  eng.cache.release(p0.id);
  const auto l = req(kB, kA);
  const relokv::recompute::deviation_topk strat(0.25f, relokv::deviation_metric::kL2,
                                                {0.5f, 0.25f});
  auto plan = eng.cache.plan(l, strat);
  const auto reused = plan.reused_mask();
  auto mask = plan.compute;
  const auto count = [](const std::vector<std::uint8_t>& m) {
    return std::count(m.begin(), m.end(), std::uint8_t{1});
  };
  const auto n_reused = count(reused);
  const auto initial = count(mask);
  relokv::apply_copies<relokv::at_attention>(eng.rope, eng.pool, plan.copies);
  for (int step = 0; step < strat.steps(); ++step) {
    // The toy model has one layer: compare fresh K/V with the cached ones (now in the copies).
    std::vector<float> dev(mask.size(), 0.0f);
    for (const auto& pb : plan.blocks) {
      if (pb.status == relokv::block_status::kMiss) continue;
      for (int j = 0; j < pb.len; ++j) {
        const auto pos = static_cast<std::size_t>(pb.pos0 + j);
        if (!mask[pos]) continue;
        float k[kDim], v[kDim];
        toy_kv(l.tokens, static_cast<int>(pos), k, v);
        relokv::token_deviation(strat.metric(), eng.pool.tile(0, pb.physical, 0, 0) + j * kDim,
                                eng.pool.tile(0, pb.physical, 1, 0) + j * kDim, k, v, 1, kDim,
                                &dev[pos]);
      }
    }
    strat.refine(step, dev, reused, mask);
  }
  std::vector<std::size_t> kept;
  for (std::size_t t = 0; t < mask.size(); ++t)
    if (mask[t] && reused[t]) kept.push_back(t);
  const auto kept_reused = static_cast<std::int64_t>(kept.size());
  CHECK(initial > kept_reused);
  CHECK(kept_reused == static_cast<std::int64_t>(std::ceil(0.25 * static_cast<double>(n_reused))));
  // Which tokens: those whose cached K/V deviate most from what this context computes (the
  // one-layer toy measures the same deviation at both steps, so the two filters compose to
  // the top 25%), ranked here from the original cached blocks, not the copies.
  std::vector<std::pair<float, std::size_t>> truth;
  for (std::size_t b = 0; b < plan.blocks.size(); ++b) {
    const auto& pb = plan.blocks[b];
    if (pb.status == relokv::block_status::kMiss) continue;
    const auto src = pb.copy_on_write ? pb.source : pb.physical;
    for (int j = 0; j < pb.len; ++j) {
      const auto pos = static_cast<std::size_t>(pb.pos0 + j);
      if (!reused[pos]) continue;
      float k[kDim], v[kDim], d = 0.0f;
      toy_kv(l.tokens, static_cast<int>(pos), k, v);
      relokv::token_deviation(strat.metric(), eng.pool.tile(0, src, 0, 0) + j * kDim,
                              eng.pool.tile(0, src, 1, 0) + j * kDim, k, v, 1, kDim, &d);
      truth.emplace_back(d, pos);
    }
  }
  REQUIRE(static_cast<std::int64_t>(truth.size()) == n_reused);
  std::stable_sort(truth.begin(), truth.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::size_t> want;
  for (std::int64_t i = 0; i < kept_reused; ++i)
    want.push_back(truth[static_cast<std::size_t>(i)].second);
  std::sort(want.begin(), want.end());
  CHECK(kept == want);
  CHECK(truth[static_cast<std::size_t>(kept_reused - 1)].first >
        truth[static_cast<std::size_t>(kept_reused)].first);  // no tie decides the set
  // Tokens without a cached value are always computed.
  for (std::size_t t = 0; t < mask.size(); ++t)
    if (!reused[t]) CHECK(mask[t] == 1);
  eng.cache.release(plan.id);
}
