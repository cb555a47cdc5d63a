// Sealed blocks (sealed_store): what a co-tenant who can write to the store can and cannot do,
// with and without keys; seal keys from files and variables; the provenance policy through a
// store.
#include <relokv/store/block_format.hpp>
#include <relokv/store/memory_store.hpp>
#include <relokv/store/sealed_store.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/store_fixture.hpp"

using relokv::block_check;
using relokv::token_t;

namespace {
using namespace relokv_test::store_fixture;

relokv::seal_key key_of(unsigned char fill) {
  std::array<std::byte, 32> b{};
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(fill + i);
  return relokv::seal_key(b);
}

using sealed_t = relokv::sealed_store<relokv::memory_store>;

/// Every entry of a store, by key (a memory_store's handles share its map).
std::vector<std::pair<relokv::store_key, std::vector<std::byte>>> entries(
    relokv::memory_store& m, std::span<const relokv::store_key> keys) {
  std::vector<relokv::store_blob> blobs;
  REQUIRE(m.get(keys, blobs) == relokv::store_status::kOk);
  std::vector<std::pair<relokv::store_key, std::vector<std::byte>>> out;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (!blobs[i].empty())
      out.emplace_back(keys[i],
                       std::vector<std::byte>(blobs[i].bytes().begin(), blobs[i].bytes().end()));
  return out;
}

/// The store keys a victim's request (prefix, kA, question) writes: recorded by a store double.
struct recording_store : relokv::memory_store {
  std::vector<relokv::store_key>* keys;
  recording_store(relokv::memory_store m, std::vector<relokv::store_key>* k)
      : relokv::memory_store(std::move(m)), keys(k) {}
  relokv::store_status put(std::span<const relokv::store_key> k,
                           std::span<const std::span<const std::byte>> v) {
    keys->insert(keys->end(), k.begin(), k.end());
    return relokv::memory_store::put(k, v);
  }
};

bool contains_bytes(std::span<const std::byte> hay, std::span<const token_t> needle) {
  const auto* n = reinterpret_cast<const std::byte*>(needle.data());
  return std::search(hay.begin(), hay.end(), n, n + needle.size_bytes()) != hay.end();
}

}  // namespace

