#pragma once
/// @file
/// The hash-scheme policy axis.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "relokv/config.hpp"

RELOKV_NAMESPACE_BEGIN

/// Domains keep the chains apart: the same bytes hashed in two domains give unrelated keys.
enum class hash_domain : std::uint8_t {
  kRoot = 1,     ///< extra keys (model fingerprint, adapter, tenant salt)
  kTokens = 2,   ///< a block's tokens
  kContext = 3,  ///< context (exact) chain link
  kContent = 4,  ///< content (relocatable) chain link
  kWindow = 5,   ///< the last-n tokens a dependent segment binds to
};

/// A hash scheme maps bytes to fixed-size keys and chains keys. Keys index the cache; they
/// never decide a hit on their own (relocatable_cache compares stored tokens on every hit), so
/// a weak scheme costs hit rate, never correctness.
///
/// Requirements:
///  - `key_type`: regular and trivially copyable;
///  - `h.digest(bytes, domain, tweak)`: a key for a byte string; `tweak` (a small integer such
///    as a block's segment tag) selects an independent function, like the domain does;
///  - `h.combine(parent, child, domain)`: a key for the pair, used to chain blocks;
///  - `H::bucket(key)`: a well-mixed size_t for hash tables.
template <class H>
concept hash_scheme = std::copy_constructible<H> && std::regular<typename H::key_type> &&
    std::is_trivially_copyable_v<typename H::key_type> &&
    requires(const H& h, std::span<const std::byte> bytes, const typename H::key_type& k,
             hash_domain d) {
  { h.digest(bytes, d) } -> std::same_as<typename H::key_type>;
  { h.combine(k, k, d) } -> std::same_as<typename H::key_type>;
  { H::bucket(k) } -> std::same_as<std::size_t>;
};

RELOKV_NAMESPACE_END
