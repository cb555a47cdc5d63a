#pragma once
/// @file
/// The stored block: a versioned, self-describing, checksummed serialization of one KV block,
/// and the store key it is filed under.
///
/// Byte layout, version 1 (all integers little-endian; offsets in bytes):
/// @code
///   0   u32  magic "RKVB"                  64  u32  n_context: context tokens
///   4   u16  version (1)                   68  u32  n_tokens: chain tokens
///   6   u16  header bytes (128)            72  u64  extras.model_fingerprint
///   8   u64  fingerprint (model, RoPE,     80  u64  extras.adapter_id
///            placement: store_fingerprint) 88  u64  extras.tenant_salt
///  16  u64  store key lo                   96  u64  payload offset (a multiple of 64)
///  24  u64  store key hi                  104  u64  payload bytes
///  32  u32  num_layers                    112  u64  total bytes, checksum included
///  36  u32  num_kv_heads                  120  u64  reserved (0)
///  40  u32  head_dim                      128  identity: n_chain x (u32 tag, u32 len),
///  44  u32  block_size                             n_context x i32, n_tokens x i32;
///  48  u8   dtype   49 u8 element bytes            zeros up to the payload offset
///  50  u8   entry kind (0 context, 1 content)     payload: [layer][k|v][kv_head][slot<len][dim]
///  51  u8   placement kind                 end-8  u64  XXH3-64 of every byte before it
///  52  u32  len (valid slots)
///  56  i32  pos0 (position of slot 0 when written; a pre_rotated key is rotated by it)
///  60  u32  n_chain: blocks from the chain's start to this one
/// @endcode
/// The identity is what a pool hit is verified by: for a context entry (exact key) the tag,
/// length and tokens of every block from the request's start; for a content entry (relocatable
/// key) those of the span's blocks up to this one and the tokens of the context the span was
/// computed in (the prefix, or a dependent segment's window). With the extra keys it makes a
/// fetched block as trustworthy as a pool hit: a colliding key turns into a miss.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "relokv/concepts/kv_store.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/hash/block_keys.hpp"
#include "relokv/hash/xxh3.hpp"
#include "relokv/rope/rope_config.hpp"

RELOKV_NAMESPACE_BEGIN

static_assert(std::endian::native == std::endian::little,
              "relokv's block format is defined little-endian; add byte swaps for this target");

inline constexpr std::uint32_t kBlockMagic = 0x42564B52u;  // "RKVB"
inline constexpr std::uint16_t kBlockFormatVersion = 1;
inline constexpr std::size_t kBlockHeaderBytes = 128;
inline constexpr std::size_t kBlockPayloadAlign = 64;
inline constexpr std::size_t kBlockChecksumBytes = 8;

/// Which key a stored block is filed under.
enum class store_entry_kind : std::uint8_t {
  kContext = 0,  ///< the exact context key: same tokens and everything before them
  kContent = 1,  ///< the relocatable content key: same span in the same span context
};

/// Why a fetched entry was not used.
enum class block_check : std::uint8_t {
  kOk,
  kMalformed,    ///< too short, bad magic, sizes that do not add up
  kVersion,      ///< another format version
  kChecksum,     ///< the bytes changed after they were written
  kFingerprint,  ///< another model, RoPE configuration or placement
  kLayout,       ///< another KV layout (layers, heads, head_dim, dtype, block size)
  kIdentity,     ///< another block: key, kind, extra keys, tokens or context differ
};

[[nodiscard]] constexpr const char* to_string(block_check c) noexcept {
  switch (c) {
    case block_check::kOk:
      return "ok";
    case block_check::kMalformed:
      return "malformed";
    case block_check::kVersion:
      return "version";
    case block_check::kChecksum:
      return "checksum";
    case block_check::kFingerprint:
      return "fingerprint";
    case block_check::kLayout:
      return "layout";
    case block_check::kIdentity:
      return "identity";
  }
  return "?";
}