TEST_CASE("sealed blocks: a writer without the key can neither read nor forge", "[store][seal]") {
  relokv::memory_store shared;  // the server every tenant can write to
  std::vector<relokv::store_key> written;
  const auto request = rag({&kA});

  SECTION("without keys: the tokens are in clear, and a forged entry is served") {
    instance<recording_store> writer(recording_store(shared, &written));
    (void)writer.serve(request);
    auto stored = entries(shared, written);
    REQUIRE(stored.size() >= 3);
    bool tokens_visible = false;
    for (auto& [k, b] : stored) tokens_visible |= contains_bytes(b, std::span(kA).first(8));
    CHECK(tokens_visible);  // the disclosure a key prevents
    for (auto& [k, b] : stored) {
      const auto f = forge(b);
      const std::span<const std::byte> v(f);
      REQUIRE(shared.put(std::span(&k, 1), std::span(&v, 1)) == relokv::store_status::kOk);
    }
    instance<relokv::memory_store> reader(shared);
    const auto p = reader.cache.plan(request);
    REQUIRE(p.ok());
    CHECK(p.store_hits == static_cast<std::int32_t>(stored.size()));  // every forged block served
    CHECK(reader.cache.stats().store_rejected_total() == 0);
    reader.cache.release(p.id);
  }
  SECTION("with keys: sealed, opened by the key, forgeries are misses") {
    instance<relokv::sealed_store<recording_store>> writer(
        relokv::sealed_store<recording_store>(recording_store(shared, &written), key_of(1)));
    (void)writer.serve(request);
    auto stored = entries(shared, written);
    REQUIRE(stored.size() >= 3);
    for (auto& [k, b] : stored) {
      CHECK_FALSE(contains_bytes(b, std::span(kA).first(8)));  // tokens encrypted
      CHECK(b[relokv::kBlockSealOffset] == std::byte{1});
    }
    SECTION("the key opens them: hits, K/V exact") {
      instance<sealed_t> reader(sealed_t(shared, key_of(1)));
      const auto p = reader.serve(request);
      CHECK(p.store_hits == static_cast<std::int32_t>(stored.size()));
      CHECK(reader.cache.store().counters().open_failures == 0);
    }
    SECTION("another key finds none: its keyed names differ") {
      // (A memory_store's counters are shared by its handles: count this reader's finds.)
      const auto before = shared.counters().keys_found;
      instance<sealed_t> reader(sealed_t(shared, key_of(2)));
      const auto p = reader.serve(request);
      CHECK(p.store_hits == 0);
      CHECK(shared.counters().keys_found == before);
      CHECK(reader.cache.store().counters().open_failures == 0);
    }
    SECTION("another key opens none, even filed under its own names") {
      // The store keys of the request, from an unsealed writer elsewhere (deterministic).
      relokv::memory_store scratch;
      std::vector<relokv::store_key> plain_keys;
      instance<recording_store> w(recording_store(scratch, &plain_keys));
      (void)w.serve(request);
      REQUIRE(plain_keys.size() == stored.size());
      sealed_t first(relokv::memory_store{}, key_of(1)), other(relokv::memory_store{}, key_of(2));
      for (const auto& k : plain_keys) {
        std::vector<relokv::store_blob> got;
        const relokv::store_key n1 = first.keyed_name(k), n2 = other.keyed_name(k);
        REQUIRE(shared.get(std::span(&n1, 1), got) == relokv::store_status::kOk);
        REQUIRE_FALSE(got[0].empty());
        const std::span<const std::byte> v = got[0].bytes();
        REQUIRE(shared.put(std::span(&n2, 1), std::span(&v, 1)) == relokv::store_status::kOk);
      }
      instance<sealed_t> reader(sealed_t(shared, key_of(2)));
      const auto p = reader.serve(request);
      CHECK(p.store_hits == 0);
      CHECK(reader.cache.store().counters().open_failures ==
            static_cast<std::int64_t>(stored.size()));
    }
    SECTION("a reader without a key finds none") {
      const auto before = shared.counters().keys_found;
      instance<relokv::memory_store> reader(shared);
      const auto p = reader.serve(request, false);
      CHECK(p.store_hits == 0);
      CHECK(shared.counters().keys_found == before);
    }
    SECTION("forgeries by a co-tenant without the key: 0 served") {
      // (a) the unsealed forgery of the no-key section; (b) the sealed entry with its
      // ciphertext edited; (c) the header edited (moved to another tenant, or another origin).
      const int variant = GENERATE(0, 1, 2, 3);
      for (auto& [k, b] : stored) {
        std::vector<std::byte> f = b;
        if (variant == 0) {
          f = strip_and_forge(f);
        } else if (variant == 1) {
          f[f.size() / 2] ^= std::byte{1};
        } else if (variant == 2) {
          f[relokv::kBlockTenantSaltOffset] ^= std::byte{1};
        } else {
          f[61] ^= std::byte{1};  // canonical <-> in context
        }
        const std::span<const std::byte> v(f);
        REQUIRE(shared.put(std::span(&k, 1), std::span(&v, 1)) == relokv::store_status::kOk);
      }
      instance<sealed_t> reader(sealed_t(shared, key_of(1)));
      const auto p = reader.serve(request);
      CHECK(p.store_hits == 0);
      CHECK(reader.cache.store().counters().open_failures ==
            static_cast<std::int64_t>(stored.size()));
      CHECK(holds_request(reader.kv, request, p));  // computed, not forged
    }
  }
}

