// Model-based tests: random sequences of plan / commit / release (with evictions under memory
// pressure, block and context slots reused, late commits across tenants, several recompute
// strategies), checked step by step against a simple reference model.
//
// The model knows what every block was computed as (its tenant, its whole exact context, its
// span's context and tokens). A hit is sound when the block found holds exactly what the
// request asks for; with a full-strength hash the model also checks completeness (a block the
// request could reuse is found).
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/recompute/any_strategy.hpp>

#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/weak_hash.hpp"

using relokv::block_id;
using relokv::block_status;
using relokv::token_t;

namespace {

using desc = std::vector<std::int64_t>;

void put_block(desc& d, const relokv::request_layout& l, std::int32_t b) {
  const auto& e = l.blocks[static_cast<std::size_t>(b)];
  const auto& s = l.segments[static_cast<std::size_t>(e.segment)];
  d.push_back(static_cast<std::int64_t>(s.kind) * 1000000 + (b == s.first_block) * 100000 +
              s.dep_window);
  d.push_back(e.len);
  for (token_t t : l.block_tokens(b)) d.push_back(t);
}

/// Everything an exact hit must agree on: extra keys and the whole request up to block b.
desc exact_desc(const relokv::request_layout& l, const relokv::extra_keys& x, std::int32_t b) {
  desc d = {static_cast<std::int64_t>(x.tenant_salt), static_cast<std::int64_t>(x.adapter_id)};
  for (std::int32_t i = 0; i <= b; ++i) put_block(d, l, i);
  return d;
}

/// Everything a relocated hit must agree on: extra keys, the span's context, the span so far.
desc content_desc(const relokv::request_layout& l, const relokv::extra_keys& x, std::int32_t b) {
  const auto& e = l.blocks[static_cast<std::size_t>(b)];
  const auto& s = l.segments[static_cast<std::size_t>(e.segment)];
  desc d = {-1, static_cast<std::int64_t>(x.tenant_salt), static_cast<std::int64_t>(x.adapter_id)};
  for (token_t t : l.prefix_tokens()) d.push_back(t);
  d.push_back(-2);
  for (std::int32_t i = s.first_block; i <= b; ++i) put_block(d, l, i);
  return d;
}

struct live_request {
  relokv::request_layout layout;
  relokv::extra_keys extras;
  relokv::reuse_plan plan;
  std::vector<block_id> held;  ///< what the request references: hit sources and new blocks
  bool committed = false;
};

struct model {
  std::map<desc, block_id> ctx, content;
  std::map<block_id, std::vector<desc>> ctx_of, content_of;
  std::map<block_id, int> refs;
  // What each block was computed as (whether or not it is indexed).
  std::map<block_id, desc> written_ctx, written_content;
  // The block each registered block was chained to when it was committed.
  std::map<block_id, block_id> ctx_parent, content_parent;

