// The store tier: the block format, memory_store and file_store, and relocatable_cache with a
// store (fetches verified like pool hits, write-through, faults). Redis has its own test,
// against a real server (redis_store_test.cpp).
#include <relokv/attention/kv_append.hpp>
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/recompute/first_k.hpp>
#include <relokv/rope/pre_rotated.hpp>
#include <relokv/store/any_store.hpp>
#include <relokv/store/block_format.hpp>
#include <relokv/store/file_store.hpp>
#include <relokv/store/memory_store.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/store_fixture.hpp"
#include "support/test_data.hpp"
#include "support/weak_hash.hpp"

using relokv::block_check;
using relokv::block_status;
using relokv::block_tier;
using relokv::token_t;

namespace {
using namespace relokv_test::store_fixture;

/// The identity digest of a span block after `earlier` (tag, tokens) blocks of its span, bound
/// to context `ctx`.
relokv::sha256_digest span_digest(
    std::span<const token_t> ctx,
    const std::vector<std::pair<std::uint32_t, std::vector<token_t>>>& earlier) {
  relokv::identity_chain c;
  c.begin_content(ctx);
  for (const auto& [tag, t] : earlier) c.absorb(tag, t);
  return c.digest();
}

/// An encoded block with a recognizable payload, for the format tests: the second block (12
/// tokens) of a span bound to a 5-token context.
std::vector<std::byte> sample_block(relokv::block_header& h, relokv::block_identity& id,
                                    std::vector<token_t>& ctx, std::vector<token_t>& first,
                                    std::vector<token_t>& toks) {
  h.fingerprint = kFp;
  h.key = {7, 9};
  h.layout = relokv::host_kv_storage<float>(kShape).block_layout();
  h.kind = relokv::store_entry_kind::kContent;
  h.placement = relokv::placement_kind::kAtAttention;
  h.len = 12;
  h.pos0 = 48;
  h.extras = {1, 2, 3};
  h.origin = {true, 77};
  ctx = seq(10, 5);
  first = seq(100, 16);
  toks = seq(116, 12);
  id = {span_digest(ctx, {{0x101, first}}), 1, toks};
  std::vector<std::byte> out;
  relokv::encode_block(
      h, id,
      [](std::span<std::byte> p) {
        for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(i * 31 + 7);
      },
      out);
  return out;
}

void rechecksum(std::vector<std::byte>& b) {
  const std::uint64_t sum = XXH3_64bits(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &sum, 8);
}

}  // namespace

