#pragma once
/// @file
/// Shared pieces of relokv's CUDA kernels: the device view of a RoPE table, the one dispatch
/// point from run-time shapes to template parameters, warp reductions.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
namespace cuda {

/// Non-owning device view of a rope_table: cos/sin [max_position][pairs] (magnitude included)
/// and the inverse frequencies for exact evaluation beyond the table.
struct rope_table_view {
  const float* cos = nullptr;
  const float* sin = nullptr;
  const double* inv_freq = nullptr;
  std::int32_t pairs = 0;
  std::int32_t rotary_dim = 0;
  std::int32_t max_position = 0;
  rope_layout layout = rope_layout::kNeoX;
  float magnitude = 1.0f;
};
static_assert(std::is_trivially_copyable_v<rope_table_view>);

/// Owns a device copy of a host rope_table (same values, so device and host kernels agree).
class device_rope_table {
 public:
  explicit device_rope_table(const rope_table& host) {
    const auto p = static_cast<std::size_t>(host.pairs());
    const auto n = static_cast<std::size_t>(host.max_position()) * p;
    std::vector<float> c(n), s(n);
    for (std::int32_t pos = 0; pos < host.max_position(); ++pos)
      host.angles(pos, c.data() + static_cast<std::size_t>(pos) * p,
                  s.data() + static_cast<std::size_t>(pos) * p);
    check(cudaMalloc(&cos_, n * sizeof(float)));
    check(cudaMalloc(&sin_, n * sizeof(float)));
    check(cudaMalloc(&freq_, p * sizeof(double)));
    check(cudaMemcpy(cos_, c.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    check(cudaMemcpy(sin_, s.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    check(cudaMemcpy(freq_, host.inv_freqs(), p * sizeof(double), cudaMemcpyHostToDevice));
    view_ = {cos_,
             sin_,
             freq_,
             host.pairs(),
             host.config().rotary_dim,
             host.max_position(),
             host.config().layout,
             static_cast<float>(host.magnitude_factor())};
  }
  ~device_rope_table() {
    cudaFree(cos_);
    cudaFree(sin_);
    cudaFree(freq_);
  }
  device_rope_table(const device_rope_table&) = delete;
  device_rope_table& operator=(const device_rope_table&) = delete;
  [[nodiscard]] const rope_table_view& view() const noexcept { return view_; }

 private:
  static void check(cudaError_t e) {
    if (e != cudaSuccess) throw error(std::string("device_rope_table: ") + cudaGetErrorString(e));
  }
  float* cos_ = nullptr;
  float* sin_ = nullptr;
  double* freq_ = nullptr;
  rope_table_view view_{};
};

/// cos/sin of pair i at position pos (unit: without YaRN's magnitude).
RELOKV_DEVICE void angle(const rope_table_view& r, long long pos, int i, bool unit, float& c,
                         float& s) {
  if (pos >= 0 && pos < r.max_position && (!unit || r.magnitude == 1.0f)) {
    c = r.cos[pos * r.pairs + i];
    s = r.sin[pos * r.pairs + i];
    return;
  }
  const double a = static_cast<double>(pos) * r.inv_freq[i];
  const double mag = unit ? 1.0 : static_cast<double>(r.magnitude);
  c = static_cast<float>(mag * ::cos(a));
  s = static_cast<float>(mag * ::sin(a));
}

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
/// supported pairs (head_dim 64 or 128, block size 16 or 32); returns cudaErrorInvalidValue
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
  return cudaErrorInvalidValue;
}

inline support check_shape(int head_dim, int block_size) {
  if (head_dim != 64 && head_dim != 128)
    return {false, "Unsupported head_dim: " + std::to_string(head_dim) + " (64 or 128)"};
  if (block_size != 16 && block_size != 32)
    return {false, "Unsupported block_size: " + std::to_string(block_size) + " (16 or 32)"};
  return {};
}

}  // namespace cuda
RELOKV_NAMESPACE_END
