#include <relokv/layout/builder.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/deviation.hpp>
#include <relokv/recompute/deviation_topk.hpp>
#include <relokv/recompute/escalation.hpp>
#include <relokv/recompute/first_k.hpp>
#include <relokv/recompute/full.hpp>
#include <relokv/recompute/none.hpp>
#include <relokv/recompute/question_topk.hpp>
#include <relokv/recompute/seam_window.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "support/catch.hpp"
#include "support/test_data.hpp"

using relokv::block_status;
using relokv::token_t;
using S = block_status;

namespace {
std::vector<token_t> seq(int n, token_t first = 1) { return relokv_test::iota_tokens(first, n); }
// prefix 6 (blocks 0-1), span A 10 (blocks 2-4), span B 3 (block 5), question 5 (blocks 6-7)
// block size 4: prefix [0,4)[4,6) A [6,10)[10,14)[14,16) B [16,19) Q [19,23)[23,24)
relokv::request_layout layout() {
  return relokv::layout_builder(4)
      .prefix(seq(6))
      .span(seq(10, 100))
      .span(seq(3, 200))
      .question(seq(5, 300))
      .build();
}
std::vector<std::uint8_t> initial_mask(const relokv::request_layout& l,
                                       const std::vector<block_status>& st) {
  std::vector<std::uint8_t> m(static_cast<std::size_t>(l.num_tokens()), 0);
  for (std::int32_t b = 0; b < l.num_blocks(); ++b)
    if (st[static_cast<std::size_t>(b)] == S::kMiss)
      for (int j = 0; j < l.blocks[static_cast<std::size_t>(b)].len; ++j)
        m[static_cast<std::size_t>(l.blocks[static_cast<std::size_t>(b)].pos0 + j)] = 1;
  return m;
}
std::vector<int> ones(const std::vector<std::uint8_t>& m) {
  std::vector<int> out;
  for (std::size_t i = 0; i < m.size(); ++i)
    if (m[i]) out.push_back(static_cast<int>(i));
  return out;
}
// prefix exact, A relocated, B relocated, question missed
const std::vector<block_status> kStatus = {S::kExactHit,     S::kExactHit,     S::kRelocatedHit,
                                           S::kRelocatedHit, S::kRelocatedHit, S::kRelocatedHit,
                                           S::kMiss,         S::kMiss};
const std::vector<int> kQuestion = {19, 20, 21, 22, 23};

template <class Strategy>
std::vector<int> run(const Strategy& s, const std::vector<block_status>& st = kStatus) {
  const auto l = layout();
  auto m = initial_mask(l, st);
  s.select(l, st, m);
  return ones(m);
}
std::vector<int> cat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  return a;
}
}  // namespace

TEST_CASE("none: only the tokens of missed blocks", "[recompute]") {
  CHECK(run(relokv::recompute::none{}) == kQuestion);
}

TEST_CASE("full: every token", "[recompute]") {
  CHECK(run(relokv::recompute::full{}).size() == 24);
}

TEST_CASE("first_k: the first k tokens of every relocated span", "[recompute]") {
  CHECK(run(relokv::recompute::first_k(2)) == cat({6, 7, 16, 17}, kQuestion));
  // Span B (3 tokens) is shorter than k = 4: recomputed whole.
  CHECK(run(relokv::recompute::first_k(4)) == cat({6, 7, 8, 9, 16, 17, 18}, kQuestion));
  CHECK(run(relokv::recompute::first_k(0)) == kQuestion);
  // An exact (not relocated) span is left alone.
  auto st = kStatus;
  st[2] = st[3] = st[4] = S::kExactHit;
  CHECK(run(relokv::recompute::first_k(2), st) == cat({16, 17}, kQuestion));
  CHECK_THROWS_AS(relokv::recompute::first_k(33), relokv::error);
  CHECK_THROWS_AS(relokv::recompute::first_k(-1), relokv::error);
}