TEST_CASE("block format: round trip and every rejection", "[store][format]") {
  relokv::block_header h;
  relokv::block_identity id;
  std::vector<token_t> ctx, first, toks;
  const auto bytes = sample_block(h, id, ctx, first, toks);
  REQUIRE(bytes.size() == relokv::encoded_block_bytes(h, id));

  const auto d = relokv::decode_block(bytes, kFp, h.layout);
  REQUIRE(d.check == block_check::kOk);
  CHECK(d.header.len == 12);
  CHECK(d.header.pos0 == 48);
  CHECK(d.header.origin == relokv::block_origin{true, 77});
  CHECK(d.payload.size() == h.layout.payload_bytes(12));
  CHECK(static_cast<std::size_t>(d.payload.data() - bytes.data()) % 64 == 0);
  CHECK(d.payload[5] == static_cast<std::byte>(5 * 31 + 7));
  CHECK(relokv::same_identity(d, h.key, h.kind, h.extras, id));

  SECTION("identity: any field that differs is another block") {
    auto other_tok = toks;
    other_tok[11] += 1;
    auto other_ctx = ctx;
    other_ctx[0] += 1;
    auto other_first = first;
    other_first[3] += 1;
    const relokv::block_identity by_tok{id.before, id.tag, other_tok};
    const relokv::block_identity by_ctx{span_digest(other_ctx, {{0x101, first}}), id.tag, toks};
    const relokv::block_identity by_chain{span_digest(ctx, {{0x101, other_first}}), id.tag, toks};
    const relokv::block_identity by_tag{span_digest(ctx, {{0x301, first}}), id.tag, toks};
    const relokv::block_identity by_own_tag{id.before, 3, toks};
    const relokv::block_identity shorter{id.before, id.tag, std::span(toks).first(11)};
    CHECK_FALSE(relokv::same_identity(d, {7, 10}, h.kind, h.extras, id));
    CHECK_FALSE(relokv::same_identity(d, h.key, relokv::store_entry_kind::kContext, h.extras, id));
    CHECK_FALSE(relokv::same_identity(d, h.key, h.kind, {1, 2, 4}, id));
    for (const auto* other : {&by_tok, &by_ctx, &by_chain, &by_tag, &by_own_tag, &shorter})
      CHECK_FALSE(relokv::same_identity(d, h.key, h.kind, h.extras, *other));
  }
  SECTION("identity: bounded, whatever precedes the block") {
    // Version 1 stored every token before a block: its bytes grew with position.
    const auto long_ctx = seq(0, 30000);
    const relokv::block_identity far{span_digest(long_ctx, {{0x101, first}}), 1, toks};
    CHECK(relokv::encoded_block_bytes(h, far) == bytes.size());
    CHECK(far.before != id.before);
    // A context chain and a content chain over the same tokens never share a digest.
    relokv::identity_chain c;
    c.begin_context();
    c.absorb(0x101, first);
    CHECK(c.digest() != id.before);
  }
  SECTION("another model, RoPE configuration or layout") {
    CHECK(relokv::decode_block(bytes, kFp + 1, h.layout).check == block_check::kFingerprint);
    auto l = h.layout;
    l.head_dim = 16;
    CHECK(relokv::decode_block(bytes, kFp, l).check == block_check::kLayout);
    relokv::rope_config r;
    r.head_dim = r.rotary_dim = 64;
    const auto f1 = relokv::store_fingerprint(1, r, relokv::placement_kind::kAtAttention);
    CHECK(f1 != relokv::store_fingerprint(2, r, relokv::placement_kind::kAtAttention));
    CHECK(f1 != relokv::store_fingerprint(1, r, relokv::placement_kind::kPreRotated));
    r.theta = 1e6;
    CHECK(f1 != relokv::store_fingerprint(1, r, relokv::placement_kind::kAtAttention));
  }
  SECTION("every flipped byte is caught; no truncation parses") {
    for (std::size_t i = 0; i < bytes.size(); i += 7) {
      auto b = bytes;
      b[i] ^= std::byte{0x40};
      CHECK(relokv::decode_block(b, kFp, h.layout).check != block_check::kOk);
    }
    for (std::size_t n = 0; n < bytes.size(); n += 13)
      CHECK(relokv::decode_block(std::span(bytes).first(n), kFp, h.layout).check ==
            block_check::kMalformed);
    auto longer = bytes;
    longer.push_back(std::byte{0});
    CHECK(relokv::decode_block(longer, kFp, h.layout).check == block_check::kMalformed);
  }
  SECTION("another version, even with a valid checksum") {
    auto b = bytes;
    b[4] = std::byte{1};  // version 1: identities of unbounded size
    rechecksum(b);
    CHECK(relokv::decode_block(b, kFp, h.layout).check == block_check::kVersion);
  }
  SECTION("a sealed block reaches a reader without the key: kSealed, never used") {
    auto b = bytes;
    b[relokv::kBlockSealOffset] = std::byte{1};
    rechecksum(b);
    CHECK(relokv::decode_block(b, kFp, h.layout).check == block_check::kSealed);
  }
  SECTION("a payload of no size this layout has is rejected before it is hashed") {
    // A blob of another layout's size with a wrong checksum: the size check comes first, so
    // it reads kLayout (a checksum computed first would read kChecksum), and the reader never
    // hashes more than one block of its own layout.
    auto l = h.layout;
    l.num_layers = 1;  // a smaller payload per slot
    auto b = bytes;
    b[b.size() - 1] ^= std::byte{1};  // checksum broken
    CHECK(relokv::decode_block(b, kFp, l).check == block_check::kLayout);
    CHECK(relokv::decode_block(b, kFp, h.layout).check == block_check::kChecksum);
  }
  SECTION("sizes that lie are malformed, not read past") {
    for (const std::uint32_t lie : {0x7fffffffu, 11u, 13u}) {
      auto b = bytes;
      std::memcpy(b.data() + relokv::kBlockHeaderBytes + relokv::kBlockDigestBytes + 4, &lie, 4);
      rechecksum(b);
      CHECK(relokv::decode_block(b, kFp, h.layout).check == block_check::kMalformed);
    }
    auto b = bytes;
    b[61] = std::byte{2};  // an origin that is neither
    rechecksum(b);
    CHECK(relokv::decode_block(b, kFp, h.layout).check == block_check::kMalformed);
  }
}

