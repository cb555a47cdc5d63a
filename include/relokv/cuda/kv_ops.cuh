#pragma once
/// @file
/// CUDA KV-cache writes: kv-append (K stored as the placement needs), the delta rotation for
/// pre_rotated relocation, and block copies for copy on write.
#include <cuda_runtime.h>

#include <cstdint>

#include "relokv/block_table.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/cuda/common.cuh"
#include "relokv/dtype.hpp"

RELOKV_NAMESPACE_BEGIN
namespace cuda {

/// kv-append arguments: token i goes to slot slots[i] of block blocks[i] at logical position
/// positions[i]. k, v: [n][num_kv_heads][head_dim], fp32, K unrotated.
template <class T>
struct append_params {
  rope_table_view rope;
  paged_kv_view<T> kv;
  const float* k = nullptr;
  const float* v = nullptr;
  const block_id* blocks = nullptr;
  const std::int32_t* slots = nullptr;
  const pos_t* positions = nullptr;
  std::int32_t n = 0;
};

/// Relocation arguments (pre_rotated): for each copy, K of src rotated by dst_pos0 - src_pos0
/// into dst, V copied; `copies` is a device array.
template <class T>
struct relocate_params {
  rope_table_view rope;
  paged_kv_view<T> kv;
  const block_copy* copies = nullptr;
  std::int32_t n = 0;
};

namespace detail {

template <class P, class T>
__global__ void append_kernel(const append_params<T> p) {
  const int i = blockIdx.x, h = blockIdx.y, D = p.kv.head_dim;
  const block_id b = p.blocks[i];
  const int slot = p.slots[i];
  const pos_t rotpos = P::stored_position(p.positions[i], slot);
  T* kd = p.kv.k(b, h) + static_cast<long long>(slot) * D;
  T* vd = p.kv.v(b, h) + static_cast<long long>(slot) * D;
  const float* ks = p.k + (static_cast<long long>(i) * p.kv.num_kv_heads + h) * D;
  const float* vs = p.v + (static_cast<long long>(i) * p.kv.num_kv_heads + h) * D;
  for (int pr = threadIdx.x; pr < D / 2; pr += blockDim.x) {
    int a, c;
    bool rotates;
    pair_elems(p.rope, pr, a, c, rotates);
    float x1 = ks[a], x2 = ks[c];
    if (P::kind != placement_kind::kAtAttention && rotates) {
      float cs, sn;
      rope_angle(p.rope, rotpos, pr, false, cs, sn);
      rotate_pair(x1, x2, cs, sn);
    }
    kd[a] = from_f32<T>(x1);
    kd[c] = from_f32<T>(x2);
    vd[a] = from_f32<T>(vs[a]);
    vd[c] = from_f32<T>(vs[c]);
  }
}

template <class T>
__global__ void relocate_kernel(const relocate_params<T> p) {
  const int ci = blockIdx.x, h = blockIdx.y, j = blockIdx.z, D = p.kv.head_dim;
  const block_copy c = p.copies[ci];
  const T* ks = p.kv.k(c.src, h) + static_cast<long long>(j) * D;
  T* kd = p.kv.k(c.dst, h) + static_cast<long long>(j) * D;
  const T* vs = p.kv.v(c.src, h) + static_cast<long long>(j) * D;
  T* vd = p.kv.v(c.dst, h) + static_cast<long long>(j) * D;
  for (int pr = threadIdx.x; pr < D / 2; pr += blockDim.x) {
    int a, b;
    bool rotates;
    pair_elems(p.rope, pr, a, b, rotates);
    float x1 = to_f32(ks[a]), x2 = to_f32(ks[b]);
    if (rotates) {
      float cs, sn;
      rope_angle(p.rope, static_cast<long long>(c.dst_pos0) - c.src_pos0, pr, true, cs, sn);
      rotate_pair(x1, x2, cs, sn);
    }
    kd[a] = from_f32<T>(x1);
    kd[b] = from_f32<T>(x2);
    vd[a] = vs[a];
    vd[b] = vs[b];
  }
}

template <class T>
__global__ void copy_blocks_kernel(paged_kv_view<T> kv, const block_copy* copies) {
  const block_copy c = copies[blockIdx.x];
  const long long n = 2LL * kv.num_kv_heads * kv.tile_elems();
  const T* s = kv.k(c.src, 0);
  T* d = kv.k(c.dst, 0);
  for (long long i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

}  // namespace detail

/// Writes new K/V; one CTA per (token, KV head).
template <class P, class T>
[[nodiscard]] cudaError_t append_kv(const append_params<T>& p, cudaStream_t stream) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  if (p.n == 0) return cudaSuccess;
  if (p.kv.head_dim % 2 != 0 || p.rope.pairs * 2 > p.kv.head_dim) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.n), static_cast<unsigned>(p.kv.num_kv_heads));
  detail::append_kernel<P, T><<<grid, 64, 0, stream>>>(p);
  return cudaPeekAtLastError();
}

/// The delta rotation of pre_rotated relocation, one layer; one CTA per (copy, head, slot).
template <class T>
[[nodiscard]] cudaError_t relocate_blocks(const relocate_params<T>& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.n), static_cast<unsigned>(p.kv.num_kv_heads),
                  static_cast<unsigned>(p.kv.block_size));
  detail::relocate_kernel<T><<<grid, 64, 0, stream>>>(p);
  return cudaPeekAtLastError();
}

/// Copy on write: every element of src into dst, one layer; `copies` is a device array.
template <class T>
[[nodiscard]] cudaError_t copy_blocks(paged_kv_view<T> kv, const block_copy* copies, std::int32_t n,
                                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  detail::copy_blocks_kernel<T><<<static_cast<unsigned>(n), 256, 0, stream>>>(kv, copies);
  return cudaPeekAtLastError();
}

}  // namespace cuda
RELOKV_NAMESPACE_END
