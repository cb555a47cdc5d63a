#pragma once
// Deliberately terrible hash schemes. relocatable_cache must never return a wrong block with
// any of them: every hit is verified, so a colliding hash can only cost reuse.
//  - weak_hash:     2-bit keys, additive (collides constantly, but still sees every byte);
//  - blind_hash:    keys of a few bits (2 by default) that ignore the context and the extra
//                   keys: the root is a constant and combine() keeps only the child, so a
//                   block's context key is the digest of its own tokens, the same for every
//                   prefix and tenant (with more bits, fewer keys are taken, so blocks that
//                   collide with a dead block's key are indexed more often);
//  - constant_hash: one key for everything.
// With blind_hash and constant_hash, context and tenant separation rest on verification alone.
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

template <unsigned Bits = 2>
struct blind_hash_bits {
  static_assert(Bits >= 1 && Bits <= 8);
  using key_type = std::uint8_t;
  [[nodiscard]] key_type digest(std::span<const std::byte> bytes, relokv::hash_domain d,
                                std::uint64_t = 0) const {
    if (d == relokv::hash_domain::kRoot) return 0;  // blind to the extra keys
    unsigned s = 0;
    for (std::byte b : bytes) s += static_cast<unsigned>(b);
    return static_cast<key_type>(s & ((1u << Bits) - 1u));
  }
  [[nodiscard]] key_type combine(key_type, key_type child, relokv::hash_domain) const {
    return child;  // blind to the context
  }
  [[nodiscard]] static std::size_t bucket(key_type k) { return k; }
};
using blind_hash = blind_hash_bits<2>;
static_assert(relokv::hash_scheme<blind_hash>);
static_assert(relokv::hash_scheme<blind_hash_bits<4>>);

struct constant_hash {
  using key_type = std::uint8_t;
  [[nodiscard]] key_type digest(std::span<const std::byte>, relokv::hash_domain,
                                std::uint64_t = 0) const {
    return 0;
  }
  [[nodiscard]] key_type combine(key_type, key_type, relokv::hash_domain) const { return 0; }
  [[nodiscard]] static std::size_t bucket(key_type k) { return k; }
};
static_assert(relokv::hash_scheme<constant_hash>);
