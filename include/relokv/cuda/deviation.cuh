#pragma once
/// @file
/// CUDA per-token KV deviation and top-k selection (CUB radix sort): CacheBlend-style
/// selective recompute on the device. Host oracle: recompute/deviation.hpp.
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <cstddef>
#include <cstdint>

#include "relokv/cuda/common.cuh"
#include "relokv/dtype.hpp"
#include "relokv/recompute/deviation.hpp"

RELOKV_NAMESPACE_BEGIN
namespace cuda {

namespace detail {

template <class T>
__global__ void deviation_kernel(deviation_metric metric, const T* ck, const T* cv, const float* fk,
                                 const float* fv, std::int32_t n, std::int32_t width, float* out) {
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= n) return;
  float dev = 0.0f;
  for (int kv = 0; kv < 2; ++kv) {
    const T* c = (kv == 0 ? ck : cv) + static_cast<long long>(t) * width;
    const float* f = (kv == 0 ? fk : fv) + static_cast<long long>(t) * width;
    float dd = 0.0f, cc = 0.0f, ff = 0.0f, cf = 0.0f;
    for (int i = lane; i < width; i += 32) {
      const float a = to_f32(c[i]), b = f[i];
      dd += (a - b) * (a - b);
      cc += a * a;
      ff += b * b;
      cf += a * b;
    }
    dd = warp_sum(dd);
    cc = warp_sum(cc);
    ff = warp_sum(ff);
    cf = warp_sum(cf);
    if (metric == deviation_metric::kL2) {
      dev += sqrtf(dd);
    } else {
      const float denom = sqrtf(cc) * sqrtf(ff);
      dev += denom > 0.0f ? 1.0f - cf / denom : (cc == ff ? 0.0f : 1.0f);
    }
  }
  if (lane == 0) out[t] = dev;
}

// Templates, so that a header-only definition has inline linkage.
template <class = void>
__global__ void prepare_topk_kernel(const float* score, const std::uint8_t* eligible,
                                    std::int32_t n, float* keys, std::int32_t* idx) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // A NaN ranks above every number (recomputed, as on the host): one positive NaN whose bits
  // sort above +inf in the descending radix sort, equal for all NaNs (ties by index).
  const float s = score[i];
  keys[i] = !eligible[i] ? -INFINITY : (isnan(s) ? __int_as_float(0x7fffffff) : s);
  idx[i] = i;
}

template <class = void>
__global__ void mark_topk_kernel(const std::int32_t* sorted_idx, const std::uint8_t* eligible,
                                 std::int32_t k, std::uint8_t* mask) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= k) return;
  const std::int32_t j = sorted_idx[i];
  if (eligible[j]) mask[j] = 1;
}

}  // namespace detail

/// Deviation of n tokens (rows of `width` elements, cached in storage type T, fresh in fp32).
template <class T>
[[nodiscard]] cudaError_t token_deviation(deviation_metric metric, const T* cached_k,
                                          const T* cached_v, const float* fresh_k,
                                          const float* fresh_v, std::int32_t n, std::int32_t width,
                                          float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kWarpsPerCta = 8;
  const unsigned grid = static_cast<unsigned>((n + kWarpsPerCta - 1) / kWarpsPerCta);
  detail::deviation_kernel<T><<<grid, kWarpsPerCta * 32, 0, stream>>>(
      metric, cached_k, cached_v, fresh_k, fresh_v, n, width, out);
  return cudaPeekAtLastError();
}

/// Bytes of workspace select_topk needs for n entries.
[[nodiscard]] inline std::size_t select_topk_workspace(std::int32_t n) {
  std::size_t cub_bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(
      nullptr, cub_bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), n);
  const std::size_t arrays =
      static_cast<std::size_t>(n) * (2 * sizeof(float) + 2 * sizeof(std::int32_t));
  return arrays + cub_bytes + 256;
}

/// Sets mask[i] = 1 for the k eligible entries with the highest score (ties: lower index, as
/// on the host: the radix sort is stable; a NaN ranks first, as on the host). `workspace` holds
/// select_topk_workspace(n) bytes.
[[nodiscard]] inline cudaError_t select_topk(const float* score, const std::uint8_t* eligible,
                                             std::int32_t n, std::int32_t k, std::uint8_t* mask,
                                             void* workspace, std::size_t workspace_bytes,
                                             cudaStream_t stream) {
  if (n == 0 || k <= 0) return cudaSuccess;
  if (k > n) k = n;
  auto* base = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<float*>(base);
  auto* keys_out = keys_in + n;
  auto* idx_in = reinterpret_cast<std::int32_t*>(keys_out + n);
  auto* idx_out = idx_in + n;
  void* cub_tmp = idx_out + n;
  const std::size_t used = static_cast<std::size_t>(reinterpret_cast<char*>(cub_tmp) - base);
  if (workspace_bytes < used) return cudaErrorInvalidValue;
  std::size_t cub_bytes = workspace_bytes - used;
  const unsigned grid = static_cast<unsigned>((n + 255) / 256);
  detail::prepare_topk_kernel<><<<grid, 256, 0, stream>>>(score, eligible, n, keys_in, idx_in);
  if (cudaError_t e = cudaPeekAtLastError(); e != cudaSuccess) return e;
  if (cudaError_t e = cub::DeviceRadixSort::SortPairsDescending(
          cub_tmp, cub_bytes, keys_in, keys_out, idx_in, idx_out, n, 0, sizeof(float) * 8, stream);
      e != cudaSuccess)
    return e;
  detail::mark_topk_kernel<>
      <<<static_cast<unsigned>((k + 255) / 256), 256, 0, stream>>>(idx_out, eligible, k, mask);
  return cudaPeekAtLastError();
}

}  // namespace cuda
RELOKV_NAMESPACE_END