  void evict(block_id b) {
    for (const desc& d : ctx_of[b]) ctx.erase(d);
    for (const desc& d : content_of[b]) content.erase(d);
    ctx_of.erase(b);
    content_of.erase(b);
    written_ctx.erase(b);
    written_content.erase(b);
    for (auto* links : {&ctx_parent, &content_parent}) {
      links->erase(b);
      for (auto it = links->begin(); it != links->end();)
        it = it->second == b ? links->erase(it) : std::next(it);
    }
  }
};

/// The shape of one random run.
struct run_config {
  int block = 4;
  int pool = 28;
  int steps = 3000;
  int max_live = 4;
  int num_docs = 8;
  int doc_min = 3;  ///< doc d has doc_min + d % doc_mod tokens
  int doc_mod = 7;
  int num_prompts = 3;  ///< prompt p has 2 + prompt_step * p tokens
  int prompt_step = 3;
  int tenants = 2;
  int alphabet = 50;
  int plan_weight = 5, commit_weight = 3, release_weight = 2;
  int extend_weight = 0;    ///< decode: one more private block for a live request
  bool strategies = false;  ///< draw none / full / first_k per request (else none only)
  bool completeness = true;
  bool probe = false;  ///< after each commit, read its spans under every prompt and tenant
};

struct run_outcome {
  int planned = 0, hits = 0, oob = 0;
  int exact = 0, relocated = 0;  ///< hits by kind (hits = exact + relocated)
  std::string violation;         ///< empty when the cache agreed with the model throughout
};

/// Where the cache and the model disagree (thrown out of the driver's checks).
struct model_violation {
  std::string what;
};
#define MODEL_CHECK(cond, what)                                 \
  do {                                                          \
    if (!(cond)) {                                              \
      std::ostringstream os_;                                   \
      os_ << "step " << step << ": " << what << " (" #cond ")"; \
      throw model_violation{os_.str()};                         \
    }                                                           \
  } while (0)

using strategy_t = relokv::recompute::any_strategy;

template <class Hash>
run_outcome run_model(std::uint32_t seed, const run_config& cfg) {
  std::mt19937 rng(seed);
  run_outcome out;
  int step = -1;
  relokv::relocatable_cache<Hash, relokv::lru_block_pool, relokv::at_attention, strategy_t> cache(
      relokv::lru_block_pool(cfg.pool), cfg.block);
  auto tokens = [&](int n) {
    std::vector<token_t> t(static_cast<std::size_t>(n));
    for (auto& x : t) x = static_cast<token_t>(rng() % static_cast<unsigned>(cfg.alphabet));
    return t;
  };
  std::vector<std::vector<token_t>> docs, prompts;
  for (int d = 0; d < cfg.num_docs; ++d) docs.push_back(tokens(cfg.doc_min + d % cfg.doc_mod));
  for (int p = 0; p < cfg.num_prompts; ++p) prompts.push_back(tokens(2 + cfg.prompt_step * p));
  const strategy_t kStrategies[] = {relokv::recompute::none{}, relokv::recompute::full{},
                                    relokv::recompute::first_k(1), relokv::recompute::first_k(3)};
  model m;
  std::vector<live_request> live;
  const unsigned total = static_cast<unsigned>(cfg.plan_weight + cfg.commit_weight +
                                               cfg.release_weight + cfg.extend_weight);

  // The block a request's block resolves to: the cached block found for a shared or copied
  // hit, its own block when it writes every slot (a miss, or a hit recomputed whole).
  auto resolved = [](const relokv::planned_block& pb, bool at_commit) {
    if (pb.status == block_status::kMiss || (at_commit && pb.fresh)) return pb.physical;
    return pb.source;
  };
  std::vector<block_id> current;  // resolved blocks of the request being checked
  auto chains_to = [&](const std::map<block_id, block_id>& parents, block_id q, std::int32_t bi) {
    const block_id want = bi == 0 ? relokv::kNoBlock : current[static_cast<std::size_t>(bi - 1)];
    return parents.count(q) == 1 && parents.at(q) == want;
  };

  // Plans r (layout and extras set) and checks every decision against the model; false when
  // the pool was short (nothing taken).
  auto plan_checked = [&](live_request& r, const strategy_t& strategy) {
    const auto free_before = cache.allocator().num_free();
    const auto live_before = cache.live_requests();
    r.plan.id = 12345;  // a stale id from an earlier plan into the same object
    r.plan = cache.plan(r.layout, strategy, r.extras);
    if (!r.plan.ok()) {
      ++out.oob;
      MODEL_CHECK(cache.allocator().num_free() == free_before, "a failed plan took blocks");
      MODEL_CHECK(cache.live_requests() == live_before, "a failed plan started a request");
      MODEL_CHECK(r.plan.id == relokv::kNoRequest, "a failed plan carries an id");
      return false;
    }
    ++out.planned;
    current.clear();
    for (const auto& pb : r.plan.blocks) current.push_back(resolved(pb, false));
    bool chain_exact = true;
    for (std::int32_t bi = 0; bi < r.layout.num_blocks(); ++bi) {
      const auto& pb = r.plan.blocks[static_cast<std::size_t>(bi)];
      const auto& e = r.layout.blocks[static_cast<std::size_t>(bi)];
      const auto& seg = r.layout.segments[static_cast<std::size_t>(e.segment)];
      const desc xd = exact_desc(r.layout, r.extras, bi);
      const desc cd = content_desc(r.layout, r.extras, bi);
      const block_id src = pb.source;
      if (pb.status == block_status::kExactHit) {
        ++out.hits;
        ++out.exact;
        MODEL_CHECK(chain_exact, "exact hit " << bi << " after a broken exact chain");
        // Sound: the block holds these tokens, computed after this exact context and tenant.
        MODEL_CHECK(m.written_ctx.count(src) == 1 && m.written_ctx.at(src) == xd,
                    "exact hit " << bi << " hands out block " << src
                                 << ", computed for another context or tenant");
        if (cfg.completeness) MODEL_CHECK(m.ctx.at(xd) == src, "exact hit on a duplicate");
      } else if (pb.status == block_status::kRelocatedHit) {
        ++out.hits;
        ++out.relocated;
        MODEL_CHECK(seg.kind == relokv::segment_kind::kSpan, "relocated hit outside a span");
        MODEL_CHECK(m.written_content.count(src) == 1 && m.written_content.at(src) == cd,
                    "relocated hit " << bi << " hands out block " << src
                                     << ", computed for another span context or tenant");
        if (cfg.completeness) {
          MODEL_CHECK(m.content.at(cd) == src, "relocated hit on a duplicate");
          if (chain_exact && m.ctx.count(xd) == 1)
            MODEL_CHECK(!chains_to(m.ctx_parent, m.ctx.at(xd), bi), "exact hit missed");
        }
      } else {
        MODEL_CHECK(src == relokv::kNoBlock, "a miss names a source");
        if (cfg.completeness && e.sealed) {
          // Completeness: a registered block whose chain parent is the block this request
          // resolved for the previous position must be found.
          if (chain_exact && m.ctx.count(xd) == 1)
            MODEL_CHECK(!chains_to(m.ctx_parent, m.ctx.at(xd), bi), "exact hit missed");
          if (seg.kind == relokv::segment_kind::kSpan && m.content.count(cd) == 1) {
            MODEL_CHECK(bi != seg.first_block, "first block of a cached span missed");
            const auto& prev = r.plan.blocks[static_cast<std::size_t>(bi - 1)];
            if (prev.status != block_status::kMiss)
              MODEL_CHECK(!chains_to(m.content_parent, m.content.at(cd), bi),
                          "relocated hit missed");
          }
        }
      }
      if (pb.status != block_status::kMiss && !pb.fresh) {
        // A hit the request reads (shared or copied) is held; one recomputed whole is not.
        MODEL_CHECK(pb.copy_on_write || pb.physical == src, "shared hit moved");
        r.held.push_back(src);
      }
      if (pb.copy_on_write) {
        bool listed = false;
        for (const auto& c : r.plan.copies)
          listed = listed || (c.src == src && c.dst == pb.physical);
        MODEL_CHECK(listed, "copy on write of block " << bi << " not in plan.copies");
      }
      if (pb.status != block_status::kExactHit) chain_exact = false;
    }
    // Then the blocks handed out (after every lookup was checked: one may be the unheld source
    // of a hit recomputed whole). None may be in use; whatever it held is gone.
    for (const auto& pb : r.plan.blocks)
      if (pb.fresh || pb.copy_on_write) {
        MODEL_CHECK(m.refs[pb.physical] == 0, "block " << pb.physical << " handed out twice");
        m.evict(pb.physical);
        r.held.push_back(pb.physical);
      }
    for (block_id h : r.held) ++m.refs[h];
    return true;
  };
  // Readers: the spans of a request just committed, under every prompt and tenant, planned and
  // released at once. A chain forged at commit is handed out here if anywhere.
  auto probe = [&](const live_request& w) {
    for (const auto& seg : w.layout.segments) {
      if (seg.kind != relokv::segment_kind::kSpan) continue;
      const auto first = w.layout.tokens.begin() + seg.first_token;
      const std::vector<token_t> span(first, first + seg.num_tokens);
      for (const auto& prompt : prompts)
        for (int t = 0; t < cfg.tenants; ++t) {
          live_request r;
          r.layout = relokv::layout_builder(cfg.block).prefix(prompt).span(span).build();
          r.extras.tenant_salt = static_cast<std::uint64_t>(t);
          if (!plan_checked(r, kStrategies[0])) continue;
          cache.release(r.plan.id);
          for (block_id h : r.held) --m.refs[h];
        }
    }
  };

  try {
    for (step = 0; step < cfg.steps; ++step) {
      const unsigned op = rng() % total;
      if (op < static_cast<unsigned>(cfg.plan_weight) &&
          live.size() < static_cast<std::size_t>(cfg.max_live)) {
        live_request r;
        relokv::layout_builder b(cfg.block);
        b.prefix(prompts[rng() % prompts.size()]);
        const int nd = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < nd; ++k) b.span(docs[rng() % docs.size()]);
        if (rng() % 2) b.question(docs[rng() % docs.size()]);
        r.layout = b.build();
        r.extras.tenant_salt = rng() % static_cast<unsigned>(cfg.tenants);
        if (!plan_checked(r, kStrategies[cfg.strategies ? rng() % 4 : 0])) continue;
        live.push_back(std::move(r));
      } else if (op < static_cast<unsigned>(cfg.plan_weight + cfg.commit_weight) && !live.empty()) {
        auto& r = live[rng() % live.size()];
        if (r.committed) continue;
        r.committed = true;
        cache.commit(r.plan.id);
        bool exact_chain = true;
        for (std::int32_t bi = 0; bi < r.layout.num_blocks(); ++bi) {
          const auto& pb = r.plan.blocks[static_cast<std::size_t>(bi)];
          const auto& e = r.layout.blocks[static_cast<std::size_t>(bi)];
          const auto& seg = r.layout.segments[static_cast<std::size_t>(e.segment)];
          exact_chain =
              exact_chain && (pb.status == block_status::kExactHit ? !pb.copy_on_write : pb.fresh);
          if (!pb.fresh || !e.sealed) continue;
          const desc xd = exact_desc(r.layout, r.extras, bi);
          // Children link to the registered copy of their parent when there is one.
          block_id prev_ctx = relokv::kNoBlock, prev_content = relokv::kNoBlock;
          if (bi > 0) {
            prev_ctx = prev_content =
                resolved(r.plan.blocks[static_cast<std::size_t>(bi - 1)], true);
            const desc pxd = exact_desc(r.layout, r.extras, bi - 1);
            if (m.ctx.count(pxd)) prev_ctx = m.ctx.at(pxd);
            if (bi > seg.first_block) {
              const desc pcd = content_desc(r.layout, r.extras, bi - 1);
              if (m.content.count(pcd)) prev_content = m.content.at(pcd);
            }
          }
          if (exact_chain) m.written_ctx[pb.physical] = xd;
          if (seg.kind == relokv::segment_kind::kSpan)
            m.written_content[pb.physical] = content_desc(r.layout, r.extras, bi);
          if (exact_chain && !m.ctx.count(xd)) {
            m.ctx_parent[pb.physical] = prev_ctx;
            m.ctx[xd] = pb.physical;
            m.ctx_of[pb.physical].push_back(xd);
          }
          const desc cd = content_desc(r.layout, r.extras, bi);
          if (seg.kind == relokv::segment_kind::kSpan && !m.content.count(cd)) {
            m.content_parent[pb.physical] = prev_content;
            m.content[cd] = pb.physical;
            m.content_of[pb.physical].push_back(cd);
          }
        }
        if (cfg.probe) probe(r);
      } else if (op >= total - static_cast<unsigned>(cfg.extend_weight)) {
        if (live.empty()) continue;
        auto& r = live[rng() % live.size()];
        const relokv::alloc_result a = cache.extend(r.plan.id);
        if (a.status != relokv::alloc_status::kOk) continue;
        MODEL_CHECK(m.refs[a.block] == 0, "extend hands out block " << a.block << " in use");
        m.evict(a.block);
        r.held.push_back(a.block);
        ++m.refs[a.block];
      } else if (!live.empty()) {
        const std::size_t i = rng() % live.size();
        cache.release(live[i].plan.id);
        for (block_id h : live[i].held) --m.refs[h];
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      // Reference counts agree after every step; no block in use is free.
      int in_use = 0;
      for (const auto& [b, n] : m.refs) {
        MODEL_CHECK(cache.allocator().ref_count(b) == n, "reference count of block " << b);
        in_use += n > 0;
      }
      MODEL_CHECK(cache.allocator().num_free() == cache.allocator().capacity() - in_use,
                  "free blocks");
    }
  } catch (const model_violation& v) {
    out.violation = v.what;
  }
  return out;
}

#undef MODEL_CHECK

template <class Hash>
void check_long_run(std::uint32_t seed, const run_config& cfg) {
  const run_outcome r = run_model<Hash>(seed, cfg);
  INFO("seed " << seed << ": planned " << r.planned << ", hits " << r.hits << ", out of blocks "
               << r.oob << "; " << r.violation);
  REQUIRE(r.violation.empty());
  CHECK(r.planned > 500);
  CHECK(r.hits > 100);
  if (cfg.completeness) CHECK(r.oob > 0);  // memory pressure was exercised
}

/// The adversarial shape: a small pool, several prefixes and tenants, spans of several blocks,
/// late commits. Context slots and blocks are reused between a request's plan and its commit.
run_config adversarial() {
  run_config c;
  c.block = 2;
  c.pool = 14;
  c.steps = 80;
  c.max_live = 5;
  c.num_docs = 4;
  c.doc_min = 4;
  c.doc_mod = 5;
  c.num_prompts = 3;
  c.prompt_step = 1;
  c.tenants = 3;
  c.alphabet = 4;
  c.plan_weight = 6;
  c.commit_weight = 2;
  c.release_weight = 2;
  c.extend_weight = 2;
  c.strategies = true;
  c.completeness = false;
  c.probe = true;
  return c;
}

/// What `n` independent adversarial instances did: how many handed out a wrong block, and how
/// many hits of each kind they checked (a sound cache that never hits would pass vacuously).
struct adversarial_totals {
  int failed = 0;
  std::int64_t planned = 0, exact = 0, relocated = 0, oob = 0;
  std::string first;
};
template <class Hash>
adversarial_totals adversarial_runs(int n) {
  adversarial_totals t;
  const run_config cfg = adversarial();
  for (int i = 0; i < n; ++i) {
    const std::uint32_t seed = 0x9E3779B9u * static_cast<std::uint32_t>(i + 1);
    const run_outcome r = run_model<Hash>(seed, cfg);
    t.planned += r.planned;
    t.exact += r.exact;
    t.relocated += r.relocated;
    t.oob += r.oob;
    if (!r.violation.empty()) {
      if (t.failed++ == 0) t.first = "seed " + std::to_string(seed) + ": " + r.violation;
    }
  }
  return t;
}

template <class Hash>
constexpr const char* hash_name() {
  if constexpr (std::is_same_v<Hash, relokv::xxh3_64>)
    return "xxh3_64";
  else if constexpr (std::is_same_v<Hash, weak_hash>)
    return "weak_hash";
  else if constexpr (std::is_same_v<Hash, blind_hash>)
    return "blind_hash";
  else
    return "constant_hash";
}

// 10,000 instances per scheme in the Release run; a tenth under the sanitizers, where each
// instance runs about 20 times slower and what they look for (a bad access, undefined
// behaviour) shows in the first instances as much as in the last.
#if defined(RELOKV_SANITIZED_BUILD)
constexpr int kInstances = 1000;
#else
constexpr int kInstances = 10000;
#endif

}  // namespace