TEST_CASE("store keys: fingerprint, kind, tenant and key all separate entries", "[store]") {
  const relokv::key128 k{1, 2};
  using relokv::make_store_key;
  using K = relokv::store_entry_kind;
  const auto base = make_store_key(kFp, K::kContent, 16, {}, k);
  CHECK(base == make_store_key(kFp, K::kContent, 16, {}, k));
  CHECK_FALSE(base == make_store_key(kFp + 1, K::kContent, 16, {}, k));
  CHECK_FALSE(base == make_store_key(kFp, K::kContext, 16, {}, k));
  CHECK_FALSE(base == make_store_key(kFp, K::kContent, 32, {}, k));
  CHECK_FALSE(base == make_store_key(kFp, K::kContent, 16, {0, 0, 1}, k));
  CHECK_FALSE(base == make_store_key(kFp, K::kContent, 16, {}, relokv::key128{1, 3}));
  CHECK(base.hex().size() == 32);
}

TEST_CASE("store tier: a second instance reuses spans from the store at new positions",
          "[store][cache]") {
  relokv::memory_store store;
  instance<relokv::memory_store> writer(store), reader(store);
  const auto l1 = rag({&kA, &kB});  // sys(2) A(2) B(2) Q(1)
  const auto p1 = writer.serve(l1);
  CHECK(p1.store_hits == 0);
  CHECK(writer.cache.stats().store_misses == 6);
  // The prefix as context entries, each span's blocks as content entries; not the open
  // question block.
  CHECK(writer.cache.stats().store_writes == 6);
  CHECK(store.size() == 6);

  const auto l2 = rag({&kB, &kA});  // sys(2) B(2) A(2) Q(1): both spans moved
  auto p2 = reader.cache.plan(l2);
  REQUIRE(p2.ok());
  CHECK(p2.store_hits == 6);
  CHECK(p2.exact_hits == 2);
  CHECK(p2.relocated_hits == 4);
  CHECK(count_tier(p2, block_tier::kStore) == 6);
  CHECK(count_tier(p2, block_tier::kComputed) == 1);
  CHECK(p2.fetches.size() == 6);
  CHECK(p2.tokens_to_compute == 5);
  compute(reader.kv, l2, p2);
  CHECK(holds_request(reader.kv, l2, p2));  // the fetched bytes are the writer's K and V
  reader.cache.commit(p2.id, reader.kv);
  reader.cache.release(p2.id);
  CHECK(reader.cache.stats().store_writes == 0);  // nothing was computed from nothing

  // Committed fetches live in the reader's pool now: the next request finds them there.
  const auto p3 = reader.serve(l2);
  CHECK(p3.store_hits == 0);
  CHECK(count_tier(p3, block_tier::kPool) == 6);
  CHECK(p3.blocks[2].physical == p2.blocks[2].physical);
}

