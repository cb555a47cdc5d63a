// Model-based test: long random sequences of plan / commit / release (with evictions under
// memory pressure), checked step by step against a simple reference model.
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "support/catch.hpp"
#include "support/weak_hash.hpp"

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
  bool committed = false;
};

struct model {
  std::map<desc, relokv::block_id> ctx, content;
  std::map<relokv::block_id, std::vector<desc>> ctx_of, content_of;
  std::map<relokv::block_id, int> refs;
  // What each block was computed as (whether or not it is indexed).
  std::map<relokv::block_id, desc> written_ctx, written_content;
  // The block each registered block was chained to when it was committed.
  std::map<relokv::block_id, relokv::block_id> ctx_parent, content_parent;

  void evict(relokv::block_id b) {
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

template <class Hash>
void run_model(std::uint32_t seed, bool check_completeness) {
  std::mt19937 rng(seed);
  constexpr int kBlock = 4;
  relokv::relocatable_cache<Hash> cache(relokv::lru_block_pool(28), kBlock);
  std::vector<std::vector<token_t>> docs, prompts;
  for (int d = 0; d < 8; ++d) {
    std::vector<token_t> t(static_cast<std::size_t>(3 + d % 7));
    for (auto& x : t) x = static_cast<token_t>(rng() % 50);
    docs.push_back(t);
  }
  for (int p = 0; p < 3; ++p) {
    std::vector<token_t> t(static_cast<std::size_t>(2 + 3 * p));
    for (auto& x : t) x = static_cast<token_t>(rng() % 50);
    prompts.push_back(t);
  }
  model m;
  std::vector<live_request> live;
  int planned = 0, hits = 0, oob = 0;

  std::vector<relokv::block_id> current;  // physical blocks of the request being checked
  auto chains_to = [&](const std::map<relokv::block_id, relokv::block_id>& parents,
                       relokv::block_id q, std::int32_t bi) {
    const relokv::block_id want =
        bi == 0 ? relokv::kNoBlock : current[static_cast<std::size_t>(bi - 1)];
    return parents.count(q) == 1 && parents.at(q) == want;
  };
  for (int step = 0; step < 3000; ++step) {
    const unsigned op = rng() % 10;
    if (op < 5 && live.size() < 4) {
      live_request r;
      relokv::layout_builder b(kBlock);
      b.prefix(prompts[rng() % prompts.size()]);
      const int nd = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < nd; ++k) b.span(docs[rng() % docs.size()]);
      if (rng() % 2) b.question(docs[rng() % docs.size()]);
      r.layout = b.build();
      r.extras.tenant_salt = rng() % 2;
      const auto free_before = cache.allocator().num_free();
      r.plan = cache.plan(r.layout, r.extras);
      if (!r.plan.ok()) {
        ++oob;
        REQUIRE(cache.allocator().num_free() == free_before);  // nothing taken
        continue;
      }
      ++planned;
      // Check every decision against the model.
      current.clear();
      for (const auto& pb : r.plan.blocks) current.push_back(pb.physical);
      bool chain_exact = true;
      for (std::int32_t bi = 0; bi < r.layout.num_blocks(); ++bi) {
        const auto& pb = r.plan.blocks[static_cast<std::size_t>(bi)];
        const auto& e = r.layout.blocks[static_cast<std::size_t>(bi)];
        const auto& seg = r.layout.segments[static_cast<std::size_t>(e.segment)];
        const desc xd = exact_desc(r.layout, r.extras, bi);
        const desc cd = content_desc(r.layout, r.extras, bi);
        if (pb.status == block_status::kExactHit) {
          ++hits;
          REQUIRE(chain_exact);
          // Sound: the block holds these tokens, computed after this exact context and tenant.
          REQUIRE(m.written_ctx.count(pb.physical) == 1);
          REQUIRE(m.written_ctx.at(pb.physical) == xd);
          if (check_completeness) REQUIRE(m.ctx.at(xd) == pb.physical);
        } else if (pb.status == block_status::kRelocatedHit) {
          ++hits;
          REQUIRE(seg.kind == relokv::segment_kind::kSpan);
          REQUIRE(m.written_content.count(pb.physical) == 1);
          REQUIRE(m.written_content.at(pb.physical) == cd);
          if (check_completeness) REQUIRE(m.content.at(cd) == pb.physical);
          if (check_completeness && chain_exact && m.ctx.count(xd) == 1)
            REQUIRE_FALSE(chains_to(m.ctx_parent, m.ctx.at(xd), bi));
        } else {
          if (check_completeness && e.sealed) {
            // Completeness: a registered block whose chain parent is the block this request
            // resolved for the previous position must be found.
            if (chain_exact && m.ctx.count(xd) == 1)
              REQUIRE_FALSE(chains_to(m.ctx_parent, m.ctx.at(xd), bi));
            if (seg.kind == relokv::segment_kind::kSpan && m.content.count(cd) == 1) {
              const bool first = bi == seg.first_block;
              REQUIRE_FALSE(first);
              const auto& prev = r.plan.blocks[static_cast<std::size_t>(bi - 1)];
              if (prev.status != block_status::kMiss)
                REQUIRE_FALSE(chains_to(m.content_parent, m.content.at(cd), bi));
            }
          }
          // A block handed out must not be in use by anyone.
          REQUIRE(m.refs[pb.physical] == 0);
          m.evict(pb.physical);  // whatever it held (registered or not) is gone
        }
        if (pb.status != block_status::kExactHit) chain_exact = false;
      }
      for (const auto& pb : r.plan.blocks) ++m.refs[pb.physical];
      live.push_back(std::move(r));
    } else if (op < 8 && !live.empty()) {
      auto& r = live[rng() % live.size()];
      if (r.committed) continue;
      r.committed = true;
      cache.commit(r.plan.id);
      bool exact_chain = true;
      for (std::int32_t bi = 0; bi < r.layout.num_blocks(); ++bi) {
        const auto& pb = r.plan.blocks[static_cast<std::size_t>(bi)];
        const auto& e = r.layout.blocks[static_cast<std::size_t>(bi)];
        const auto& seg = r.layout.segments[static_cast<std::size_t>(e.segment)];
        exact_chain = exact_chain && (pb.status == block_status::kExactHit || pb.fresh);
        if (!pb.fresh || !e.sealed) continue;
        const desc xd = exact_desc(r.layout, r.extras, bi);
        // Children link to the registered copy of their parent when there is one.
        relokv::block_id prev_ctx = relokv::kNoBlock, prev_content = relokv::kNoBlock;
        if (bi > 0) {
          prev_ctx = prev_content = r.plan.blocks[static_cast<std::size_t>(bi - 1)].physical;
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
    } else if (!live.empty()) {
      const std::size_t i = rng() % live.size();
      cache.release(live[i].plan.id);
      for (const auto& pb : live[i].plan.blocks) --m.refs[pb.physical];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // Reference counts agree after every step; no block in use is free.
    int in_use = 0;
    for (const auto& [b, n] : m.refs) {
      REQUIRE(cache.allocator().ref_count(b) == n);
      in_use += n > 0;
    }
    REQUIRE(cache.allocator().num_free() == cache.allocator().capacity() - in_use);
  }
  INFO("planned " << planned << ", hits " << hits << ", out of blocks " << oob);
  CHECK(planned > 500);
  CHECK(hits > 100);
  if (check_completeness) CHECK(oob > 0);  // memory pressure was exercised
}

}  // namespace

TEST_CASE("model: xxh3_128 cache agrees with the reference model", "[cache][model]") {
  for (std::uint32_t seed : {1u, 2u, 3u}) run_model<relokv::xxh3_128>(seed, true);
}

TEST_CASE("model: xxh3_64 cache agrees with the reference model", "[cache][model]") {
  run_model<relokv::xxh3_64>(11u, true);
}

TEST_CASE("model: a 2-bit hash stays sound", "[cache][model]") {
  for (std::uint32_t seed : {4u, 5u}) run_model<weak_hash>(seed, false);
}
