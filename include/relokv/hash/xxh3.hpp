#pragma once
/// @file
/// XXH3 hash schemes (64- and 128-bit), keyed by a deployment seed.
///
/// Byte layout (stable across processes, builds and platforms; all integers little-endian):
///  - digest(bytes, d)        = XXH3(bytes, seed ^ (d * 0x9E3779B97F4A7C15))
///  - combine(p, c, d)        = XXH3(bytes(p) || bytes(c), seed ^ (d * 0x9E3779B97F4A7C15))
///    where bytes(k) of a 128-bit key is le64(low) || le64(high), of a 64-bit key le64(k).
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
#include <xxhash.h>
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

  [[nodiscard]] key_type digest(std::span<const std::byte> bytes, hash_domain d) const noexcept {
    const XXH128_hash_t h =
        XXH3_128bits_withSeed(bytes.data(), bytes.size(), detail::domain_seed(seed_, d));
    return {h.low64, h.high64};
  }
  [[nodiscard]] key_type combine(const key_type& parent, const key_type& child,
                                 hash_domain d) const noexcept {
    const std::uint64_t buf[4] = {parent.lo, parent.hi, child.lo, child.hi};
    const XXH128_hash_t h = XXH3_128bits_withSeed(buf, sizeof buf, detail::domain_seed(seed_, d));
    return {h.low64, h.high64};
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

  [[nodiscard]] key_type digest(std::span<const std::byte> bytes, hash_domain d) const noexcept {
    return XXH3_64bits_withSeed(bytes.data(), bytes.size(), detail::domain_seed(seed_, d));
  }
  [[nodiscard]] key_type combine(const key_type& parent, const key_type& child,
                                 hash_domain d) const noexcept {
    const std::uint64_t buf[2] = {parent, child};
    return XXH3_64bits_withSeed(buf, sizeof buf, detail::domain_seed(seed_, d));
  }
  [[nodiscard]] static std::size_t bucket(const key_type& k) noexcept {
    return static_cast<std::size_t>(k);
  }
  [[nodiscard]] constexpr std::uint64_t seed() const noexcept { return seed_; }

 private:
  std::uint64_t seed_ = 0;
};

static_assert(hash_scheme<xxh3_128>, "xxh3_128 must model hash_scheme");
static_assert(hash_scheme<xxh3_64>, "xxh3_64 must model hash_scheme");

RELOKV_NAMESPACE_END
