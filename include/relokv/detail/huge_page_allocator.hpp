#pragma once
/// @file
/// detail::huge_page_allocator: a std::allocator replacement for large, streamed host arrays.
#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "relokv/config.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

/// Allocator for large host arrays that kernels stream (KV pools, RoPE tables): 2 MiB aligned
/// and, on Linux, advised onto transparent huge pages, so that a long context is not throttled
/// by 4 KiB TLB misses (MADV_HUGEPAGE matters where THP is in "madvise" mode, the common
/// default). Allocations under 2 MiB come from operator new.
template <class T>
struct huge_page_allocator {
  using value_type = T;
  static constexpr std::size_t kHuge = std::size_t{2} << 20;
  huge_page_allocator() noexcept = default;
  // Implicit, as std::allocator's rebinding constructor is.
  template <class U>
  huge_page_allocator(const huge_page_allocator<U>&) noexcept {}

  [[nodiscard]] T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < kHuge) return static_cast<T*>(::operator new(bytes));
    const std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = std::aligned_alloc(kHuge, rounded);
    if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: 4 KiB pages work as well
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < kHuge) {
      ::operator delete(p);
    } else {
      std::free(p);
    }
  }
  template <class U>
  bool operator==(const huge_page_allocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace detail
RELOKV_NAMESPACE_END
