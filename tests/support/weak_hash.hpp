#pragma once
// A deliberately terrible hash scheme: 2-bit keys. Every lookup collides; relocatable_cache must
// still never return a wrong block.
#include <relokv/concepts/hash_scheme.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

struct weak_hash {
  using key_type = std::uint8_t;
  [[nodiscard]] key_type digest(std::span<const std::byte> bytes, relokv::hash_domain,
                                std::uint64_t tweak = 0) const {
    unsigned s = static_cast<unsigned>(tweak);
    for (std::byte b : bytes) s += static_cast<unsigned>(b);
    return static_cast<key_type>(s & 3u);
  }
  [[nodiscard]] key_type combine(key_type a, key_type b, relokv::hash_domain) const {
    return static_cast<key_type>((a + b) & 3u);
  }
  [[nodiscard]] static std::size_t bucket(key_type k) { return k; }
};
static_assert(relokv::hash_scheme<weak_hash>);