TEST_CASE("seam_window: the tokens on both sides of every seam", "[recompute]") {
  // Seams: prefix|A, A|B, B|Q. Before: tail of A (relocated) and tail of B (relocated).
  CHECK(run(relokv::recompute::seam_window(2, 0)) == cat({14, 15, 17, 18}, kQuestion));
  // After: head of A and head of B.
  CHECK(run(relokv::recompute::seam_window(0, 1)) == cat({6, 16}, kQuestion));
  // Windows longer than the span cover it whole (B has 3 tokens).
  CHECK(run(relokv::recompute::seam_window(16, 0)) ==
        cat({6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}, kQuestion));
  CHECK_THROWS_AS(relokv::recompute::seam_window(-1), relokv::error);
}

TEST_CASE("deviation_topk: candidates, then the top r% by deviation", "[recompute]") {
  const relokv::recompute::deviation_topk s(0.25f);
  CHECK(s.dynamic());
  const auto l = layout();
  auto m = initial_mask(l, kStatus);
  s.select(l, kStatus, m);
  // Candidates at the check layer: all of A and B, plus the question.
  CHECK(ones(m) == cat({6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18}, kQuestion));
  // reused: prefix (6) + A (10) + B (3) = 19 tokens; 25% -> ceil(4.75) = 5 kept.
  std::vector<std::uint8_t> reused(24, 0);
  for (int t = 0; t < 19; ++t) reused[static_cast<std::size_t>(t)] = 1;
  std::vector<float> dev(24, 0.0f);
  const int top[5] = {9, 12, 6, 17, 15};
  for (int i = 0; i < 5; ++i) dev[static_cast<std::size_t>(top[i])] = 10.0f - static_cast<float>(i);
  dev[3] = 100.0f;  // an exact prefix token (not masked): never selected
  s.refine(0, dev, reused, m);
  CHECK(ones(m) == cat({6, 9, 12, 15, 17}, kQuestion));
  CHECK_THROWS_AS(s.refine(1, dev, reused, m), relokv::error);
}

TEST_CASE("deviation_topk: with_seam confines the candidates to each span's first tokens",
          "[recompute][window]") {
  // A sliding-window model's seam: span A (10 tokens at 6..15) keeps its first 3, span B (3
  // tokens at 16..18) all 3; the budget still counts every reused token, and the choice
  // equals the unconfined one when the tokens beyond the seams deviate least.
  const auto full = relokv::recompute::deviation_topk(0.25f);
  const auto seamed = full.with_seam(3);
  CHECK(seamed.seam() == 3);
  CHECK(full.seam() == 0);
  const auto l = layout();
  auto m = initial_mask(l, kStatus);
  seamed.select(l, kStatus, m);
  CHECK(ones(m) == cat({6, 7, 8, 16, 17, 18}, kQuestion));
  std::vector<std::uint8_t> reused(24, 0);
  for (int t = 0; t < 19; ++t) reused[static_cast<std::size_t>(t)] = 1;
  std::vector<float> dev(24, 0.0f);
  for (int t : {6, 7, 8, 16, 17}) dev[static_cast<std::size_t>(t)] = 1.0f + static_cast<float>(t);
  auto all = initial_mask(l, kStatus);
  full.select(l, kStatus, all);
  full.refine(0, dev, reused, all);
  seamed.refine(0, dev, reused, m);
  CHECK(m == all);  // 5 kept either way: ceil(0.25 x 19)
  CHECK_THROWS_WITH(full.with_seam(-1), Catch::Contains("seam must be >= 0"));
}

