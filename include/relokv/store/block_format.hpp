#pragma once
/// @file
/// The stored block: a versioned, self-describing, checksummed serialization of one KV block,
/// and the store key it is filed under.
///
/// Byte layout, version 2 (all integers little-endian; offsets in bytes):
/// @code
///   0   u32  magic "RKVB"                  60  u8   seal (0 none, 1 AES-256-GCM: sealed_store)
///   4   u16  version (2)                   61  u8   origin (0 in context, 1 canonical)
///   6   u16  header bytes (128)            62  u16  reserved (0)
///   8   u64  fingerprint (model, RoPE,     64  u64  origin principal (who computed it)
///            placement: store_fingerprint) 72  u64  extras.model_fingerprint
///  16  u64  store key lo                   80  u64  extras.adapter_id
///  24  u64  store key hi                   88  u64  extras.tenant_salt
///  32  u32  num_layers                     96  u32  payload offset (a multiple of 64)
///  36  u32  num_kv_heads                  100  u32  payload bytes
///  40  u32  head_dim                      104  u64  total bytes, checksum included
///  44  u32  block_size                    112  u8[12] seal nonce (0 unsealed)
///  48  u8   dtype   49 u8 element bytes   124  u32  reserved (0)
///  50  u8   entry kind (0 context, 1 content)
///  51  u8   placement kind                128  identity: u8[32] SHA-256 of what precedes the
///  52  u32  len (valid slots)                  block, u32 tag, u32 n_tokens (= len),
///  56  i32  pos0 (position of slot 0 when      n_tokens x i32; zeros up to the payload offset
///            written; a pre_rotated key is     payload: [layer][k|v][kv_head][slot<len][dim]
///            rotated by it)               end-8  u64  XXH3-64 of every byte before it
/// @endcode
/// The identity is what a pool hit is verified by, bounded: the block's own tag and tokens,
/// and a SHA-256 digest (libcrypto) of what precedes it. For a context entry (exact key) that
/// is the tag, length and tokens of every block from the request's start; for a content entry
/// (relocatable key) those of the span's blocks before this one and the tokens of the context
/// the span was computed in (the prefix, or a dependent segment's window). With the extra keys
/// it makes a fetched block as trustworthy as a pool hit (a colliding key is a miss), while a
/// block's format bytes stay the same at any position (version 1 stored every token before
/// the block, so a long prompt's store overhead grew quadratically).
///
/// The origin says how the K/V were computed: canonical (the span computed right after its
/// own context, e.g. a passage compiled after the system prompt) or in the context of some
/// other request text, by `principal`. The provenance policy (cache_stats.hpp) serves a
/// relocated hit of the latter only to the same principal.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "relokv/block_table.hpp"
#include "relokv/concepts/kv_store.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/hash/block_keys.hpp"
#include "relokv/hash/xxh3.hpp"
#include "relokv/rope/layer_rope.hpp"
#include "relokv/rope/rope_config.hpp"
#include "relokv/store/sha256.hpp"

RELOKV_NAMESPACE_BEGIN

static_assert(std::endian::native == std::endian::little,
              "relokv's block format is defined little-endian; add byte swaps for this target");

inline constexpr std::uint32_t kBlockMagic = 0x42564B52u;  // "RKVB"
inline constexpr std::uint16_t kBlockFormatVersion = 2;
inline constexpr std::size_t kBlockHeaderBytes = 128;
inline constexpr std::size_t kBlockPayloadAlign = 64;
inline constexpr std::size_t kBlockChecksumBytes = 8;
inline constexpr std::size_t kBlockDigestBytes = 32;
/// Header offsets the sealing adapter (sealed_store.hpp) writes.
inline constexpr std::size_t kBlockSealOffset = 60;
inline constexpr std::size_t kBlockNonceOffset = 112;
inline constexpr std::size_t kBlockNonceBytes = 12;
inline constexpr std::size_t kBlockTenantSaltOffset = 88;
inline constexpr std::size_t kBlockKeyOffset = 16;  ///< store key lo, then hi
inline constexpr std::size_t kBlockTotalOffset = 104;

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
  kSealed,       ///< sealed for a key this reader does not have (it reads without one)
  kProvenance,   ///< a relocated hit the provenance policy does not serve to this request
};
inline constexpr std::size_t kBlockCheckCount = 9;

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
    case block_check::kSealed:
      return "sealed";
    case block_check::kProvenance:
      return "provenance";
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
  const std::uint64_t base = XXH3_64bits_withSeed(buf, sizeof buf, 0x726b762d66707231ull);
  // YaRN's truncate and DeepSeek's mscales change the rotation too; the configurations that
  // leave them at their defaults keep the fingerprint they had before these fields existed.
  if (r.yarn_truncate && r.yarn_mscale == 0.0 && r.yarn_mscale_all_dim == 0.0) return base;
  const double x[] = {static_cast<double>(base), r.yarn_truncate ? 1.0 : 0.0, r.yarn_mscale,
                      r.yarn_mscale_all_dim};
  return XXH3_64bits_withSeed(x, sizeof x, base);
}

