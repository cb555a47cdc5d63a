#pragma once
/// @file
/// APE's grouped attention on the device (the host form and its definition are in
/// attention/grouped.hpp): each group of a sequence's blocks attended by paged_attention with
/// its scores divided by T, then folded into the result by a merge kernel with log-weight
/// T * lse + log S. The host grouped_attention is the oracle.
///
/// Engines instantiate what they need in their own .cu:
/// @code
///   template cudaError_t relokv::cuda::grouped_attention<relokv::block_relative, relokv::bf16>(
///       const relokv::cuda::attention_params<relokv::bf16>&,
///       std::span<const relokv::attention_group>, const relokv::cuda::grouped_scratch&,
///       cudaStream_t);
/// @endcode
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "relokv/attention/softmax.hpp"
#include "relokv/attention_group.hpp"
#include "relokv/cuda/paged_attention.cuh"

RELOKV_NAMESPACE_BEGIN
namespace cuda {

/// Device buffers a grouped call needs: rows = num_tokens * num_q_heads.
struct grouped_scratch {
  float* part_out = nullptr;       ///< [rows][head_dim]
  float* part_lse = nullptr;       ///< [rows]
  float* acc_lse = nullptr;        ///< [rows]
  std::int32_t* indptr = nullptr;  ///< [2 * groups]: each group's {0, num_blocks}
};

namespace detail {

/// acc_lse = -inf and out = 0 for every row.
__global__ void grouped_init_kernel(float* out, float* acc_lse, std::int32_t rows,
                                    std::int32_t head_dim) {
  const std::int32_t row = static_cast<std::int32_t>(blockIdx.x);
  for (std::int32_t d = static_cast<std::int32_t>(threadIdx.x); d < head_dim;
       d += static_cast<std::int32_t>(blockDim.x))
    out[static_cast<std::size_t>(row) * head_dim + d] = 0.0f;
  if (threadIdx.x == 0) acc_lse[row] = -INFINITY;
  (void)rows;
}

/// Folds one group's state (its lse adjusted to T * lse + log S) into the accumulator.
__global__ void grouped_merge_kernel(float* out, float* acc_lse, const float* part_out,
                                     const float* part_lse, std::int32_t head_dim, float t,
                                     float log_s) {
  const std::int32_t row = static_cast<std::int32_t>(blockIdx.x);
  float lb = part_lse[row];
  const float la = acc_lse[row];
  __syncthreads();              // every thread has read acc_lse before thread 0 writes it
  if (lb == -INFINITY) return;  // the group saw no key
  lb = t * lb + log_s;
  float fa = 0.0f, fb = 1.0f, lse = lb;
  if (la != -INFINITY) softmax_merge(la, lb, fa, fb, lse, fast_exp{}, device_log{});
  const std::size_t base = static_cast<std::size_t>(row) * head_dim;
  for (std::int32_t d = static_cast<std::int32_t>(threadIdx.x); d < head_dim;
       d += static_cast<std::int32_t>(blockDim.x))
    out[base + d] = (la == -INFINITY ? 0.0f : fa * out[base + d]) + fb * part_out[base + d];
  if (threadIdx.x == 0) acc_lse[row] = lse;
}

}  // namespace detail

/// Grouped attention (decode when p.q_indptr is null, prefill otherwise; one sequence):
/// p.out receives the merged rows and p.lse, when set, the merged log-weights. `groups` is
/// host memory, checked as the host form checks it (against the host copy of the table's
/// length, `table_blocks`). Does not synchronize.
template <class P, class T>
[[nodiscard]] cudaError_t grouped_attention(const attention_params<T>& p,
                                            std::span<const attention_group> groups,
                                            std::int32_t table_blocks, const grouped_scratch& s,
                                            cudaStream_t stream) {
  if (!can_implement(p) || p.table.num_seqs != 1) return cudaErrorInvalidValue;
  if (auto v = validate_group_cover(table_blocks, groups); !v) return cudaErrorInvalidValue;
  const std::int32_t rows = p.num_tokens * p.num_q_heads;
  if (rows == 0) return cudaSuccess;
  std::vector<std::int32_t> ind(2 * groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    ind[2 * g] = 0;
    ind[2 * g + 1] = groups[g].num_blocks;
  }
  if (auto e = cudaMemcpyAsync(s.indptr, ind.data(), ind.size() * sizeof(std::int32_t),
                               cudaMemcpyHostToDevice, stream);
      e != cudaSuccess)
    return e;
  const int threads = p.kv.head_dim < 128 ? p.kv.head_dim : 128;
  detail::grouped_init_kernel<<<static_cast<unsigned>(rows), static_cast<unsigned>(threads), 0,
                                stream>>>(p.out, s.acc_lse, rows, p.kv.head_dim);
  if (auto e = cudaPeekAtLastError(); e != cudaSuccess) return e;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].num_blocks == 0) continue;
    attention_params<T> q = p;
    q.table = {p.table.entries + groups[g].first_block, s.indptr + 2 * g, 1};
    q.scale = p.scale / groups[g].temperature;
    q.out = s.part_out;
    q.lse = s.part_lse;
    if (auto e = paged_attention<P>(q, stream); e != cudaSuccess) return e;
    detail::grouped_merge_kernel<<<static_cast<unsigned>(rows), static_cast<unsigned>(threads), 0,
                                   stream>>>(p.out, s.acc_lse, s.part_out, s.part_lse,
                                             p.kv.head_dim, groups[g].temperature,
                                             std::log(groups[g].scale));
    if (auto e = cudaPeekAtLastError(); e != cudaSuccess) return e;
  }
  if (p.lse != nullptr)
    return cudaMemcpyAsync(p.lse, s.acc_lse, static_cast<std::size_t>(rows) * sizeof(float),
                           cudaMemcpyDeviceToDevice, stream);
  return cudaSuccess;
}

}  // namespace cuda
RELOKV_NAMESPACE_END