TEST_CASE("deviation_topk: budgets at the edges and gradual filtering", "[recompute]") {
  const auto l = layout();
  std::vector<std::uint8_t> reused(24, 0);
  for (int t = 0; t < 19; ++t) reused[static_cast<std::size_t>(t)] = 1;
  std::vector<float> dev(24);
  for (int t = 0; t < 24; ++t) dev[static_cast<std::size_t>(t)] = static_cast<float>(t % 7);
  auto fresh_mask = [&](const relokv::recompute::deviation_topk& s) {
    auto m = initial_mask(l, kStatus);
    s.select(l, kStatus, m);
    return m;
  };
  {  // r = 0: only what has no cached value
    const relokv::recompute::deviation_topk s(0.0f);
    auto m = fresh_mask(s);
    s.refine(0, dev, reused, m);
    CHECK(ones(m) == kQuestion);
  }
  {  // r = 100%: every candidate stays (there are fewer than the budget)
    const relokv::recompute::deviation_topk s(1.0f);
    auto m = fresh_mask(s);
    const auto before = ones(m);
    s.refine(0, dev, reused, m);
    CHECK(ones(m) == before);
  }
  {  // 50% then 20%: the set shrinks, and the second set is inside the first
    const relokv::recompute::deviation_topk s(0.5f, relokv::deviation_metric::kCosine,
                                              {0.5f, 0.2f});
    CHECK(s.steps() == 2);
    auto m = fresh_mask(s);
    s.refine(0, dev, reused, m);
    const auto first = ones(m);
    CHECK(first.size() == 10 + kQuestion.size());  // ceil(0.5 * 19) = 10 (13 candidates)
    s.refine(1, dev, reused, m);
    const auto second = ones(m);
    CHECK(second.size() == 4 + kQuestion.size());  // ceil(0.2 * 19) = 4
    CHECK(std::includes(first.begin(), first.end(), second.begin(), second.end()));
  }
  CHECK_THROWS_AS(relokv::recompute::deviation_topk(1.5f), relokv::error);
  CHECK_THROWS_AS(
      relokv::recompute::deviation_topk(0.1f, relokv::deviation_metric::kL2, {0.1f, 0.3f}),
      relokv::error);
}

TEST_CASE("deviation_topk: check layers (LMCache's default: layer 1, 15%)", "[recompute]") {
  using relokv::recompute::deviation_check;
  using relokv::recompute::deviation_topk;
  const deviation_topk def;
  REQUIRE(def.steps() == 1);
  CHECK(def.check_layer(0) == 1);  // never layer 0, where K/V see no context yet
  CHECK(def.ratio(0) == 0.15f);
  const deviation_topk sched(0.5f, relokv::deviation_metric::kL2, {0.5f, 0.3f, 0.1f});
  const auto c = sched.checks();
  CHECK(std::vector<deviation_check>(c.begin(), c.end()) ==
        std::vector<deviation_check>{{1, 0.5f}, {2, 0.3f}, {3, 0.1f}});
  const deviation_topk explicit_checks({{1, 0.3f}, {8, 0.15f}});
  CHECK(explicit_checks.check_layer(1) == 8);
  CHECK_THROWS_AS(deviation_topk({{2, 0.3f}, {2, 0.1f}}), relokv::error);  // not increasing
  CHECK_THROWS_AS(deviation_topk({{-1, 0.3f}}), relokv::error);
  CHECK_THROWS_AS(deviation_topk({{1, 0.1f}, {2, 0.3f}}), relokv::error);  // ratio grows
  CHECK_THROWS_AS(deviation_topk(std::span<const deviation_check>{}), relokv::error);
  CHECK_THROWS_AS(deviation_topk(0.1f, relokv::deviation_metric::kL2, std::vector<float>(9, 0.1f)),
                  relokv::error);
  const relokv::recompute::any_strategy a(explicit_checks);
  CHECK(a.check_layer(1) == 8);
  CHECK_THROWS_AS(relokv::recompute::any_strategy(relokv::recompute::first_k(2)).check_layer(0),
                  relokv::error);
}

TEST_CASE("token_deviation: L2 and cosine on crafted rows", "[recompute]") {
  // Two tokens of width 2. Token 0: K equal, V differs by (3, 4) -> L2 5; token 1: K scaled
  // by 2 (cosine 0, L2 |k|), V opposite (cosine 2).
  const float ck[4] = {1, 0, 0, 1}, cv[4] = {0, 0, 1, 1};
  const float fk[4] = {1, 0, 0, 2}, fv[4] = {3, 4, -1, -1};
  float out[2];
  relokv::token_deviation(relokv::deviation_metric::kL2, ck, cv, fk, fv, 2, 2, out);
  CHECK(out[0] == Approx(5.0f));
  CHECK(out[1] == Approx(1.0f + std::sqrt(8.0f)));
  relokv::token_deviation(relokv::deviation_metric::kCosine, ck, cv, fk, fv, 2, 2, out);
  CHECK(out[0] == Approx(1.0f));  // K identical (0); V: zero vector vs (3,4) -> 1
  CHECK(out[1] == Approx(2.0f));  // K parallel (0); V opposite (2)
  // bf16 storage is read through its conversion.
  const relokv::bf16 bk[2] = {relokv::bf16::from_float(1), relokv::bf16::from_float(0)};
  const relokv::bf16 bv[2] = {relokv::bf16::from_float(0), relokv::bf16::from_float(0)};
  const float f2[2] = {1, 0}, z[2] = {0, 0};
  relokv::token_deviation(relokv::deviation_metric::kL2, bk, bv, f2, z, 1, 2, out);
  CHECK(out[0] == 0.0f);
}