TEST_CASE("sealed blocks: tenant keys, every byte authenticated", "[store][seal]") {
  const relokv::seal_key k = key_of(7);
  CHECK(k.tenant_key(1) != k.tenant_key(2));
  CHECK(k.tenant_key(1) == k.tenant_key(1));
  CHECK(k.tenant_key(1) != key_of(8).tenant_key(1));

  relokv::block_header h;
  h.fingerprint = kFp;
  h.key = {1, 2};
  h.layout = relokv::host_kv_storage<float>(kShape).block_layout();
  h.len = 16;
  h.extras = {0, 0, 42};
  const auto toks = seq(5, 16);
  std::vector<std::byte> plain, sealed, opened;
  relokv::encode_block(
      h, {{}, 0, toks},
      [](std::span<std::byte> p) {
        for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::byte>(i);
      },
      plain);
  sealed_t s(relokv::memory_store{}, k);
  REQUIRE(s.seal(plain, sealed));
  CHECK(sealed.size() == plain.size() + relokv::kSealTagBytes);
  REQUIRE(s.open(sealed, opened));
  CHECK(opened == plain);
  std::vector<std::byte> again;
  REQUIRE(s.seal(plain, again));
  CHECK(again != sealed);  // a fresh nonce each time
  for (std::size_t i = 0; i < sealed.size(); i += 5) {
    auto b = sealed;
    b[i] ^= std::byte{0x10};
    CHECK_FALSE(s.open(b, opened));
    CHECK(opened.empty());
  }
  for (std::size_t n = 0; n < sealed.size(); n += 97)
    CHECK_FALSE(s.open(std::span(sealed).first(n), opened));
  CHECK_FALSE(s.seal(sealed, again));  // sealing twice: refused
  CHECK_FALSE(s.open(plain, opened));  // an unsealed entry never opens
}