/// The fingerprint every stored block carries and every store key includes: a model (the
/// engine's identity for its weights, e.g. a hash of the file), its RoPE configuration and the
/// placement of stored keys. Blocks of another fingerprint are never used.
[[nodiscard]] inline std::uint64_t store_fingerprint(std::uint64_t model_id, const rope_config& r,
                                                     placement_kind placement) noexcept {
  const double d[] = {r.theta,     r.factor,    r.low_freq_factor, r.high_freq_factor,
                      r.beta_fast, r.beta_slow, r.yarn_attn_factor};
  const std::int64_t i[] = {static_cast<std::int64_t>(model_id),
                            r.head_dim,
                            r.rotary_dim,
                            static_cast<std::int64_t>(r.layout),
                            static_cast<std::int64_t>(r.scaling),
                            r.original_max_position,
                            static_cast<std::int64_t>(placement)};
  std::byte buf[sizeof d + sizeof i];
  std::memcpy(buf, d, sizeof d);
  std::memcpy(buf + sizeof d, i, sizeof i);
  return XXH3_64bits_withSeed(buf, sizeof buf, 0x726b762d66707231ull);
}

/// The store key of a block: XXH3-128 of the fingerprint, the entry kind, the block size, the
/// extra keys (tenant salt included) and the cache's key for the block, so that no two models,
/// tenants or key kinds share a name even under a weak cache hash.
template <class CacheKey>
[[nodiscard]] store_key make_store_key(std::uint64_t fingerprint, store_entry_kind kind,
                                       std::int32_t block_size, const extra_keys& x,
                                       const CacheKey& k) noexcept {
  static_assert(std::is_trivially_copyable_v<CacheKey>, "cache keys are trivially copyable");
  std::byte buf[48 + sizeof(CacheKey)];
  const std::uint64_t w[5] = {
      fingerprint, static_cast<std::uint64_t>(kind) | (static_cast<std::uint64_t>(block_size) << 8),
      x.model_fingerprint, x.adapter_id, x.tenant_salt};
  std::memcpy(buf, w, sizeof w);
  std::memset(buf + sizeof w, 0, 48 - sizeof w);
  std::memcpy(buf + 48, &k, sizeof(CacheKey));
  const XXH128_hash_t h = XXH3_128bits_withSeed(buf, sizeof buf, 0x726b762d6b657931ull);
  return {h.low64, h.high64};
}

/// What a stored block says about itself, besides its identity and payload.
struct block_header {
  std::uint64_t fingerprint = 0;
  store_key key{};
  kv_block_layout layout{};
  store_entry_kind kind = store_entry_kind::kContext;
  placement_kind placement = placement_kind::kAtAttention;
  std::int32_t len = 0;
  pos_t pos0 = 0;
  extra_keys extras{};
};

/// A block's identity (see the file comment). chain holds (tag, len) per block of the chain.
struct block_identity {
  std::span<const std::uint32_t> chain;  ///< 2 x n_chain
  std::span<const token_t> context;
  std::span<const token_t> tokens;
};