TEST_CASE("select_topk: a NaN deviation ranks first, whatever the order", "[recompute]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // NaNs at the front, the middle and the end, between numbers, +inf and ties.
  std::vector<float> score(64);
  for (std::size_t i = 0; i < score.size(); ++i) score[i] = static_cast<float>((i * 37) % 11);
  const std::vector<std::size_t> nans = {0, 9, 31, 40, 63};
  for (auto i : nans) score[i] = nan;
  score[20] = inf;
  score[41] = -nan;  // a negative NaN ranks first too
  std::vector<std::uint8_t> eligible(score.size(), 1);
  eligible[9] = 0;                                      // not eligible: left alone, NaN or not
  std::vector<std::size_t> want = {0, 31, 40, 41, 63};  // eligible NaNs, by index
  for (std::int64_t k : {5, 6, 7}) {
    std::vector<std::uint8_t> mask(score.size(), 0);
    relokv::select_topk(score, eligible, k, mask);
    std::vector<std::size_t> got;
    for (std::size_t i = 0; i < mask.size(); ++i)
      if (mask[i]) got.push_back(i);
    auto expect = want;
    if (k >= 6) expect.push_back(20);  // then +inf
    if (k >= 7) {                      // then the first 10 (the largest finite score)
      for (std::size_t i = 0; i < score.size(); ++i)
        if (score[i] == 10.0f) {
          expect.push_back(i);
          break;
        }
    }
    std::sort(expect.begin(), expect.end());
    CHECK(got == expect);
  }
  // Fewer slots than NaNs: the lowest-indexed NaNs.
  std::vector<std::uint8_t> mask(score.size(), 0);
  relokv::select_topk(score, eligible, 2, mask);
  CHECK(mask[0] == 1);
  CHECK(mask[31] == 1);
  CHECK(std::count(mask.begin(), mask.end(), 1) == 2);
}

TEST_CASE("any_strategy: one type, every shipped strategy", "[recompute]") {
  using relokv::recompute::any_strategy;
  CHECK(run(any_strategy(relokv::recompute::first_k(2))) == run(relokv::recompute::first_k(2)));
  CHECK(run(any_strategy(relokv::recompute::seam_window(3, 1))) ==
        run(relokv::recompute::seam_window(3, 1)));
  CHECK(run(any_strategy(relokv::recompute::full{})) == run(relokv::recompute::full{}));
  CHECK(run(any_strategy()) == kQuestion);
  const any_strategy dyn(relokv::recompute::deviation_topk(0.1f));
  CHECK(dyn.dynamic());
  CHECK(dyn.steps() == 1);
  CHECK_FALSE(any_strategy(relokv::recompute::none{}).dynamic());
  std::vector<float> dev(24, 0.0f);
  std::vector<std::uint8_t> reused(24, 0), m(24, 0);
  CHECK_THROWS_AS(any_strategy(relokv::recompute::none{}).refine(0, dev, reused, m), relokv::error);
}

