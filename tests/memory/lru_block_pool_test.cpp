#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/memory/lru_block_pool.hpp>

#include <cstdint>
#include <vector>

#include "support/catch.hpp"

TEST_CASE("lru_block_pool: allocation, refcounts and exhaustion", "[memory]") {
  relokv::lru_block_pool pool(3);
  CHECK(pool.capacity() == 3);
  CHECK(pool.num_free() == 3);
  const auto a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  REQUIRE(a.status == relokv::alloc_status::kOk);
  REQUIRE(c.status == relokv::alloc_status::kOk);
  CHECK(pool.num_free() == 0);
  const auto d = pool.allocate();
  CHECK(d.status == relokv::alloc_status::kOutOfBlocks);  // a status, not an abort
  CHECK(d.block == relokv::kNoBlock);
  pool.retain(b.block);
  CHECK(pool.ref_count(b.block) == 2);
  pool.release(b.block);
  CHECK(pool.num_free() == 0);
  pool.release(b.block);
  CHECK(pool.num_free() == 1);
  CHECK(pool.allocate().block == b.block);
  CHECK_THROWS_AS(relokv::lru_block_pool(0), relokv::error);
}

TEST_CASE("lru_block_pool: uncached blocks first, then least recently freed", "[memory]") {
  relokv::lru_block_pool pool(4);
  std::vector<relokv::block_id> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(pool.allocate().block);
  pool.set_cached(ids[0], true);
  pool.set_cached(ids[1], true);
  pool.set_cached(ids[2], true);
  // a request frees its tail first: 2, 1, 0; block 3 was never cached
  pool.release(ids[2]);
  pool.release(ids[1]);
  pool.release(ids[0]);
  pool.release(ids[3]);
  CHECK(pool.free_order() == std::vector<relokv::block_id>{ids[3], ids[2], ids[1], ids[0]});
  auto r = pool.allocate();
  CHECK(r.block == ids[3]);
  CHECK_FALSE(r.evicted);
  // A hit on a free cached block takes it out of the eviction queue.
  pool.retain(ids[2]);
  r = pool.allocate();
  CHECK(r.block == ids[1]);
  CHECK(r.evicted);
  CHECK_FALSE(pool.is_cached(ids[1]));
  pool.release(ids[2]);  // most recently freed now
  CHECK(pool.free_order() == std::vector<relokv::block_id>{ids[0], ids[2]});
  // Uncaching a free block moves it to the front.
  pool.set_cached(ids[2], false);
  CHECK(pool.free_order() == std::vector<relokv::block_id>{ids[2], ids[0]});
}

TEST_CASE("host_kv_storage: layout and copy on write", "[memory]") {
  relokv::kv_shape s{2, 3, 2, 4, 8};
  relokv::host_kv_storage<float> st(s);
  CHECK(st.bytes() == 2u * 3u * 2u * 2u * 4u * 8u * sizeof(float));
  // [layer][block][k|v][head][slot][dim]
  CHECK(st.tile(1, 2, 1, 1) - st.data() ==
        static_cast<std::ptrdiff_t>(((((1 * 3 + 2) * 2 + 1) * 2 + 1) * 4) * 8));
  st.tile(0, 1, 0, 0)[5] = 1.5f;
  st.tile(1, 1, 1, 1)[31] = -2.f;
  st.copy_block(1, 2);
  CHECK(st.tile(0, 2, 0, 0)[5] == 1.5f);
  CHECK(st.tile(1, 2, 1, 1)[31] == -2.f);
  CHECK(st.tile(0, 1, 0, 0)[5] == 1.5f);
  CHECK_THROWS_AS(relokv::host_kv_storage<float>(relokv::kv_shape{0, 1, 1, 1, 1}), relokv::error);
}

TEST_CASE("host_kv_storage: large pools are 2 MiB aligned (huge pages), small ones work alike",
          "[memory]") {
  // 8 MiB of bf16: the huge-page path; it must be zeroed and usable end to end.
  relokv::host_kv_storage<relokv::bf16> big(relokv::kv_shape{1, 128, 8, 16, 128});
  CHECK(big.bytes() == std::size_t{8} << 20);
  CHECK(reinterpret_cast<std::uintptr_t>(big.data()) % (std::uintptr_t{2} << 20) == 0);
  CHECK(big.data()[0].bits == 0);
  big.tile(0, 127, 1, 7)[16 * 128 - 1] = relokv::bf16::from_float(3.0f);
  big.copy_block(127, 0);
  CHECK(big.tile(0, 0, 1, 7)[16 * 128 - 1].to_float() == 3.0f);
  relokv::host_kv_storage<relokv::bf16> small(relokv::kv_shape{1, 1, 1, 16, 64});
  CHECK(small.data()[16 * 64 * 2 - 1].bits == 0);
}