TEST_CASE("model: xxh3_128 cache agrees with the reference model", "[cache][model]") {
  for (std::uint32_t seed : {1u, 2u, 3u}) check_long_run<relokv::xxh3_128>(seed, run_config{});
}

TEST_CASE("model: xxh3_64 cache agrees with the reference model", "[cache][model]") {
  check_long_run<relokv::xxh3_64>(11u, run_config{});
}

TEST_CASE("model: strategies that recompute hits keep the cache complete", "[cache][model]") {
  run_config cfg;
  cfg.strategies = true;
  for (std::uint32_t seed : {21u, 22u}) check_long_run<relokv::xxh3_128>(seed, cfg);
}

TEST_CASE("model: colliding hashes stay sound over long runs", "[cache][model]") {
  run_config cfg;
  cfg.completeness = false;
  cfg.strategies = true;
  for (std::uint32_t seed : {4u, 5u}) check_long_run<weak_hash>(seed, cfg);
  check_long_run<blind_hash>(6u, cfg);
  check_long_run<constant_hash>(7u, cfg);
}

TEMPLATE_TEST_CASE("model: no wrong block over many adversarial instances", "[cache][model]",
                   relokv::xxh3_64, weak_hash, blind_hash, constant_hash) {
  const adversarial_totals t = adversarial_runs<TestType>(kInstances);
  // Reported on every run (ctest -V shows it): what "no wrong block" was measured over.
  std::printf(
      "model: %-13s %d instances: %lld plans, %lld exact hits, %lld relocated hits, "
      "%lld plans short of blocks, %d wrong\n",
      hash_name<TestType>(), kInstances, static_cast<long long>(t.planned),
      static_cast<long long>(t.exact), static_cast<long long>(t.relocated),
      static_cast<long long>(t.oob), t.failed);
  INFO(t.failed << " of " << kInstances << " instances failed; first: " << t.first);
  REQUIRE(t.failed == 0);
  // Not vacuous: every scheme, the colliding ones included, decided many hits of each kind
  // (each one checked against the model), far more than instances.
  CHECK(t.exact >= kInstances);
  CHECK(t.relocated >= kInstances);
}
