#pragma once
/// @file
/// XXH3 hash schemes (64- and 128-bit), keyed by a deployment seed.
///
/// Byte layout (stable across processes, builds and platforms; all integers little-endian):
///  - digest(bytes, d, t)     = XXH3(bytes, seed ^ (d * 0x9E3779B97F4A7C15) ^ (t << 8))
///  - combine(p, c, d): keys are chained in registers, without a round trip through memory.
///    With s = seed ^ (d * 0x9E3779B97F4A7C15) and fold(a, b) = low64(a*b) ^ high64(a*b) (the
///    full 128-bit product; wyhash's and XXH3's mixing step):
///      128-bit: m1 = fold(p.lo ^ (K0 + s), c.hi ^ (K1 - s)),
///               m2 = fold(p.hi ^ (K2 + s), c.lo ^ (K3 - s)),
///               result = {m1 ^ rotl(m2, 29), m2 ^ rotl(m1, 17)}
///      64-bit:  fold(p ^ (K0 + s), c ^ (K1 - s))
///    with the constants K0..K3 below. One multiply deep, so a chain of blocks costs a few
///    cycles per link. Keys only index the cache (every hit is verified), so the lighter link
///    trades nothing but a negligible collision rate.
/// Callers hash tokens as le32 each (see block_keys.hpp).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "relokv/concepts/hash_scheme.hpp"

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#define RELOKV_DEFINED_XXH_INLINE_ALL
#endif
// GCC 12 reports a false -Wmaybe-uninitialized (and, for the streaming API, -Wuninitialized)
// inside its AVX-512 intrinsics when xxHash's AVX-512 path is compiled in (-march with
// AVX-512); silence them for this include only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <xxhash.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#ifdef RELOKV_DEFINED_XXH_INLINE_ALL
#undef XXH_INLINE_ALL
#undef RELOKV_DEFINED_XXH_INLINE_ALL
#endif

RELOKV_NAMESPACE_BEGIN

static_assert(std::endian::native == std::endian::little,
              "relokv's hash byte layout is defined little-endian; add byte swaps for this target");

namespace detail {
constexpr std::uint64_t domain_seed(std::uint64_t seed, hash_domain d) noexcept {
  return seed ^ (static_cast<std::uint64_t>(d) * 0x9E3779B97F4A7C15ull);
}
inline constexpr std::uint64_t kLink[4] = {0xbe4ba423396cfeb8ull, 0x1cad21f72c81017cull,
                                           0xdb979083e96dd4deull, 0x1f67b3b7a4a44072ull};
inline std::uint64_t fold64(std::uint64_t a, std::uint64_t b) noexcept {
  __extension__ using u128 = unsigned __int128;
  const u128 p = static_cast<u128>(a) * b;
  return static_cast<std::uint64_t>(p) ^ static_cast<std::uint64_t>(p >> 64);
}
}  // namespace detail

/// A 128-bit key.
struct key128 {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend constexpr bool operator==(const key128&, const key128&) = default;
};

/// XXH3-128: the default scheme. Collisions are out of reach in practice (and harmless anyway,
/// since hits are verified).
class xxh3_128 {
 public:
  using key_type = key128;
  constexpr xxh3_128() noexcept = default;
  explicit constexpr xxh3_128(std::uint64_t seed) noexcept : seed_(seed) {}

  [[nodiscard]] key_type digest(std::span<const std::byte> bytes, hash_domain d,
                                std::uint64_t tweak = 0) const noexcept {
    const XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(),
                                                  detail::domain_seed(seed_, d) ^ (tweak << 8));
    return {h.low64, h.high64};
  }
  [[nodiscard]] key_type combine(const key_type& parent, const key_type& child,
                                 hash_domain d) const noexcept {
    using namespace detail;
    const std::uint64_t s = domain_seed(seed_, d);
    const std::uint64_t m1 = fold64(parent.lo ^ (kLink[0] + s), child.hi ^ (kLink[1] - s));
    const std::uint64_t m2 = fold64(parent.hi ^ (kLink[2] + s), child.lo ^ (kLink[3] - s));
    return {m1 ^ std::rotl(m2, 29), m2 ^ std::rotl(m1, 17)};
  }
  [[nodiscard]] static std::size_t bucket(const key_type& k) noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
  [[nodiscard]] constexpr std::uint64_t seed() const noexcept { return seed_; }

 private:
  std::uint64_t seed_ = 0;
};

/// XXH3-64: half the key memory; fine for a single tenant and moderate cache sizes.
class xxh3_64 {
 public:
  using key_type = std::uint64_t;
  constexpr xxh3_64() noexcept = default;
  explicit constexpr xxh3_64(std::uint64_t seed) noexcept : seed_(seed) {}

  [[nodiscard]] key_type digest(std::span<const std::byte> bytes, hash_domain d,
                                std::uint64_t tweak = 0) const noexcept {
    return XXH3_64bits_withSeed(bytes.data(), bytes.size(),
                                detail::domain_seed(seed_, d) ^ (tweak << 8));
  }
  [[nodiscard]] key_type combine(const key_type& parent, const key_type& child,
                                 hash_domain d) const noexcept {
    using namespace detail;
    const std::uint64_t s = domain_seed(seed_, d);
    return fold64(parent ^ (kLink[0] + s), child ^ (kLink[1] - s));
  }
  [[nodiscard]] static std::size_t bucket(const key_type& k) noexcept {
    return static_cast<std::size_t>(k ^ (k >> 29));
  }
  [[nodiscard]] constexpr std::uint64_t seed() const noexcept { return seed_; }

 private:
  std::uint64_t seed_ = 0;
};

static_assert(hash_scheme<xxh3_128>, "xxh3_128 must model hash_scheme");
static_assert(hash_scheme<xxh3_64>, "xxh3_64 must model hash_scheme");

RELOKV_NAMESPACE_END