TEST_CASE("store tier: no fetch crosses tenants, even under a blind hash", "[store][cache]") {
  relokv::memory_store store;
  instance<relokv::memory_store, blind_hash> a(store), b(store);
  const auto l = rag({&kA, &kB});
  (void)a.serve(l, true, {0, 0, 111});
  const auto pb = b.serve(l, true, {0, 0, 222});
  CHECK(pb.store_hits == 0);
  CHECK(b.cache.stats().store_rejected_total() == 0);  // other names: not even read

  SECTION("another tenant's bytes filed under this tenant's key are rejected") {
    relokv::memory_store s2;
    instance<relokv::memory_store, blind_hash> x(s2), y(s2);
    (void)x.serve(l, true, {0, 0, 111});
    const auto keys = s2.keys();
    // Forge: every entry copied under the key tenant 222 would look up.
    relokv::memory_store forged;
    instance<relokv::memory_store, blind_hash> z(forged);
    (void)z.serve(l, true, {0, 0, 222});
    const auto wanted = forged.keys();
    REQUIRE(wanted.size() == keys.size());
    relokv::memory_store mixed;
    for (std::size_t i = 0; i < keys.size(); ++i) mixed.overwrite(wanted[i], s2.bytes_of(keys[0]));
    instance<relokv::memory_store, blind_hash> victim(mixed);
    const auto pv = victim.serve(l, false, {0, 0, 222});
    CHECK(pv.store_hits == 0);
    const auto& st = victim.cache.stats();
    CHECK(st.store_misses == 0);  // every lookup found a (forged) entry ...
    CHECK(st.store_rejected[static_cast<int>(block_check::kIdentity)] == st.store_lookups);
  }
}

TEST_CASE("store tier: colliding cache keys never hand out another span", "[store][cache]") {
  // constant_hash gives every content block of a tenant one store key: entries overwrite
  // each other and every fetch of another span must fail its identity check.
  relokv::memory_store store;
  instance<relokv::memory_store, constant_hash> w(store), r(store);
  (void)w.serve(rag({&kA}));
  (void)w.serve(rag({&kB}));
  const auto l = rag({&kA});
  auto p = r.cache.plan(l);
  REQUIRE(p.ok());
  compute(r.kv, l, p);
  CHECK(holds_request(r.kv, l, p));
  CHECK(r.cache.stats().store_rejected[static_cast<int>(block_check::kIdentity)] > 0);
  r.cache.release(p.id);
}

TEST_CASE("store tier: corrupt, truncated and foreign entries are recomputed", "[store][cache]") {
  relokv::memory_store store;
  instance<relokv::memory_store> w(store);
  const auto l = rag({&kA, &kB});
  (void)w.serve(l);
  const auto keys = store.keys();
  REQUIRE(keys.size() == 6);
  auto flipped = store.bytes_of(keys[0]);
  flipped[flipped.size() / 2] ^= std::byte{1};
  store.overwrite(keys[0], flipped);
  auto cut = store.bytes_of(keys[1]);
  cut.resize(cut.size() / 3);
  store.overwrite(keys[1], cut);
  store.overwrite(keys[2], {});
  // Another model's block (same layout, another fingerprint) under this model's key.
  relokv::memory_store other;
  instance<relokv::memory_store> m2(other, kFp + 1);
  (void)m2.serve(l);
  // Find the other model's entry for the same block: same identity, other fingerprint.
  bool forged = false;
  const auto layout = relokv::host_kv_storage<float>(kShape).block_layout();
  const auto mine_bytes = store.bytes_of(keys[3]);  // decoded blocks point into these bytes
  const auto mine = relokv::decode_block(mine_bytes, kFp, layout);
  for (const auto& ok : other.keys()) {
    const auto theirs = other.bytes_of(ok);
    const auto d = relokv::decode_block(theirs, kFp + 1, layout);
    if (d.check == block_check::kOk && mine.check == block_check::kOk &&
        d.identity.size() == mine.identity.size() &&
        std::memcmp(d.identity.data(), mine.identity.data(), d.identity.size()) == 0) {
      store.overwrite(keys[3], other.bytes_of(ok));
      forged = true;
    }
  }
  REQUIRE(forged);

  instance<relokv::memory_store> r(store);
  const auto p = r.serve(l);  // serve checks every slot holds the right K and V
  CHECK(p.store_hits == 2);
  const auto& st = r.cache.stats();
  CHECK(st.store_rejected[static_cast<int>(block_check::kChecksum)] == 1);
  CHECK(st.store_rejected[static_cast<int>(block_check::kMalformed)] == 2);
  CHECK(st.store_rejected[static_cast<int>(block_check::kFingerprint)] == 1);
  // The recomputed blocks are written back over the bad entries.
  CHECK(st.store_writes == 4);
  instance<relokv::memory_store> again(store);
  CHECK(again.serve(l).store_hits == 6);
}