TEST_CASE("first_k_and_topk: EPIC's first tokens stay, CacheBlend's top-k joins them",
          "[recompute]") {
  using relokv::recompute::first_k_and_topk;
  // Prefix (exact), two relocated spans, a question (miss).
  const auto l = relokv::layout_builder(4)
                     .prefix(std::vector<token_t>{1, 2, 3, 4})
                     .span(std::vector<token_t>{10, 11, 12, 13, 14, 15})
                     .span(std::vector<token_t>{20, 21, 22, 23, 24, 25, 26, 27})
                     .question(std::vector<token_t>{30, 31})
                     .build();
  std::vector<S> status(static_cast<std::size_t>(l.num_blocks()), S::kRelocatedHit);
  status.front() = S::kExactHit;
  status.back() = S::kMiss;
  const first_k_and_topk s(2, 0.25f);
  CHECK(s.dynamic());
  CHECK(s.check_layer(0) == 1);
  std::vector<std::uint8_t> mask(l.tokens.size(), 0), pinned(l.tokens.size(), 0);
  for (std::size_t t = 18; t < 20; ++t) mask[t] = 1;  // the missed question
  s.select(l, status, mask);
  s.pin(l, status, pinned);
  // Pinned: the first 2 tokens of each span (positions 4, 5 and 10, 11).
  std::vector<std::size_t> pins;
  for (std::size_t t = 0; t < pinned.size(); ++t)
    if (pinned[t]) pins.push_back(t);
  CHECK(pins == std::vector<std::size_t>{4, 5, 10, 11});
  // Deviation highest at 7 and 15, zero at the pinned ones.
  std::vector<float> dev(l.tokens.size(), 0.1f);
  dev[7] = 5.0f;
  dev[15] = 4.0f;
  dev[9] = 3.0f;
  std::vector<std::uint8_t> reused(l.tokens.size(), 0);
  for (std::size_t t = 0; t < 18; ++t) reused[t] = 1;  // prefix and spans (18 tokens)
  s.refine(0, dev, reused, mask, pinned);
  std::vector<std::size_t> kept;
  for (std::size_t t = 0; t < mask.size(); ++t)
    if (mask[t]) kept.push_back(t);
  // ceil(0.25 * 18) = 5 by deviation (7, 15, 9 and two of the 0.1s), plus the 4 pinned,
  // plus the question.
  CHECK(kept.size() == 5 + 4 + 2);
  for (std::size_t t : {4u, 5u, 10u, 11u, 7u, 15u, 9u, 18u, 19u})
    CHECK(std::find(kept.begin(), kept.end(), t) != kept.end());
  CHECK_THROWS_AS(s.refine(0, dev, reused, mask, {}), relokv::error);
  // Selectable at run time, like the others.
  const relokv::recompute::any_strategy a(s);
  CHECK(a.steps() == 1);
  std::vector<std::uint8_t> pinned2(l.tokens.size(), 0);
  a.pin(l, status, pinned2);
  CHECK(pinned2 == pinned);
}

TEST_CASE("kvboost: the seam window pinned, cosine top-k above KVBoost's minimum", "[recompute]") {
  const auto l = layout();
  const auto s = relokv::recompute::kvboost(2, 0.25f);
  CHECK(s.metric() == relokv::deviation_metric::kCosine);
  CHECK(s.topk().min_deviation() == 0.01f);
  std::vector<std::uint8_t> pinned(l.tokens.size(), 0);
  s.pin(l, kStatus, pinned);
  // The last 2 tokens of A (14, 15) and of B (17, 18), ahead of each seam.
  CHECK(ones(pinned) == std::vector<int>{14, 15, 17, 18});
  auto mask = initial_mask(l, kStatus);
  s.select(l, kStatus, mask);
  std::vector<std::uint8_t> reused(l.tokens.size(), 0);
  for (std::size_t t = 0; t < 19; ++t) reused[t] = 1;
  // Budget ceil(0.25 * 19) = 5, but only 3 unpinned tokens deviate more than 0.01: the rest
  // are never chosen (KVBoost's min_deviation).
  std::vector<float> dev(l.tokens.size(), 0.005f);
  dev[7] = 0.5f;
  dev[8] = 0.2f;
  dev[12] = 0.02f;
  dev[14] = 0.9f;  // pinned anyway
  s.refine(0, dev, reused, mask, pinned);
  CHECK(ones(mask) == cat({7, 8, 12, 14, 15, 17, 18}, kQuestion));
  CHECK_THROWS_AS(relokv::recompute::deviation_topk(0.1f).with_min_deviation(-1.0f), relokv::error);
  const relokv::recompute::any_strategy a(s);
  CHECK(a.metric() == relokv::deviation_metric::kCosine);
  CHECK(a.steps() == 1);
}