TEST_CASE("seal keys: from a file or a variable, never shown", "[store][seal]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("relokv-seal-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
  const auto write = [&](const std::string& name, const std::string& text, mode_t mode) {
    const auto p = (dir / name).string();
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p;
  };
  const auto good = write("good", hex + "\n", 0600);
  const relokv::seal_key a = relokv::seal_key::from_file(good);
  CHECK(a.tenant_key(1) == relokv::seal_key::from_hex(hex, "t").tenant_key(1));
  const auto raw = write("raw", std::string(32, 'k'), 0400);
  CHECK(relokv::seal_key::from_file(raw).tenant_key(1) != a.tenant_key(1));
  const auto never_shown = [&](const std::string& path, const std::string& why) {
    try {
      (void)relokv::seal_key::from_file(path);
      FAIL("accepted " << path);
    } catch (const relokv::error& e) {
      const std::string m = e.what();
      CHECK(m.find(why) != std::string::npos);
      CHECK(m.find("aabbcc") == std::string::npos);
    }
  };
  never_shown(write("open", hex, 0644), "group or others");
  never_shown(write("short", hex.substr(2), 0600), "64 hexadecimal digits");
  never_shown(write("bad", std::string(63, 'a') + "z", 0600), "64 hexadecimal digits");
  never_shown((dir / "missing").string(), "cannot be opened");
  never_shown(dir.string(), "not a regular file");
  ::setenv("RELOKV_TEST_SEAL_KEY", hex.c_str(), 1);
  CHECK(relokv::seal_key::from_env("RELOKV_TEST_SEAL_KEY").tenant_key(3) == a.tenant_key(3));
  ::setenv("RELOKV_TEST_SEAL_KEY", "aabbcc", 1);
  CHECK_THROWS_WITH(relokv::seal_key::from_env("RELOKV_TEST_SEAL_KEY"),
                    Catch::Contains("RELOKV_TEST_SEAL_KEY") && !Catch::Contains("aabbcc"));
  ::unsetenv("RELOKV_TEST_SEAL_KEY");
  CHECK_THROWS_WITH(relokv::seal_key::from_env("RELOKV_TEST_SEAL_KEY"), Catch::Contains("not set"));
  relokv::seal_options both{good, "X"};
  CHECK_THROWS_WITH(both.load(), Catch::Contains("not both"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("provenance through a store: in-context spans of another principal are not served",
          "[store][provenance]") {
  relokv::memory_store shared;
  // Principal 1 computes kB after kA (in context) and kA right after the prefix (canonical).
  instance<relokv::memory_store> a(shared);
  (void)a.serve(rag({&kA, &kB}), true, {}, 1);
  const auto other = rag({&kB, &kA});
  SECTION("default: principal 2 fetches kA, computes kB") {
    instance<relokv::memory_store> b(shared);
    const auto p = b.serve(other, true, {}, 2);
    CHECK(b.cache.stats().store_rejected[static_cast<int>(block_check::kProvenance)] == 2);
    CHECK(p.blocks[2].tier == block_tier::kComputed);  // kB
    CHECK(p.blocks[4].tier == block_tier::kStore);     // kA
  }
  SECTION("principal 1 itself fetches both") {
    instance<relokv::memory_store> b(shared);
    const auto p = b.serve(other, true, {}, 1);
    CHECK(b.cache.stats().store_rejected_total() == 0);
    CHECK(p.blocks[2].tier == block_tier::kStore);
  }
  SECTION("permissive: principal 2 fetches both") {
    instance<relokv::memory_store> b(shared);
    b.cache.set_provenance_policy(relokv::provenance_policy::kPermissive);
    const auto p = b.serve(other, true, {}, 2);
    CHECK(p.blocks[2].tier == block_tier::kStore);
  }
}

TEST_CASE(
    "provenance through a store: K/V computed over a reused poisoned span are not "
    "canonical",
    "[store][provenance]") {
  // Issue 45, item 1, through the store tier: principal 1 computes kB after an injection, then
  // reads kB (its own) and computes kA as a dependent window over it. kA's entries must not
  // say canonical, or another instance serves them to principal 2.
  const auto injection = seq(9000, 16);
  relokv::memory_store shared;
  instance<relokv::memory_store> a(shared);
  (void)a.serve(relokv::layout_builder(16).prefix(kSys).dependent(injection).span(kB).build(), true,
                {}, 1);
  const auto layout = relokv::layout_builder(16).prefix(kSys).span(kB).dependent(kA, 1000).build();
  const auto laundered = a.serve(layout, true, {}, 1);
  // prefix: blocks 0-1; kB: 2-3 (reused); kA: 4-5 (computed over the poisoned kB)
  REQUIRE(laundered.blocks[2].tier != block_tier::kComputed);
  REQUIRE(laundered.blocks[4].tier == block_tier::kComputed);
  CHECK_FALSE(a.cache.origin_of(laundered.blocks[4].physical).canonical);
  SECTION("default: principal 2 computes kB and kA") {
    instance<relokv::memory_store> b(shared);
    const auto p = b.serve(layout, true, {}, 2);
    CHECK(p.blocks[2].tier == block_tier::kComputed);
    CHECK(p.blocks[4].tier == block_tier::kComputed);
    CHECK(p.blocks[5].tier == block_tier::kComputed);
    CHECK(b.cache.stats().store_rejected[static_cast<int>(block_check::kProvenance)] >= 4);
  }
  SECTION("permissive (the control): principal 2 fetches principal 1's kA") {
    instance<relokv::memory_store> b(shared);
    b.cache.set_provenance_policy(relokv::provenance_policy::kPermissive);
    const auto p = b.serve(layout, true, {}, 2);
    CHECK(p.blocks[4].tier == block_tier::kStore);
  }
}

TEST_CASE("sealed blocks: entries are named by a keyed hash, not by the guessable store key",
          "[store][seal]") {
  // Issue 45, item 3. The store key is an unkeyed hash of the tokens and their context: anyone
  // who can list the store's names (or read a header) could test a guessed passage. With a
  // key, names and the header's key field are HMAC-SHA256 under a naming key.
  relokv::memory_store plain_store, sealed_store_;
  std::vector<relokv::store_key> plain_names, sealed_names;
  const auto request = rag({&kA});
  instance<recording_store> plain(recording_store(plain_store, &plain_names));
  (void)plain.serve(request);
  instance<relokv::sealed_store<recording_store>> sealed(relokv::sealed_store<recording_store>(
      recording_store(sealed_store_, &sealed_names), key_of(1)));
  (void)sealed.serve(request);
  REQUIRE(plain_names.size() == sealed_names.size());
  REQUIRE_FALSE(plain_names.empty());
  for (const auto& k : plain_names) {
    // The guessable key is no name the sealed store used...
    CHECK(std::find(sealed_names.begin(), sealed_names.end(), k) == sealed_names.end());
    // ...and each sealed name is that key's keyed name.
    CHECK(std::find(sealed_names.begin(), sealed_names.end(), sealed.cache.store().keyed_name(k)) !=
          sealed_names.end());
  }
  for (const auto& [name, b] : entries(sealed_store_, sealed_names)) {
    // The cleartext header carries the name, not the store key.
    const relokv::store_key in_header{relokv::detail::get_le<std::uint64_t>(b.data() + 16),
                                      relokv::detail::get_le<std::uint64_t>(b.data() + 24)};
    CHECK(in_header == name);
    CHECK(std::find(plain_names.begin(), plain_names.end(), in_header) == plain_names.end());
  }
  // Another master key names the same block differently; the same key, the same way.
  CHECK(sealed_t(relokv::memory_store{}, key_of(2)).keyed_name(plain_names[0]) !=
        sealed.cache.store().keyed_name(plain_names[0]));
  CHECK(sealed_t(relokv::memory_store{}, key_of(1)).keyed_name(plain_names[0]) ==
        sealed.cache.store().keyed_name(plain_names[0]));
  // And a reader with the key finds every block by those names (the store key restored).
  instance<sealed_t> reader(sealed_t(sealed_store_, key_of(1)));
  const auto p = reader.serve(request);
  CHECK(p.store_hits == static_cast<std::int32_t>(sealed_names.size()));
}

TEST_CASE("sealed blocks: opened plaintext is wiped when its last holder lets it go",
          "[store][seal]") {
  // Issue 45, item 4: a wiping pool zeroes a buffer as it returns, so the next take() of it
  // (or a heap scan) sees no plaintext of the block it held.
  relokv::detail::buffer_pool pool(/*wipe=*/true);
  std::byte* where = nullptr;
  {
    auto b = pool.take(64);
    where = b->bytes.get();
    std::fill_n(where, 64, std::byte{0x5a});
  }
  auto again = pool.take(64);
  REQUIRE(again->bytes.get() == where);  // the same buffer, reused
  CHECK(std::all_of(where, where + 64, [](std::byte c) { return c == std::byte{0}; }));
  relokv::detail::buffer_pool plain;
  std::byte* p2 = nullptr;
  {
    auto b = plain.take(64);
    p2 = b->bytes.get();
    std::fill_n(p2, 64, std::byte{0x5a});
  }
  CHECK(plain.take(64)->bytes.get() == p2);
  CHECK(p2[0] == std::byte{0x5a});  // the control: a non-wiping pool keeps the bytes

  // The sealed store's own pool wipes: a block it opened, once its last holder lets it go,
  // leaves no plaintext in the buffer the pool keeps for the next one.
  relokv::block_header h;
  h.fingerprint = kFp;
  h.key = {3, 4};
  h.layout = relokv::host_kv_storage<float>(kShape).block_layout();
  h.len = 16;
  const auto toks = seq(9, 16);
  std::vector<std::byte> block;
  relokv::encode_block(
      h, {{}, 0, toks},
      [](std::span<std::byte> q) {
        for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<std::byte>(i | 1);
      },
      block);
  sealed_t s(relokv::memory_store{}, key_of(9));
  const relokv::store_key key = h.key;
  const std::span<const std::byte> value(block);
  REQUIRE(s.put(std::span(&key, 1), std::span(&value, 1)) == relokv::store_status::kOk);
  std::vector<relokv::store_blob> out;
  REQUIRE(s.get(std::span(&key, 1), out) == relokv::store_status::kOk);
  REQUIRE(!out[0].empty());
  const std::byte* at = out[0].bytes().data();
  const std::size_t n = out[0].bytes().size();
  CHECK(contains_bytes(out[0].bytes(), toks));
  out.clear();  // the last holder lets it go; the pool keeps the buffer
  CHECK(std::all_of(at, at + n, [](std::byte c) { return c == std::byte{0}; }));
}