/// The fingerprint of a model whose layers differ in RoPE or window (layer_rope): every
/// layer's RoPE and window enter it. A uniform geometry (one table, no window) has the
/// single-RoPE fingerprint, so the blocks of Llama-family models keep their names.
[[nodiscard]] inline std::uint64_t store_fingerprint(std::uint64_t model_id, const layer_rope& g,
                                                     placement_kind placement) noexcept {
  const std::uint64_t first = store_fingerprint(model_id, g.table(0).config(), placement);
  if (g.uniform()) return first;
  std::vector<std::uint64_t> w;
  for (std::int32_t l = 0; l < g.num_layers(); ++l) {
    w.push_back(store_fingerprint(model_id, g.table(l).config(), placement));
    w.push_back(static_cast<std::uint64_t>(g.window(l)));
  }
  return XXH3_64bits_withSeed(w.data(), w.size() * sizeof(std::uint64_t), first);
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
  block_origin origin{};
};

/// A block's identity (see the file comment): the digest of what precedes it (identity_chain)
/// and its own tag and tokens.
struct block_identity {
  sha256_digest before{};
  std::uint32_t tag = 0;
  std::span<const token_t> tokens;
};

/// Builds the digests of block identities: one running SHA-256 per chain, absorbing each block
/// after its own digest was taken, so a request's digests cost one pass over its tokens.
class identity_chain {
 public:
  /// Starts the chain of context entries (every block from the request's start).
  void begin_context() {
    h_.reset();
    h_.update_value(kContextDomain);
  }
  /// Starts the chain of a content entry's span, bound to the tokens of its context.
  void begin_content(std::span<const token_t> context) {
    h_.reset();
    h_.update_value(kContentDomain);
    h_.update_value(static_cast<std::uint64_t>(context.size()));
    h_.update(context);
  }
  /// The digest of everything absorbed so far (the identity's `before` of the next block).
  [[nodiscard]] sha256_digest digest() { return h_.peek(scratch_); }
  /// Appends a block: its tag, length and tokens.
  void absorb(std::uint32_t tag, std::span<const token_t> tokens) {
    h_.update_value(tag);
    h_.update_value(static_cast<std::uint32_t>(tokens.size()));
    h_.update(tokens);
  }

 private:
  static constexpr std::uint64_t kContextDomain = 0x7478632e766b6c72ull;  // "rlkv.ctx"
  static constexpr std::uint64_t kContentDomain = 0x746e632e766b6c72ull;  // "rlkv.cnt"
  sha256 h_, scratch_;
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
inline std::size_t identity_bytes(std::size_t n_tokens) noexcept {
  return kBlockDigestBytes + 8 + 4 * n_tokens;
}
inline std::size_t payload_offset(std::size_t identity) noexcept {
  const std::size_t end = kBlockHeaderBytes + identity;
  return (end + kBlockPayloadAlign - 1) / kBlockPayloadAlign * kBlockPayloadAlign;
}
inline void write_identity(std::byte* p, const block_identity& id) noexcept {
  std::memcpy(p, id.before.data(), kBlockDigestBytes);
  put_le(p + kBlockDigestBytes, id.tag);
  put_le(p + kBlockDigestBytes + 4, static_cast<std::uint32_t>(id.tokens.size()));
  if (!id.tokens.empty())
    std::memcpy(p + kBlockDigestBytes + 8, id.tokens.data(), 4 * id.tokens.size());
}
}  // namespace detail

/// Bytes of a serialized block.
/// The largest entry a block of `layout` can encode to (a full block: block_size tokens of
/// identity and payload): what a store needs to accept, per entry, and no more.
[[nodiscard]] inline std::size_t max_encoded_block_bytes(const kv_block_layout& layout) noexcept {
  const auto n = static_cast<std::size_t>(layout.block_size > 0 ? layout.block_size : 0);
  return detail::payload_offset(detail::identity_bytes(n)) +
         layout.payload_bytes(layout.block_size) + kBlockChecksumBytes;
}