TEST_CASE("question_topk: candidates, the question's rows, then the top r% by attention",
          "[recompute][question]") {
  using relokv::recompute::question_topk;
  const auto l = layout();
  // Candidates: every relocated token (A at 6..15, B at 16..18), as CacheBlend's.
  std::vector<int> relocated;
  for (int t = 6; t < 19; ++t) relocated.push_back(t);
  CHECK(run(question_topk(0.2f)) == cat(relocated, kQuestion));
  CHECK_FALSE(question_topk().dynamic());
  CHECK(question_topk().probes());
  CHECK(relokv::narrows_mask(question_topk()));
  CHECK_FALSE(relokv::narrows_mask(relokv::recompute::first_k(4)));
  // The rows that rank: the last segment (the question).
  std::vector<std::uint8_t> rows(24, 0);
  question_topk().query_rows(l, rows);
  CHECK(ones(rows) == kQuestion);
  std::vector<std::uint8_t> short_rows(23, 0);
  CHECK_THROWS_AS(question_topk().query_rows(l, short_rows), relokv::error);
  // Pinned: EPIC's first k of each relocated span (k = 2: 6, 7 and 16, 17); none for k = 0.
  std::vector<std::uint8_t> pinned(24, 0);
  question_topk(0.2f, 2).pin(l, kStatus, pinned);
  CHECK(ones(pinned) == std::vector<int>{6, 7, 16, 17});
  std::vector<std::uint8_t> none_pinned(24, 0);
  question_topk(0.2f).pin(l, kStatus, none_pinned);
  CHECK(ones(none_pinned).empty());

  // choose: reused = prefix (exact) and A, B; candidates 6..18 less the pinned: 9 tokens, so
  // r = 0.3 keeps ceil(2.7) = 3, by mass: 12, 9 and 18.
  std::vector<std::uint8_t> reused(24, 0);
  for (int t = 0; t < 19; ++t) reused[static_cast<std::size_t>(t)] = 1;
  std::vector<float> mass(24, 0.0f);
  mass[0] = 50.0f;  // the exact prefix's sink: reused but not a candidate, never chosen
  mass[12] = 3.0f;
  mass[9] = 2.0f;
  mass[18] = 1.5f;
  mass[10] = 1.0f;
  mass[6] = 9.0f;  // pinned: kept outside the budget
  auto mask = initial_mask(l, kStatus);
  question_topk(0.3f, 2).select(l, kStatus, mask);
  question_topk(0.3f, 2).choose(mass, reused, mask, pinned);
  CHECK(ones(mask) == cat({6, 7, 9, 12, 16, 17, 18}, kQuestion));
  // r = 0: the pinned and the question only; r = 1: every candidate.
  for (float r : {0.0f, 1.0f}) {
    auto m = initial_mask(l, kStatus);
    question_topk(r, 2).select(l, kStatus, m);
    question_topk(r, 2).choose(mass, reused, m, pinned);
    CHECK(ones(m) == (r == 0.0f ? cat({6, 7, 16, 17}, kQuestion) : cat(relocated, kQuestion)));
  }
  std::vector<float> short_mass(23, 0.0f);
  CHECK_THROWS_AS(question_topk().choose(short_mass, reused, mask), relokv::error);
  CHECK_THROWS_AS(question_topk(1.5f), relokv::error);
  CHECK_THROWS_AS(question_topk(-0.1f), relokv::error);
  CHECK_THROWS_AS(question_topk(0.1f, 33), relokv::error);
  CHECK_THROWS_AS(question_topk(0.1f, 0, 1.0f), relokv::error);
  CHECK_THROWS_AS(question_topk(0.1f, 0, -0.5f), relokv::error);
  // The probe counts the deeper half by default (24 layers: 12..23), every layer from 0.
  CHECK_FALSE(question_topk().counts_layer(11, 24));
  CHECK(question_topk().counts_layer(12, 24));
  CHECK(question_topk(0.1f, 0, 0.0f).counts_layer(0, 24));
  CHECK_FALSE(question_topk(0.1f, 0, 0.75f).counts_layer(17, 24));
  // Through any_strategy; the others have no probe.
  const relokv::recompute::any_strategy any(question_topk(0.3f, 2));
  CHECK(any.probes());
  CHECK(any.counts_layer(20, 30));
  CHECK_FALSE(any.counts_layer(14, 30));
  CHECK_FALSE(any.dynamic());
  auto m2 = initial_mask(l, kStatus);
  any.select(l, kStatus, m2);
  any.choose(mass, reused, m2, pinned);
  CHECK(ones(m2) == ones(mask));
  CHECK_FALSE(relokv::recompute::any_strategy(relokv::recompute::first_k(2)).probes());
  CHECK_THROWS_AS(relokv::recompute::any_strategy().choose(mass, reused, m2), relokv::error);
  CHECK_THROWS_AS(relokv::recompute::any_strategy().query_rows(l, rows), relokv::error);
}

