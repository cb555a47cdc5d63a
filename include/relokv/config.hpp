#pragma once
/// @file
/// Library-wide configuration: version, ABI namespace, host/device annotations, assertions.

#define RELOKV_VERSION_MAJOR 0
#define RELOKV_VERSION_MINOR 1
#define RELOKV_VERSION_PATCH 0
/// Single number for comparisons: major * 10000 + minor * 100 + patch.
#define RELOKV_VERSION \
  (RELOKV_VERSION_MAJOR * 10000 + RELOKV_VERSION_MINOR * 100 + RELOKV_VERSION_PATCH)

#if defined(__CUDACC__) || defined(__HIPCC__)
#define RELOKV_HOST_DEVICE __host__ __device__ inline
#define RELOKV_DEVICE __device__ inline
#define RELOKV_HOST __host__ inline
#define RELOKV_COMPILING_CUDA 1
#else
#define RELOKV_HOST_DEVICE inline
#define RELOKV_DEVICE inline
#define RELOKV_HOST inline
#define RELOKV_COMPILING_CUDA 0
#endif

/// Before a RELOKV_HOST_DEVICE template whose parameters may be device-only functors (an __expf
/// wrapper): nvcc then checks the calls only where it instantiates them.
#if defined(__CUDACC__)
#define RELOKV_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define RELOKV_EXEC_CHECK_DISABLE
#endif

#if defined(__GNUC__) || defined(__clang__)
#define RELOKV_RESTRICT __restrict__
#define RELOKV_ALWAYS_INLINE __attribute__((always_inline))
#else
#define RELOKV_RESTRICT
#define RELOKV_ALWAYS_INLINE
#endif

/// The ABI inline namespace: two vendored copies of different versions in one process link
/// to distinct symbols instead of silently mixing.
#define RELOKV_NAMESPACE_BEGIN \
  namespace relokv {           \
  inline namespace v0_1 {
#define RELOKV_NAMESPACE_END \
  }                          \
  }

/// Internal invariant check. Active in debug builds and whenever RELOKV_ENABLE_ASSERTS is set;
/// violated invariants are programming errors, never bad input (bad input throws or returns a
/// status).
#if !defined(RELOKV_ENABLE_ASSERTS) && !defined(NDEBUG)
#define RELOKV_ENABLE_ASSERTS 1
#endif
#if defined(RELOKV_ENABLE_ASSERTS) && RELOKV_ENABLE_ASSERTS && !RELOKV_COMPILING_CUDA
#include <cstdio>
#include <cstdlib>
#define RELOKV_ASSERT(cond, msg)                                                               \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "relokv: assertion failed at %s:%d: %s (%s)\n", __FILE__, __LINE__, \
                   #cond, msg);                                                                \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
#else
#define RELOKV_ASSERT(cond, msg) ((void)0)
#endif
