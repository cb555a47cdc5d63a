// libFuzzer target: bytes fetched from a store. decode_block must classify any input without
// reading outside it; a block it accepts has a payload inside the bytes and of the layout's
// size. Half the inputs get a valid checksum first, so the parser behind it is reached too.
#include <relokv/store/block_format.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<std::byte> b(size - 1);
  if (!b.empty()) std::memcpy(b.data(), data + 1, size - 1);
  if ((data[0] & 1) != 0 && b.size() >= 8) {
    const std::uint64_t sum = XXH3_64bits(b.data(), b.size() - 8);
    std::memcpy(b.data() + b.size() - 8, &sum, 8);
  }
  const relokv::kv_block_layout layout{1, 1, 2, 4, 0, 4};
  const auto d = relokv::decode_block(b, 0x1234, layout);
  if (d.check == relokv::block_check::kOk) {
    const auto* lo = b.data();
    const auto* hi = b.data() + b.size();
    if (d.payload.data() < lo || d.payload.data() + d.payload.size() > hi ||
        d.identity.data() < lo || d.identity.data() + d.identity.size() > hi ||
        d.payload.size() != layout.payload_bytes(d.header.len))
      std::abort();
    const std::uint32_t chain[] = {0x101, static_cast<std::uint32_t>(d.header.len)};
    const relokv::token_t toks[4] = {1, 2, 3, 4};
    (void)relokv::same_identity(
        d, d.header.key, d.header.kind, d.header.extras,
        {chain, {}, std::span(toks).first(static_cast<std::size_t>(d.header.len))});
  }
  return 0;
}