namespace {
/// A store that is down: every call is unavailable.
struct down_store {
  relokv::store_counters c;
  relokv::store_status get(std::span<const relokv::store_key> k,
                           std::vector<relokv::store_blob>& o) {
    o.assign(k.size(), {});
    ++c.unavailable;
    return relokv::store_status::kUnavailable;
  }
  relokv::store_status put(std::span<const relokv::store_key>,
                           std::span<const std::span<const std::byte>>) {
    ++c.unavailable;
    return relokv::store_status::kUnavailable;
  }
  relokv::store_status contains(std::span<const relokv::store_key> k,
                                std::vector<std::uint8_t>& o) {
    o.assign(k.size(), 0);
    return relokv::store_status::kUnavailable;
  }
  relokv::store_status erase(std::span<const relokv::store_key>) {
    return relokv::store_status::kUnavailable;
  }
  [[nodiscard]] relokv::store_counters counters() const noexcept { return c; }
};
static_assert(relokv::kv_store<down_store>);
}  // namespace

TEST_CASE("store tier: a store that is down costs nothing but the reuse", "[store][cache]") {
  instance<down_store> e(down_store{});
  const auto l = rag({&kA, &kB});
  const auto p = e.serve(l);
  CHECK(p.misses == 7);
  CHECK(e.cache.stats().store_unavailable == 1);
  CHECK(e.cache.stats().store_write_failures == 6);
  // The pool still works.
  CHECK(e.serve(l).exact_hits == 6);
}

TEST_CASE("store tier: misuse is an error that changes nothing", "[store][cache]") {
  relokv::memory_store store;
  instance<relokv::memory_store> e(store);
  const auto l = rag({&kA});
  auto p = e.cache.plan(l);
  REQUIRE(p.ok());
  CHECK_THROWS_AS(e.cache.commit(p.id), relokv::error);  // the store needs the storage
  relokv::host_kv_storage<float> other({2, 32, 2, 16, 16});
  CHECK_THROWS_AS(e.cache.commit(p.id, other), relokv::error);  // another layout
  compute(e.kv, l, p);
  e.cache.commit(p.id, e.kv);  // still committable
  e.cache.release(p.id);
  CHECK(store.size() == 4);

  const auto layout = relokv::host_kv_storage<float>(kShape).block_layout();
  auto bad = layout;
  bad.block_size = 32;
  using cache_t = instance<relokv::memory_store>::cache_t;
  CHECK_THROWS_AS(cache_t(relokv::lru_block_pool(4), 16, {}, {}, store, {kFp, bad}), relokv::error);
  bad = layout;
  bad.elem_bytes = 0;
  CHECK_THROWS_AS(cache_t(relokv::lru_block_pool(4), 16, {}, {}, store, {kFp, bad}), relokv::error);
  relokv::reuse_plan q;
  q.fetches.push_back({0, 16, 0, {}, {}});
  CHECK_THROWS_AS(relokv::apply_fetches(e.kv, q.fetches), relokv::error);
}

TEST_CASE("store tier: an exhausted pool takes nothing, fetched or not", "[store][cache]") {
  relokv::memory_store store;
  instance<relokv::memory_store> w(store);
  const auto l = rag({&kA, &kB});
  (void)w.serve(l);
  instance<relokv::memory_store> r(store, kFp, {}, 5);
  auto p = r.cache.plan(l);
  CHECK(p.status == relokv::plan_status::kOutOfBlocks);
  CHECK(p.blocks_short == 2);
  CHECK(p.fetches.empty());
  CHECK(r.cache.allocator().num_free() == 5);
  CHECK(r.cache.live_requests() == 0);
}

