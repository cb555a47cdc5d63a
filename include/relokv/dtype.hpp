#pragma once
/// @file
/// Storage element types: fp32, bf16 and fp16, converted to fp32 for arithmetic.
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "relokv/config.hpp"

RELOKV_NAMESPACE_BEGIN

/// Run-time element type of KV storage.
enum class dtype : std::uint8_t { kF32, kBF16, kF16 };

namespace detail {
RELOKV_HOST_DEVICE std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
RELOKV_HOST_DEVICE float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace detail

/// bfloat16 storage: the high half of an fp32. Conversion rounds to nearest even; NaN stays NaN.
struct bf16 {
  std::uint16_t bits = 0;
  RELOKV_HOST_DEVICE static bf16 from_float(float f) {
    const std::uint32_t u = detail::f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40)};
    const std::uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
    return bf16{static_cast<std::uint16_t>(r >> 16)};
  }
  RELOKV_HOST_DEVICE float to_float() const {
    return detail::bits_f32(static_cast<std::uint32_t>(bits) << 16);
  }
};

/// IEEE binary16 storage. Conversions are branch-light bit manipulation so that loops over
/// them vectorize; fp32 -> fp16 rounds to nearest even and saturates to infinity.
struct fp16 {
  std::uint16_t bits = 0;
  RELOKV_HOST_DEVICE static fp16 from_float(float f) {
    const std::uint32_t u = detail::f32_bits(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    std::uint32_t a = u & 0x7fffffffu;
    std::uint16_t h;
    if (a > 0x7f800000u) {
      h = 0x7e00;  // NaN
    } else if (a >= 0x477ff000u) {
      h = 0x7c00;  // overflow (and inf) -> inf
    } else if (a < 0x38800000u) {
      // subnormal or zero: scale into the integer range and round to nearest even via fp add
      const float m = detail::bits_f32(a) + 0.5f;  // 0.5 = 2^-1: aligns fp16 subnormal ulp 2^-24
      h = static_cast<std::uint16_t>(detail::f32_bits(m) - detail::f32_bits(0.5f));
    } else {
      const std::uint32_t odd = (a >> 13) & 1u;
      a += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round
      h = static_cast<std::uint16_t>(a >> 13);
    }
    return fp16{static_cast<std::uint16_t>(h | sign)};
  }
  RELOKV_HOST_DEVICE float to_float() const {
    // Shift exponent+mantissa into place, rebias by multiplying with 2^112; subnormals come out
    // right from the same multiply; inf/NaN are patched.
    const std::uint32_t sign = (static_cast<std::uint32_t>(bits) & 0x8000u) << 16;
    const std::uint32_t em = static_cast<std::uint32_t>(bits) & 0x7fffu;
    float f = detail::bits_f32(em << 13) * 5.192296858534828e33f;  // 2^112
    if (em >= 0x7c00u) f = detail::bits_f32(0x7f800000u | (em << 13));
    return detail::bits_f32(detail::f32_bits(f) | sign);
  }
};

template <class T>
inline constexpr bool is_storage_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// fp32 value of a storage element.
template <class T>
RELOKV_HOST_DEVICE float to_f32(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return x.to_float();
  }
}
/// Storage element from an fp32 value.
template <class T>
RELOKV_HOST_DEVICE T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return T::from_float(x);
  }
}

template <class T>
inline constexpr dtype dtype_of_v = std::is_same_v<T, float>  ? dtype::kF32
                                    : std::is_same_v<T, bf16> ? dtype::kBF16
                                                              : dtype::kF16;

RELOKV_NAMESPACE_END
