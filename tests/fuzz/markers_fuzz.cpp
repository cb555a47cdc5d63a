// libFuzzer target: the marker parser either rejects a stream with layout_error or produces a
// layout whose invariants hold; every accepted layout also goes through key derivation and a
// cache plan/commit/release.
#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/layout/markers.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {
void check(bool cond) {
  if (!cond) std::abort();
}

void check_invariants(const relokv::request_layout& l) {
  check(!l.tokens.empty());
  relokv::pos_t next = 0;
  for (std::size_t b = 0; b < l.blocks.size(); ++b) {
    const auto& e = l.blocks[b];
    check(e.pos0 == next);
    check(e.len >= 1 && e.len <= l.block_size);
    check(e.sealed || b + 1 == l.blocks.size());
    next += e.len;
  }
  check(next == l.num_tokens());
  for (const auto& s : l.segments) {
    check(s.num_tokens > 0);
    check(l.blocks[static_cast<std::size_t>(s.first_block)].pos0 == s.first_token);
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  relokv::marker_config m;
  m.separator = 250;
  m.dep_begin = 251;
  m.dep_begin_last_n = 252;
  m.dep_end = 253;
  m.pad = 254;
  m.vocab_size = 250;
  m.block_size = 1 << (data[0] % 5);
  m.max_segment_tokens = 1 + data[1] % 64;
  m.max_dep_window = 8;
  // One byte per stream element; 255 maps to an out-of-range id.
  std::vector<relokv::token_t> stream;
  for (std::size_t i = 2; i < size; ++i) stream.push_back(data[i] == 255 ? -5 : data[i]);
  relokv::request_layout l;
  try {
    l = relokv::parse_markers(stream, m);
  } catch (const relokv::layout_error& e) {
    check(e.offset() >= 0 && e.offset() <= static_cast<std::int64_t>(stream.size()));
    return 0;
  }
  check_invariants(l);
  relokv::check_layout(l);  // what plan() checks: every parsed layout passes it
  static relokv::relocatable_cache<> cache(relokv::lru_block_pool(512), 16);
  if (l.block_size == 16) {
    auto p = cache.plan(l);
    if (p.ok()) {
      check(p.blocks.size() == l.blocks.size());
      cache.commit(p.id);
      cache.release(p.id);
    }
  }
  return 0;
}