TEST_CASE("store tier: a partly recomputed fetch keeps a clean copy in the pool",
          "[store][cache]") {
  relokv::memory_store store;
  using strat = relokv::recompute::first_k;
  instance<relokv::memory_store, relokv::xxh3_128, relokv::at_attention, strat> w(store, kFp,
                                                                                  strat(4));
  (void)w.serve(rag({&kA, &kB}));
  instance<relokv::memory_store, relokv::xxh3_128, relokv::at_attention, strat> r(store, kFp,
                                                                                  strat(4));
  const auto l = rag({&kB, &kA});
  auto p = r.cache.plan(l);
  REQUIRE(p.ok());
  // Each span's first block: fetched into a clean block, copied into a private one whose
  // first 4 tokens are recomputed.
  CHECK(p.store_hits == 6);
  CHECK(p.copies.size() == 2);
  const auto& b2 = p.blocks[2];
  CHECK(b2.copy_on_write);
  CHECK(b2.tier == block_tier::kStore);
  CHECK(b2.source != b2.physical);
  compute(r.kv, l, p);
  CHECK(holds_request(r.kv, l, p));
  r.cache.commit(p.id, r.kv);
  r.cache.release(p.id);
  auto p2 = r.cache.plan(l);
  CHECK(p2.store_hits == 0);
  CHECK(p2.blocks[2].source == b2.source);  // the clean copy, from the pool
  r.cache.release(p2.id);
}

TEST_CASE("store tier: pre_rotated fetches at another position are rotated by the delta",
          "[store][cache]") {
  relokv::memory_store store;
  instance<relokv::memory_store, relokv::xxh3_128, relokv::pre_rotated> w(store);
  (void)w.serve(rag({&kA, &kB}));  // A at 32, B at 64
  instance<relokv::memory_store, relokv::xxh3_128, relokv::pre_rotated> r(store);
  auto p = r.cache.plan(rag({&kB, &kA}));  // B at 32, A at 52
  REQUIRE(p.ok());
  CHECK(p.store_hits == 6);
  REQUIRE(p.copies.size() == 4);
  for (const auto& c : p.copies) CHECK(c.rotates());
  CHECK(p.copies[0].src_pos0 == 52);  // B's first block was written at 52
  CHECK(p.copies[0].dst_pos0 == 20);
  r.cache.release(p.id);
  // Another placement's blocks never match (the fingerprint would differ too).
  instance<relokv::memory_store> at(store);
  auto q = at.cache.plan(rag({&kA, &kB}));
  CHECK(q.store_hits == 0);
  CHECK(at.cache.stats().store_rejected[static_cast<int>(block_check::kFingerprint)] == 6);
  at.cache.release(q.id);
}

