#pragma once
/// @file
/// Software prefetch spread over a kernel's loop (the decode paths' streaming).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "relokv/attention/detail/simd.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

/// Issues the prefetches of a few ranges a few lines at a time, `step` bytes per call of
/// advance(): a burst of prefetches stalls on the fill buffers while the kernel's own loads
/// wait behind it; spread over the kernel's loop, the next data streams in while this computes.
/// Software prefetches are what keeps decode streaming (the measurements are in
/// bench/results/host-2026-12-01.md and host-2026-12-01b.md).
struct prefetch_cursor {
  static constexpr int kMaxRanges = 4;
  const char* ptr[kMaxRanges] = {};
  std::ptrdiff_t bytes[kMaxRanges] = {};
  int n = 0, i = 0;
  const char* p = nullptr;
  std::ptrdiff_t left = 0;  ///< bytes of range i from p on
  std::ptrdiff_t remaining = 0, step = 0;
  prefetch_cursor() = default;
  /// `shares` calls of advance() cover [pf, pf + bytes) (nothing when pf is null).
  prefetch_cursor(const char* pf, std::ptrdiff_t len, int shares) {
    if (pf != nullptr) add(pf, len);
    spread(shares);
  }
  void add(const void* at, std::ptrdiff_t len) {
    RELOKV_ASSERT(n < kMaxRanges, "prefetch_cursor: too many ranges");
    ptr[n] = static_cast<const char*>(at);
    bytes[n++] = len;
    remaining += len;
    if (n == 1) {
      p = ptr[0];
      left = len;
    }
  }
  /// Spreads what is left over `steps` calls of advance().
  void spread(std::int64_t steps) {
    step = static_cast<std::ptrdiff_t>((remaining / (steps > 0 ? steps : 1) + 63) / 64 * 64);
  }
  RELOKV_ALWAYS_INLINE void issue(std::ptrdiff_t budget) {
#if defined(__GNUC__) || defined(__clang__)
    while (budget > 0 && i < n) {
      for (; left > 0 && budget > 0; p += 64, left -= 64, budget -= 64, remaining -= 64)
        __builtin_prefetch(p, 0, 1);
      if (left <= 0 && ++i < n) {
        p = ptr[i];
        left = bytes[i];
      }
    }
#else
    (void)budget;
#endif
  }
  RELOKV_ALWAYS_INLINE void advance() { issue(step); }
  /// Issues everything left.
  void finish() { issue(remaining); }
};

}  // namespace detail
RELOKV_NAMESPACE_END