[[nodiscard]] inline std::size_t encoded_block_bytes(const block_header& h,
                                                     const block_identity& id) noexcept {
  return detail::payload_offset(detail::identity_bytes(id.tokens.size())) +
         h.layout.payload_bytes(h.len) + kBlockChecksumBytes;
}

/// Serializes a block into `out` (resized): header and identity, then `fill_payload(span)`
/// writes the K and V, then the checksum is appended.
template <class FillPayload>
void encode_block(const block_header& h, const block_identity& id, FillPayload&& fill_payload,
                  std::vector<std::byte>& out) {
  using detail::put_le;
  const std::size_t ident = detail::identity_bytes(id.tokens.size());
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
  put_le(p + 61, static_cast<std::uint8_t>(h.origin.canonical ? 1 : 0));
  put_le(p + 64, h.origin.principal);
  put_le(p + 72, h.extras.model_fingerprint);
  put_le(p + 80, h.extras.adapter_id);
  put_le(p + 88, h.extras.tenant_salt);
  put_le(p + 96, static_cast<std::uint32_t>(off));
  put_le(p + 100, static_cast<std::uint32_t>(payload));
  put_le(p + 104, static_cast<std::uint64_t>(total));
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
  constexpr std::size_t kSmallest = kBlockHeaderBytes + kBlockDigestBytes + 8 + kBlockChecksumBytes;
  if (n < 8 || get_le<std::uint32_t>(p) != kBlockMagic) return d;
  if (get_le<std::uint16_t>(p + 4) != kBlockFormatVersion) {
    d.check = block_check::kVersion;
    return d;
  }
  if (n < kSmallest) return d;
  // A sealed entry reaches decode only when the reader has no key (sealed_store opens it and
  // clears the mark): it is not this reader's to use.
  if (get_le<std::uint8_t>(p + kBlockSealOffset) != 0) {
    d.check = block_check::kSealed;
    return d;
  }
  const std::uint64_t n_tok = get_le<std::uint32_t>(p + kBlockHeaderBytes + kBlockDigestBytes + 4);
  const std::uint64_t off = get_le<std::uint32_t>(p + 96);
  const std::uint64_t payload = get_le<std::uint32_t>(p + 100);
  const std::uint64_t total = get_le<std::uint64_t>(p + kBlockTotalOffset);
  const std::uint64_t ident = detail::identity_bytes(n_tok);  // < 2^35: cannot overflow
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
  h.origin = {get_le<std::uint8_t>(p + 61) == 1, get_le<std::uint64_t>(p + 64)};
  if (h.fingerprint != fingerprint) {
    d.check = block_check::kFingerprint;
    return d;
  }
  if (!(h.layout == layout)) {
    d.check = block_check::kLayout;
    return d;
  }
  if (len == 0 || len > static_cast<std::uint32_t>(layout.block_size) || n_tok != len ||
      payload != layout.payload_bytes(static_cast<std::int32_t>(len)) || h.pos0 < 0 ||
      get_le<std::uint8_t>(p + 61) > 1)
    return d;
  h.len = static_cast<std::int32_t>(len);
  d.identity = bytes.subspan(kBlockHeaderBytes, ident);
  d.payload = bytes.subspan(off, payload);
  d.check = block_check::kOk;
  return d;
}

/// True when a decoded block is the block `key`, `kind`, `extras` and `id` describe. Compares
/// every byte of the identity: the digest of what precedes it, its tag and its tokens.
[[nodiscard]] inline bool same_identity(const decoded_block& d, const store_key& key,
                                        store_entry_kind kind, const extra_keys& extras,
                                        const block_identity& id) noexcept {
  const block_header& h = d.header;
  if (!(h.key == key) || h.kind != kind || !(h.extras == extras) ||
      d.identity.size() != detail::identity_bytes(id.tokens.size()) ||
      h.len != static_cast<std::int32_t>(id.tokens.size()))
    return false;
  const std::byte* p = d.identity.data();
  return std::memcmp(p, id.before.data(), kBlockDigestBytes) == 0 &&
         detail::get_le<std::uint32_t>(p + kBlockDigestBytes) == id.tag &&
         (id.tokens.empty() ||
          std::memcmp(p + kBlockDigestBytes + 8, id.tokens.data(), 4 * id.tokens.size()) == 0);
}

RELOKV_NAMESPACE_END