// Issue 45, item 9: APE's groups and the question's rows follow the segments' kinds, not their
// places in the layout.
#include <relokv/recompute/ape.hpp>

namespace {
std::vector<token_t> toks(token_t first, int n) { return relokv_test::iota_tokens(first, n); }
struct group_shape {
  std::int32_t first, blocks;
  float t, s;
};
std::vector<group_shape> shapes(const std::array<relokv::attention_group, 3>& g) {
  std::vector<group_shape> out;
  for (const auto& x : g) out.push_back({x.first_block, x.num_blocks, x.temperature, x.scale});
  return out;
}
bool operator==(const group_shape& a, const group_shape& b) {
  return a.first == b.first && a.blocks == b.blocks && a.t == b.t && a.s == b.s;
}
}  // namespace

TEST_CASE("ape: the groups by segment kind, whatever the layout's shape", "[recompute][ape]") {
  const relokv::recompute::ape a(0.5f, 2.0f);
  const auto sys = toks(100, 20), d1 = toks(200, 32), d2 = toks(300, 16), q = toks(400, 5);
  SECTION("prefix, two spans, a question: 2 | 3 | the rest") {
    const auto l = relokv::layout_builder(16).prefix(sys).span(d1).span(d2).question(q).build();
    CHECK(shapes(a.groups(l, 10)) ==
          std::vector<group_shape>{{0, 2, 1, 1}, {2, 3, 0.5f, 2.0f}, {5, 5, 1, 1}});
    CHECK(relokv::recompute::ape::query_start(l) == 20 + 32 + 16);
  }
  SECTION("no prefix: the first span is a span, not the prefix") {
    const auto l = relokv::layout_builder(16).span(d1).span(d2).question(q).build();
    CHECK(shapes(a.groups(l, 4)) ==
          std::vector<group_shape>{{0, 0, 1, 1}, {0, 3, 0.5f, 2.0f}, {3, 1, 1, 1}});
    CHECK(relokv::recompute::ape::query_start(l) == 48);
  }
  SECTION("a span last: the question is not that span; decode reads by the groups") {
    const auto l = relokv::layout_builder(16).prefix(sys).span(d1).span(d2).build();
    CHECK(shapes(a.groups(l, 6)) ==
          std::vector<group_shape>{{0, 2, 1, 1}, {2, 3, 0.5f, 2.0f}, {5, 1, 1, 1}});
    CHECK(relokv::recompute::ape::query_start(l) == l.num_tokens());
  }
  SECTION("no span: plain attention") {
    const auto l = relokv::layout_builder(16).prefix(sys).question(q).build();
    CHECK(shapes(a.groups(l, 3)) ==
          std::vector<group_shape>{{0, 0, 1, 1}, {0, 0, 0.5f, 2.0f}, {0, 3, 1, 1}});
    CHECK(relokv::recompute::ape::query_start(l) == l.num_tokens());
  }
  SECTION("a table shorter than the layout") {
    const auto l = relokv::layout_builder(16).prefix(sys).span(d1).question(q).build();
    CHECK_THROWS_WITH(a.groups(l, 2), Catch::Contains("a table of 2 blocks"));
  }
}

