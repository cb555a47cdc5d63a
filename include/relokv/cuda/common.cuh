#pragma once
/// @file
/// Shared pieces of relokv's CUDA kernels: the device copy of a RoPE table (read through
/// rope_table_view and rope_angle, as the host kernels read theirs), the one dispatch point
/// from run-time shapes to template parameters, warp reductions.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
namespace cuda {

/// Owns a device copy of a host rope_table (same values, so device and host kernels agree).
class device_rope_table {
 public:
  explicit device_rope_table(const rope_table& host) {
    const auto p = static_cast<std::size_t>(host.pairs());
    const auto n = static_cast<std::size_t>(host.max_position()) * p;
    const rope_table_view hv = host.view();
    // The host's rows as they are: device and host kernels read the same values.
    cos_ = upload(hv.cos, n);
    sin_ = upload(hv.sin, n);
    if (hv.unit_cos != nullptr) {
      ucos_ = upload(hv.unit_cos, n);
      usin_ = upload(hv.unit_sin, n);
    }
    check(cudaMalloc(&freq_, p * sizeof(double)));
    check(cudaMemcpy(freq_, hv.inv_freq, p * sizeof(double), cudaMemcpyHostToDevice));
    view_ = hv;
    view_.cos = cos_;
    view_.sin = sin_;
    view_.unit_cos = ucos_;
    view_.unit_sin = usin_;
    view_.inv_freq = freq_;
  }
  ~device_rope_table() {
    cudaFree(cos_);
    cudaFree(sin_);
    cudaFree(ucos_);
    cudaFree(usin_);
    cudaFree(freq_);
  }
  device_rope_table(const device_rope_table&) = delete;
  device_rope_table& operator=(const device_rope_table&) = delete;
  [[nodiscard]] const rope_table_view& view() const noexcept { return view_; }

 private:
  static void check(cudaError_t e) {
    if (e != cudaSuccess) throw error(std::string("device_rope_table: ") + cudaGetErrorString(e));
  }
  float* upload(const float* src, std::size_t n) {
    float* d = nullptr;
    check(cudaMalloc(&d, n * sizeof(float)));
    check(cudaMemcpy(d, src, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
  }
  float* cos_ = nullptr;
  float* sin_ = nullptr;
  float* ucos_ = nullptr;
  float* usin_ = nullptr;
  double* freq_ = nullptr;
  rope_table_view view_{};
};

/// The two head elements of "pair" p in [0, head_dim / 2): rotated pairs first, then the
/// unrotated tail (partial rotary) taken two by two, so every element belongs to one pair.
RELOKV_DEVICE void pair_elems(const rope_table_view& r, int p, int& a, int& b, bool& rotates) {
  if (p < r.pairs) {
    pair_index(r.layout, r.pairs, p, a, b);
    rotates = true;
  } else {
    a = r.rotary_dim + 2 * (p - r.pairs);
    b = a + 1;
    rotates = false;
  }
}

RELOKV_DEVICE void rotate_pair(float& x1, float& x2, float c, float s) {
  const float y1 = x1 * c - x2 * s;
  x2 = x1 * s + x2 * c;
  x1 = y1;
}

RELOKV_DEVICE float warp_sum(float v) {
#if defined(__CUDA_ARCH__)
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
#endif
  return v;
}

/// The single dispatch point from run-time head_dim and block_size to template parameters.
/// Calls f(std::integral_constant<int, D>{}, std::integral_constant<int, BS>{}) for the
/// supported pairs (head_dim 64, 128 or 256, block size 16 or 32); returns cudaErrorInvalidValue
/// otherwise (can_implement says why).
template <class F>
cudaError_t dispatch_shape(int head_dim, int block_size, F&& f) {
  using std::integral_constant;
  if (head_dim == 64 && block_size == 16)
    return f(integral_constant<int, 64>{}, integral_constant<int, 16>{});
  if (head_dim == 64 && block_size == 32)
    return f(integral_constant<int, 64>{}, integral_constant<int, 32>{});
  if (head_dim == 128 && block_size == 16)
    return f(integral_constant<int, 128>{}, integral_constant<int, 16>{});
  if (head_dim == 128 && block_size == 32)
    return f(integral_constant<int, 128>{}, integral_constant<int, 32>{});
  if (head_dim == 256 && block_size == 16)  // Gemma 2 and 3
    return f(integral_constant<int, 256>{}, integral_constant<int, 16>{});
  if (head_dim == 256 && block_size == 32)
    return f(integral_constant<int, 256>{}, integral_constant<int, 32>{});
  return cudaErrorInvalidValue;
}

inline support check_shape(int head_dim, int block_size) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    return {false, "Unsupported head_dim: " + std::to_string(head_dim) + " (64, 128 or 256)"};
  if (block_size != 16 && block_size != 32)
    return {false, "Unsupported block_size: " + std::to_string(block_size) + " (16 or 32)"};
  return {};
}

}  // namespace cuda
RELOKV_NAMESPACE_END
