// libFuzzer target: bytes fetched from a store, plain or sealed. decode_block must classify
// any input without reading outside it; a block it accepts has a payload inside the bytes and
// of the layout's size. The first byte picks a mode:
//   0  the bytes as they are;
//   1  with a valid checksum first, so the parser behind it is reached too;
//   2  the bytes opened as a sealed entry (sealed_store::open), then decoded if they open;
//   3  with a valid checksum, sealed, then opened: the round trip must give the bytes back,
//      and the sealed entry with any one byte changed (picked by the input) must not open.
#include <relokv/store/block_format.hpp>
#include <relokv/store/memory_store.hpp>
#include <relokv/store/sealed_store.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

void check_decoded(const std::vector<std::byte>& b) {
  const relokv::kv_block_layout layout{1, 1, 2, 4, 0, 4};
  const auto d = relokv::decode_block(b, 0x1234, layout);
  if (d.check != relokv::block_check::kOk) return;
  const auto* lo = b.data();
  const auto* hi = b.data() + b.size();
  if (d.payload.data() < lo || d.payload.data() + d.payload.size() > hi || d.identity.data() < lo ||
      d.identity.data() + d.identity.size() > hi ||
      d.payload.size() != layout.payload_bytes(d.header.len))
    std::abort();
  const relokv::token_t toks[4] = {1, 2, 3, 4};
  (void)relokv::same_identity(
      d, d.header.key, d.header.kind, d.header.extras,
      {{}, 0x101, std::span(toks).first(static_cast<std::size_t>(d.header.len))});
}

relokv::sealed_store<relokv::memory_store>& sealer() {
  static relokv::sealed_store<relokv::memory_store> s(
      relokv::memory_store{}, relokv::seal_key::from_hex("000102030405060708090a0b0c0d0e0f"
                                                         "101112131415161718191a1b1c1d1e1f",
                                                         "fuzz"));
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const int mode = data[0] & 3;
  const std::size_t pick = data[1];
  std::vector<std::byte> b(size - 2);
  if (!b.empty()) std::memcpy(b.data(), data + 2, size - 2);
  if ((mode == 1 || mode == 3) && b.size() >= 8) {
    const std::uint64_t sum = XXH3_64bits(b.data(), b.size() - 8);
    std::memcpy(b.data() + b.size() - 8, &sum, 8);
  }
  if (mode <= 1) {
    check_decoded(b);
    return 0;
  }
  std::vector<std::byte> opened, sealed;
  if (mode == 2) {
    if (sealer().open(b, opened)) check_decoded(opened);
    return 0;
  }
  if (!sealer().seal(b, sealed)) return 0;
  if (!sealer().open(sealed, opened) || opened != b) std::abort();
  check_decoded(opened);
  sealed[(pick * 131) % sealed.size()] ^= std::byte{0x01};
  if (sealer().open(sealed, opened)) std::abort();
  return 0;
}