TEST_CASE("question_topk: the question's rows are what follows the last span",
          "[recompute][question_topk]") {
  const relokv::recompute::question_topk s(0.2f);
  const auto sys = toks(100, 20), d1 = toks(200, 32), q = toks(400, 5), tail = toks(500, 3);
  const auto rows_of = [&](const relokv::request_layout& l) {
    std::vector<std::uint8_t> rows(static_cast<std::size_t>(l.num_tokens()));
    s.query_rows(l, rows);
    std::vector<int> out;
    for (std::size_t t = 0; t < rows.size(); ++t)
      if (rows[t]) out.push_back(static_cast<int>(t));
    return out;
  };
  const auto range = [](int a, int n) {
    std::vector<int> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = a + i;
    return v;
  };
  SECTION("a dependent segment and the question after the last span: both ask") {
    const auto l =
        relokv::layout_builder(16).prefix(sys).span(d1).dependent(tail).question(q).build();
    CHECK(rows_of(l) == range(20 + 32, 3 + 5));
  }
  SECTION("a layout that ends with a span: a clear error, not the span as its question") {
    const auto l = relokv::layout_builder(16).prefix(sys).span(d1).build();
    std::vector<std::uint8_t> rows(static_cast<std::size_t>(l.num_tokens()));
    CHECK_THROWS_WITH(s.query_rows(l, rows), Catch::Contains("ends with a span"));
  }
  SECTION("no span: the last segment") {
    const auto l = relokv::layout_builder(16).prefix(sys).question(q).build();
    CHECK(rows_of(l) == range(20, 5));
  }
}

TEST_CASE("escalation: margin and entropy of a distribution", "[recompute][escalation]") {
  using relokv::recompute::summarize_logits;
  // Two equal logits: margin 0, entropy ln 2.
  const std::vector<float> tie = {1.0f, 1.0f};
  auto s = summarize_logits(tie);
  CHECK(s.margin == Approx(0.0).margin(1e-7));
  CHECK(s.entropy == Approx(std::log(2.0)).epsilon(1e-6));
  // softmax(0, ln 3) = (1/4, 3/4): margin 1/2; the argmax is the second.
  const std::vector<float> three = {0.0f, std::log(3.0f)};
  s = summarize_logits(three);
  CHECK(s.margin == Approx(0.5).epsilon(1e-6));
  CHECK(s.argmax == 1);
  CHECK(s.entropy == Approx(-(0.25 * std::log(0.25) + 0.75 * std::log(0.75))).epsilon(1e-6));
  // Large logits do not overflow; one token is certain.
  const std::vector<float> sure = {1000.0f, 0.0f, -1000.0f};
  s = summarize_logits(sure);
  CHECK(s.margin == Approx(1.0));
  CHECK(s.entropy < 1e-6f);
  const std::vector<float> one = {3.0f};
  CHECK(summarize_logits(one).margin == 1.0f);
  // No logits, or a NaN among them: refused, not read as confidence.
  CHECK_THROWS_AS(summarize_logits(std::span<const float>{}), relokv::error);
  const std::vector<float> nan = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  CHECK_THROWS_WITH(summarize_logits(nan), Catch::Contains("logit 1"));
}

TEST_CASE("escalation: a policy escalates where its signal says, and parses its label",
          "[recompute][escalation]") {
  using relokv::recompute::escalation_policy;
  using relokv::recompute::escalation_stage;
  using relokv::recompute::logit_summary;
  const logit_summary unsure{0.1f, 2.0f, 0}, sure{0.9f, 0.1f, 0};
  CHECK_FALSE(escalation_policy{}.escalate(unsure, 0));  // the default never escalates
  const auto m = escalation_policy::parse("margin<0.3");
  CHECK(m.escalate(unsure, 0));
  CHECK_FALSE(m.escalate(sure, 0));
  CHECK_FALSE(m.escalate(unsure, 3));  // @first looks once
  CHECK(m.label() == "margin<0.3@first");
  const auto e = escalation_policy::parse("entropy>1.5@every");
  CHECK(e.stage == escalation_stage::every_token);
  CHECK(e.escalate(unsure, 5));
  CHECK_FALSE(e.escalate(sure, 5));
  CHECK(escalation_policy::parse(e.label()).label() == e.label());
  CHECK_FALSE(escalation_policy::parse("never").enabled);
  const auto d = escalation_policy::parse("margin<0.2@draft");
  CHECK(d.stage == escalation_stage::draft);
  CHECK(d.label() == "margin<0.2@draft");
  CHECK(d.worst(sure, unsure).margin == unsure.margin);  // the less sure of the two
  CHECK(escalation_policy::parse("entropy>1@draft").worst(unsure, sure).entropy == 2.0f);
  for (const char* bad : {"margin<1.5", "margin<", "margin<0.2x", "entropy>-1", "margin>0.2",
                          "margin<0.2@later", "entropy>nan", ""})
    CHECK_THROWS_AS(escalation_policy::parse(bad), relokv::error);
}