TEST_CASE("file_store: whole entries, mmap reads, bad entries rejected", "[store][file]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("relokv_file_store_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    relokv::file_store fs(dir);
    const relokv::store_key k1{1, 1}, k2{2, 2};
    const std::vector<std::byte> v(1000, std::byte{42});
    const std::span<const std::byte> views[] = {v};
    const relokv::store_key ks[] = {k1};
    REQUIRE(fs.put(ks, views) == relokv::store_status::kOk);
    std::vector<relokv::store_blob> out;
    const relokv::store_key both[] = {k1, k2};
    REQUIRE(fs.get(both, out) == relokv::store_status::kOk);
    REQUIRE(out.size() == 2);
    CHECK(out[0].size() == 1000);
    CHECK(out[0].bytes()[999] == std::byte{42});
    CHECK(out[1].empty());
    std::vector<std::uint8_t> has;
    (void)fs.contains(both, has);
    CHECK(has == std::vector<std::uint8_t>{1, 0});
    // No temporary file is left behind.
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      ++files;
      CHECK(e.path().extension() == ".rkv");
    }
    CHECK(files == 1);
    (void)fs.erase(ks);
    (void)fs.contains(both, has);
    CHECK(has == std::vector<std::uint8_t>{0, 0});
  }
  SECTION("the cache over files: reuse, then a truncated entry is a miss") {
    relokv::file_store fs(dir);
    instance<relokv::file_store> w(fs), r(fs);
    const auto l = rag({&kA, &kB});
    (void)w.serve(l);
    // Truncate one entry on disk (as a crashed, non-renaming writer would leave it).
    const auto victim = std::filesystem::directory_iterator(dir)->path();
    std::filesystem::resize_file(victim, 100);
    const auto p = r.serve(rag({&kB, &kA}));
    CHECK(p.store_hits == 5);
    CHECK(r.cache.stats().store_rejected[static_cast<int>(block_check::kMalformed)] == 1);
  }
  SECTION("a path that is a file is a clear error") {
    std::filesystem::create_directories(dir);
    const auto f = dir / "plain";
    std::ofstream(f) << "x";
    CHECK_THROWS_AS(relokv::file_store(f), relokv::error);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("any_store: one type for a store chosen at run time", "[store]") {
  relokv::any_store none;
  CHECK_FALSE(none);
  std::vector<relokv::store_blob> out;
  const relokv::store_key k[] = {{1, 2}};
  CHECK(none.get(k, out) == relokv::store_status::kOk);
  CHECK(out.size() == 1);
  CHECK(out[0].empty());
  relokv::memory_store m;
  instance<relokv::any_store> w{relokv::any_store(m)}, r{relokv::any_store(m)};
  (void)w.serve(rag({&kA}));
  CHECK(r.serve(rag({&kA})).store_hits == 4);
  CHECK(r.cache.store().counters().keys_found == 4);
  CHECK(relokv::any_store::from_url("memory:").operator bool());
  CHECK_THROWS_AS(relokv::any_store::from_url("ftp://x"), relokv::error);
}

TEST_CASE("file_store: private directories and files, one directory per tenant prefix",
          "[store][file]") {
  const auto root =
      std::filesystem::temp_directory_path() / ("relokv_file_perm_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  const mode_t old = ::umask(0);  // the modes hold whatever the umask lets through
  relokv::file_store_options a_opt, b_opt;
  a_opt.prefix = "tenant-a";
  b_opt.prefix = "tenant-b";
  relokv::file_store a(root / "store", a_opt), b(root / "store", b_opt);
  ::umask(old);
  const auto mode = [](const std::filesystem::path& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return st.st_mode & 07777;
  };
  CHECK(mode(root) == 0700);
  CHECK(mode(root / "store") == 0700);
  CHECK(mode(root / "store" / "tenant-a") == 0700);
  CHECK(a.directory() == root / "store" / "tenant-a");
  const relokv::store_key k[] = {{7, 7}};
  const std::byte bytes[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  const std::span<const std::byte> v[] = {bytes};
  REQUIRE(a.put(k, v) == relokv::store_status::kOk);
  CHECK(mode(a.path_of(k[0])) == 0600);
  // Tenants apart: B's directory holds nothing of A's.
  std::vector<relokv::store_blob> out;
  REQUIRE(b.get(k, out) == relokv::store_status::kOk);
  CHECK(out[0].empty());
  REQUIRE(a.get(k, out) == relokv::store_status::kOk);
  CHECK(out[0].size() == 3);
  for (const char* bad : {"..", ".", "a/b", "x y", "../up"}) {
    relokv::file_store_options o;
    o.prefix = bad;
    CHECK_THROWS_AS(relokv::file_store(root / "store", o), relokv::error);
  }
  // From a URL, as relokv_rag --store takes it.
  const auto s = relokv::any_store::from_url("file:" + (root / "u").string() + "?prefix=t1");
  CHECK(std::filesystem::is_directory(root / "u" / "t1"));
  CHECK(mode(root / "u" / "t1") == 0700);
  std::filesystem::remove_all(root);
}

TEST_CASE("file_store: a FIFO or symlink or huge file under an entry is a miss, not a stall",
          "[store][file]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("relokv_file_hostile_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  relokv::file_store_options o;
  o.max_entry_bytes = 1 << 20;
  relokv::file_store fs(dir, o);
  const relokv::store_key fifo{1, 1}, link{2, 2}, huge{3, 3}, good{4, 4};
  REQUIRE(::mkfifo(fs.path_of(fifo).c_str(), 0600) == 0);  // no writer: open would block
  {
    std::ofstream secret(dir / "secret");
    secret << std::string(100, 's');
  }
  std::filesystem::create_symlink(dir / "secret", fs.path_of(link));
  {
    std::ofstream big(fs.path_of(huge));
    big.seekp((std::streamoff{1} << 30) - 1);  // a sparse 1 GiB file
    big.put('x');
  }
  const std::byte bytes[5] = {};
  const std::span<const std::byte> v[] = {bytes};
  REQUIRE(fs.put(std::span(&good, 1), v) == relokv::store_status::kOk);
  const relokv::store_key keys[] = {fifo, link, huge, good};
  std::vector<relokv::store_blob> out;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(fs.get(keys, out) == relokv::store_status::kOk);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));  // no FIFO wait
  CHECK(out[0].empty());
  CHECK(out[1].empty());  // not followed
  CHECK(out[2].empty());  // not read: larger than any block
  CHECK(out[3].size() == 5);
  CHECK(fs.counters().oversized == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("file_store: an entry truncated while it is read never faults the reader",
          "[store][file]") {
  // Another process truncates entries in place (which writers must not do) while this one
  // reads them over and over. The reader survives (a mapping takes SIGBUS on the pages past
  // the new end) and hands on nothing longer than what was written; what a racing truncate
  // leaves inside the bytes (the kernel may fill them with zeros) is the block checksum's to
  // reject, as for any torn entry.
  const auto dir =
      std::filesystem::temp_directory_path() / ("relokv_file_trunc_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  relokv::file_store fs(dir);
  const relokv::store_key k{5, 5};
  const std::vector<std::byte> value(1 << 20, std::byte{7});
  const std::span<const std::byte> v[] = {value};
  std::atomic<bool> stop{false};
  std::thread truncator([&] {
    while (!stop) {
      (void)::truncate(fs.path_of(k).c_str(), 4096);
      std::this_thread::yield();
    }
  });
  int whole = 0, cut = 0, missed = 0;
  std::vector<relokv::store_blob> out;
  for (int i = 0; i < 100; ++i) {
    REQUIRE(fs.put(std::span(&k, 1), v) == relokv::store_status::kOk);
    REQUIRE(fs.get(std::span(&k, 1), out) == relokv::store_status::kOk);
    // Read whole at the size it had when opened (written, or cut to 4,096), or a miss.
    if (out[0].empty())
      ++missed;
    else if (out[0].size() == value.size())
      ++whole;
    else if (out[0].size() == 4096)
      ++cut;
  }
  stop = true;
  truncator.join();
  INFO(whole << " whole, " << cut << " cut to 4,096, " << missed << " misses");
  CHECK(whole + cut + missed == 100);
  std::filesystem::remove_all(dir);
}

TEST_CASE("store URLs: passwords never reach a message or a report", "[store]") {
  CHECK(relokv::redact_url("redis://alice:s3cret@h:1/0") == "redis://alice:***@h:1/0");
  CHECK(relokv::redact_url("redis://:s3cret@h") == "redis://:***@h");
  CHECK(relokv::redact_url("redis://a:p/w?x@y@h:1") == "redis://a:***@h:1");  // '/', '?', '@'
  CHECK(relokv::redact_url("redis://alice@h:1") == "redis://alice@h:1");      // no password
  CHECK(relokv::redact_url("file:/tmp/x") == "file:/tmp/x");
  try {
    (void)relokv::any_store::from_url("ftp://bob:hunter2@x");
    FAIL("no error");
  } catch (const relokv::error& e) {
    CHECK(std::string(e.what()).find("hunter2") == std::string::npos);
  }
}

TEST_CASE("store tier: blocks a static strategy recomputes whole are not fetched",
          "[store][cache]") {
  relokv::memory_store store;
  using strat = relokv::recompute::first_k;
  instance<relokv::memory_store> w(store);
  (void)w.serve(rag({&kA, &kB}));
  // EPIC with k = 16 recomputes each span's first block whole: fetching it would be wasted.
  instance<relokv::memory_store, relokv::xxh3_128, relokv::at_attention, strat> r(store, kFp,
                                                                                  strat(16));
  const auto p = r.serve(rag({&kB, &kA}));
  CHECK(r.cache.stats().store_lookups == 4);  // sys x2, and each span's second block
  CHECK(p.store_hits == 4);
  CHECK(count_tier(p, block_tier::kComputed) == 3);  // two first blocks and the question
  // Nor are they written back: the store holds them as computed in their own context.
  CHECK(r.cache.stats().store_writes == 0);
}