namespace detail {
template <class T>
inline void put_le(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
inline T get_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline std::size_t identity_bytes(const block_identity& id) noexcept {
  return 4 * (id.chain.size() + id.context.size() + id.tokens.size());
}
inline std::size_t payload_offset(std::size_t identity) noexcept {
  const std::size_t end = kBlockHeaderBytes + identity;
  return (end + kBlockPayloadAlign - 1) / kBlockPayloadAlign * kBlockPayloadAlign;
}
inline void write_identity(std::byte* p, const block_identity& id) noexcept {
  if (!id.chain.empty()) std::memcpy(p, id.chain.data(), 4 * id.chain.size());
  p += 4 * id.chain.size();
  if (!id.context.empty()) std::memcpy(p, id.context.data(), 4 * id.context.size());
  p += 4 * id.context.size();
  if (!id.tokens.empty()) std::memcpy(p, id.tokens.data(), 4 * id.tokens.size());
}
}  // namespace detail

/// Bytes of a serialized block.
[[nodiscard]] inline std::size_t encoded_block_bytes(const block_header& h,
                                                     const block_identity& id) noexcept {
  return detail::payload_offset(detail::identity_bytes(id)) + h.layout.payload_bytes(h.len) +
         kBlockChecksumBytes;
}

/// Serializes a block into `out` (resized): header and identity, then `fill_payload(span)`
/// writes the K and V, then the checksum is appended.
template <class FillPayload>
void encode_block(const block_header& h, const block_identity& id, FillPayload&& fill_payload,
                  std::vector<std::byte>& out) {
  using detail::put_le;
  const std::size_t ident = detail::identity_bytes(id);
  const std::size_t off = detail::payload_offset(ident);
  const std::size_t payload = h.layout.payload_bytes(h.len);
  const std::size_t total = off + payload + kBlockChecksumBytes;
  out.assign(total, std::byte{0});
  std::byte* p = out.data();
  put_le(p + 0, kBlockMagic);
  put_le(p + 4, kBlockFormatVersion);
  put_le(p + 6, static_cast<std::uint16_t>(kBlockHeaderBytes));
  put_le(p + 8, h.fingerprint);
  put_le(p + 16, h.key.lo);
  put_le(p + 24, h.key.hi);
  put_le(p + 32, static_cast<std::uint32_t>(h.layout.num_layers));
  put_le(p + 36, static_cast<std::uint32_t>(h.layout.num_kv_heads));
  put_le(p + 40, static_cast<std::uint32_t>(h.layout.head_dim));
  put_le(p + 44, static_cast<std::uint32_t>(h.layout.block_size));
  put_le(p + 48, h.layout.dtype_code);
  put_le(p + 49, h.layout.elem_bytes);
  put_le(p + 50, static_cast<std::uint8_t>(h.kind));
  put_le(p + 51, static_cast<std::uint8_t>(h.placement));
  put_le(p + 52, static_cast<std::uint32_t>(h.len));
  put_le(p + 56, static_cast<std::int32_t>(h.pos0));
  put_le(p + 60, static_cast<std::uint32_t>(id.chain.size() / 2));
  put_le(p + 64, static_cast<std::uint32_t>(id.context.size()));
  put_le(p + 68, static_cast<std::uint32_t>(id.tokens.size()));
  put_le(p + 72, h.extras.model_fingerprint);
  put_le(p + 80, h.extras.adapter_id);
  put_le(p + 88, h.extras.tenant_salt);
  put_le(p + 96, static_cast<std::uint64_t>(off));
  put_le(p + 104, static_cast<std::uint64_t>(payload));
  put_le(p + 112, static_cast<std::uint64_t>(total));
  detail::write_identity(p + kBlockHeaderBytes, id);
  fill_payload(std::span<std::byte>(p + off, payload));
  put_le(p + total - kBlockChecksumBytes, XXH3_64bits(p, total - kBlockChecksumBytes));
}

/// A checked stored block.
struct decoded_block {
  block_check check = block_check::kMalformed;
  block_header header{};
  std::span<const std::byte> identity;  ///< the identity's bytes as stored
  std::span<const std::byte> payload;
};

/// Parses and checks a stored block: structure, version, checksum, then that it was written
/// for `fingerprint` and `layout`. Never reads outside `bytes`, whatever they hold.
[[nodiscard]] inline decoded_block decode_block(std::span<const std::byte> bytes,
                                                std::uint64_t fingerprint,
                                                const kv_block_layout& layout) noexcept {
  using detail::get_le;
  decoded_block d;
  const std::byte* p = bytes.data();
  const std::size_t n = bytes.size();
  if (n < kBlockHeaderBytes + kBlockChecksumBytes || get_le<std::uint32_t>(p) != kBlockMagic)
    return d;
  if (get_le<std::uint16_t>(p + 4) != kBlockFormatVersion) {
    d.check = block_check::kVersion;
    return d;
  }
  const std::uint64_t n_chain = get_le<std::uint32_t>(p + 60);
  const std::uint64_t n_ctx = get_le<std::uint32_t>(p + 64);
  const std::uint64_t n_tok = get_le<std::uint32_t>(p + 68);
  const std::uint64_t off = get_le<std::uint64_t>(p + 96);
  const std::uint64_t payload = get_le<std::uint64_t>(p + 104);
  const std::uint64_t total = get_le<std::uint64_t>(p + 112);
  const std::uint64_t ident = 4 * (2 * n_chain + n_ctx + n_tok);  // < 2^36: cannot overflow
  if (get_le<std::uint16_t>(p + 6) != kBlockHeaderBytes || total != n ||
      off != detail::payload_offset(ident) || off > n || payload > n - off ||
      off + payload + kBlockChecksumBytes != n)
    return d;
  // Sizes before hashing: an entry whose payload is no size this layout's blocks have is
  // rejected unread, so a store cannot make the reader hash more than one block's bytes.
  if (const std::uint32_t claimed = get_le<std::uint32_t>(p + 52);
      claimed == 0 || claimed > static_cast<std::uint32_t>(layout.block_size) ||
      payload != layout.payload_bytes(static_cast<std::int32_t>(claimed))) {
    d.check = block_check::kLayout;
    return d;
  }
  if (XXH3_64bits(p, n - kBlockChecksumBytes) != get_le<std::uint64_t>(p + n - 8)) {
    d.check = block_check::kChecksum;
    return d;
  }
  block_header& h = d.header;
  h.fingerprint = get_le<std::uint64_t>(p + 8);
  h.key = {get_le<std::uint64_t>(p + 16), get_le<std::uint64_t>(p + 24)};
  h.layout.num_layers = static_cast<std::int32_t>(get_le<std::uint32_t>(p + 32));
  h.layout.num_kv_heads = static_cast<std::int32_t>(get_le<std::uint32_t>(p + 36));
  h.layout.head_dim = static_cast<std::int32_t>(get_le<std::uint32_t>(p + 40));
  h.layout.block_size = static_cast<std::int32_t>(get_le<std::uint32_t>(p + 44));
  h.layout.dtype_code = get_le<std::uint8_t>(p + 48);
  h.layout.elem_bytes = get_le<std::uint8_t>(p + 49);
  h.kind = static_cast<store_entry_kind>(get_le<std::uint8_t>(p + 50));
  h.placement = static_cast<placement_kind>(get_le<std::uint8_t>(p + 51));
  const std::uint32_t len = get_le<std::uint32_t>(p + 52);
  h.pos0 = get_le<std::int32_t>(p + 56);
  h.extras = {get_le<std::uint64_t>(p + 72), get_le<std::uint64_t>(p + 80),
              get_le<std::uint64_t>(p + 88)};
  if (h.fingerprint != fingerprint) {
    d.check = block_check::kFingerprint;
    return d;
  }
  if (!(h.layout == layout)) {
    d.check = block_check::kLayout;
    return d;
  }
  if (len == 0 || len > static_cast<std::uint32_t>(layout.block_size) ||
      payload != layout.payload_bytes(static_cast<std::int32_t>(len)) || h.pos0 < 0)
    return d;
  h.len = static_cast<std::int32_t>(len);
  d.identity = bytes.subspan(kBlockHeaderBytes, ident);
  d.payload = bytes.subspan(off, payload);
  d.check = block_check::kOk;
  return d;
}

/// True when a decoded block is the block `key`, `kind`, `extras` and `id` describe. Compares
/// every byte of the identity: tags, lengths, tokens, context tokens.
[[nodiscard]] inline bool same_identity(const decoded_block& d, const store_key& key,
                                        store_entry_kind kind, const extra_keys& extras,
                                        const block_identity& id) noexcept {
  const block_header& h = d.header;
  if (!(h.key == key) || h.kind != kind || !(h.extras == extras) ||
      d.identity.size() != detail::identity_bytes(id))
    return false;
  if (id.chain.size() < 2 || h.len != static_cast<std::int32_t>(id.chain.back())) return false;
  const std::byte* p = d.identity.data();
  const auto eq = [&p](const auto& s) {
    const std::size_t b = 4 * s.size();
    const bool same = b == 0 || std::memcmp(p, s.data(), b) == 0;
    p += b;
    return same;
  };
  return eq(id.chain) && eq(id.context) && eq(id.tokens);
}

RELOKV_NAMESPACE_END
