// Compile-fail test for the placement being named once: the KV helpers take the placement from
// the view request_kv gives, so writing into an at_attention cache's storage as pre_rotated
// does not compile (-DRELOKV_BREAK_MISMATCH), where a bare paged_kv_view would run and give
// wrong attention. Without the macro the matching calls compile (compile_fail.placement.control).
#include <relokv/engine/request_kv.hpp>
#include <relokv/hash/xxh3.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/lru_block_pool.hpp>
#include <relokv/recompute/none.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <vector>

int main() {
  using cache_t = relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool,
                                            relokv::at_attention, relokv::recompute::none>;
  cache_t cache(relokv::lru_block_pool(4), 16);
  relokv::rope_config c;
  c.head_dim = c.rotary_dim = 64;
  const relokv::rope_table rope(c, 64);
  relokv::host_kv_storage<float> storage(relokv::kv_shape{1, 4, 1, 16, 64});
  const auto layout = relokv::layout_builder(16).prefix(std::vector<relokv::token_t>(8, 1)).build();
  relokv::request_kv req(cache, storage, rope, layout, cache.plan(layout));
  std::vector<float> k(64), q(64), out(64);
  const relokv::token_slot s = req.prefill_tokens()[0];
  const relokv::pos_t pos = s.pos();
  relokv::append_kv(rope, req.layer(0), s.block(), s.slot(), s.pos(), k.data(), k.data());
  relokv::decode_attention(rope, req.layer(0), req.table(), q.data(), &pos, 1, 1.0f, out.data());
#ifdef RELOKV_BREAK_MISMATCH
  relokv::append_kv<relokv::pre_rotated>(rope, req.layer(0), s.block(), s.slot(), s.pos(), k.data(),
                                         k.data());
#endif
  return 0;
}
