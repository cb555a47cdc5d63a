#pragma once
/// @file
/// Rotate-at-attention paged attention for CUDA: decode and prefill over block tables of
/// {physical block, pos0, len}, for the three RoPE placements; causal by logical position;
/// GQA; fp16/bf16 (or fp32) storage with fp32 accumulation. The host kernels in
/// attention/host_attention.hpp are the oracle these are tested against.
///
/// Engines instantiate what they need in their own .cu:
/// @code
///   template cudaError_t relokv::cuda::paged_attention<relokv::block_relative, relokv::bf16>(
///       const relokv::cuda::attention_params<relokv::bf16>&, cudaStream_t);
/// @endcode
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "relokv/attention/softmax.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/cuda/common.cuh"
#include "relokv/dtype.hpp"

RELOKV_NAMESPACE_BEGIN
namespace cuda {

inline constexpr int kMaxGroup = 8;  ///< query heads per KV head (GQA group) supported
inline constexpr int kWarps = 4;     ///< warps per CTA; each walks every kWarps-th block

/// Device-side arguments (trivially copyable, passed by value).
/// q/out: [num_tokens][num_q_heads][head_dim] (q unrotated); q_pos: [num_tokens]; q_indptr:
/// [num_seqs + 1] token ranges per sequence, or nullptr for decode (token t is sequence t).
/// lse: optional [num_tokens][num_q_heads], the log-sum-exp of each row's scaled scores (-inf
/// where no key is visible), as the host kernels give it: calls over parts of a sequence's
/// blocks merge with merge_attention_states.
template <class T>
struct attention_params {
  rope_table_view rope;
  paged_kv_view<const T> kv;
  block_table_view table;
  const float* q = nullptr;
  const pos_t* q_pos = nullptr;
  const std::int32_t* q_indptr = nullptr;
  std::int32_t num_tokens = 0;
  std::int32_t num_q_heads = 0;
  float scale = 1.0f;
  float* out = nullptr;
  float* lse = nullptr;
  /// Optional split-KV workspace (FlashDecoding): with it, each (token, KV head) is spread over
  /// num_splits CTAs that each walk a share of the sequence's blocks, and a second kernel
  /// merges their states. Without it, one CTA per (token, KV head), which leaves most of a large
  /// GPU idle in decode (8 KV heads: 8 CTAs). split_workspace_floats() gives its size.
  float* workspace = nullptr;
  std::size_t workspace_floats = 0;
  /// Splits per (token, KV head): 0 chooses from the device's multiprocessor count and the
  /// workspace's size; n > 0 asks for n (the workspace must hold them).
  std::int32_t num_splits = 0;
};

inline constexpr int kMaxSplits = 256;  ///< splits per (token, KV head) at most

/// Floats of workspace that `num_splits` splits need: a partial output row and its
/// log-sum-exp per split, token and query head.
[[nodiscard]] inline std::size_t split_workspace_floats(std::int32_t num_tokens,
                                                        std::int32_t num_q_heads,
                                                        std::int32_t head_dim,
                                                        std::int32_t num_splits) {
  return static_cast<std::size_t>(num_splits) * static_cast<std::size_t>(num_tokens) *
         static_cast<std::size_t>(num_q_heads) * (static_cast<std::size_t>(head_dim) + 1);
}

template <class T>
support can_implement(const attention_params<T>& p) {
  if (auto s = check_shape(p.kv.head_dim, p.kv.block_size); !s) return s;
  if (p.kv.num_kv_heads <= 0 || p.num_q_heads % p.kv.num_kv_heads != 0)
    return {false, "num_q_heads must be a multiple of num_kv_heads"};
  if (p.num_q_heads / p.kv.num_kv_heads > kMaxGroup)
    return {false, "GQA group of " + std::to_string(p.num_q_heads / p.kv.num_kv_heads) +
                       " query heads per KV head; at most " + std::to_string(kMaxGroup)};
  if (p.rope.pairs * 2 > p.kv.head_dim) return {false, "rotary_dim exceeds head_dim"};
  if (p.num_splits < 0 || p.num_splits > kMaxSplits)
    return {false, "num_splits " + std::to_string(p.num_splits) + " outside [0, " +
                       std::to_string(kMaxSplits) + "]"};
  if (p.num_splits > 1) {
    const std::size_t need =
        split_workspace_floats(p.num_tokens, p.num_q_heads, p.kv.head_dim, p.num_splits);
    if (p.workspace == nullptr || p.workspace_floats < need)
      return {false, std::to_string(p.num_splits) + " splits need a workspace of " +
                         std::to_string(need) + " floats; it holds " +
                         std::to_string(p.workspace == nullptr ? 0 : p.workspace_floats)};
  }
  return {};
}

/// The splits a launch uses: 1 without a workspace; else the requested number, or (0) enough
/// CTAs for about four per multiprocessor, as many as the workspace holds.
template <class T>
[[nodiscard]] std::int32_t choose_splits(const attention_params<T>& p) {
  if (p.workspace == nullptr) return 1;
  if (p.num_splits > 0) return p.num_splits;
  const long long ctas = static_cast<long long>(p.num_tokens) * p.kv.num_kv_heads;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 1;
  if (ctas <= 0 || ctas >= 2LL * sms) return 1;
  auto s =
      static_cast<std::int32_t>(std::min<long long>((4LL * sms + ctas - 1) / ctas, kMaxSplits));
  const std::size_t per_split =
      split_workspace_floats(p.num_tokens, p.num_q_heads, p.kv.head_dim, 1);
  s = static_cast<std::int32_t>(
      std::min<std::size_t>(static_cast<std::size_t>(s), p.workspace_floats / per_split));
  return std::max<std::int32_t>(s, 1);
}

namespace detail {

/// __expf and logf as the functors of softmax.hpp's state arithmetic (shared with the host).
struct fast_exp {
  __device__ float operator()(float x) const { return __expf(x); }
};
struct device_log {
  __device__ float operator()(float x) const { return logf(x); }
};

/// One CTA per (query token, KV head, split): kWarps warps walk the split's share of the
/// sequence's blocks, kUnroll tokens at a time (their K/V rows loaded before any is used, so
/// several loads are in flight per warp); each lane owns D/64 element pairs (rotations stay in
/// registers); the GQA group's loops run to kMaxGroup, guarded by g < G, so that their state
/// stays in registers rather than in local memory. Warps merge their online-softmax states
/// through shared memory; with one split the CTA writes the result, with several it writes a
/// normalised partial row and its log-sum-exp to the workspace (merge_splits_kernel).
template <class P, class T, int D, int BS>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(const attention_params<T> p) {
  constexpr int kPairs = D / 2 / 32;  // pairs per lane
  constexpr int kUnroll = 4;
  const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = p.num_q_heads / p.kv.num_kv_heads;
  int seq = t;
  if (p.q_indptr != nullptr) {
    int lo = 0, hi = p.table.num_seqs;  // last seq with q_indptr[seq] <= t
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (p.q_indptr[mid] <= t)
        lo = mid;
      else
        hi = mid;
    }
    seq = lo;
  }
  const pos_t m = p.q_pos[t];

  int ea[kPairs], eb[kPairs];
  bool rot[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) pair_elems(p.rope, lane * kPairs + i, ea[i], eb[i], rot[i]);

  float q1[kMaxGroup][kPairs], q2[kMaxGroup][kPairs];  // unrotated (block_relative) or at m
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= G) break;
    const float* qg = p.q + (static_cast<long long>(t) * p.num_q_heads + h * G + g) * D;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      q1[g][i] = qg[ea[i]];
      q2[g][i] = qg[eb[i]];
      if (P::kind != placement_kind::kBlockRelative && rot[i]) {
        float c, s;
        rope_angle(p.rope, m, lane * kPairs + i, false, c, s);
        rotate_pair(q1[g][i], q2[g][i], c, s);
      }
    }
  }

  float mx[kMaxGroup], sum[kMaxGroup], a1[kMaxGroup][kPairs], a2[kMaxGroup][kPairs];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    mx[g] = -INFINITY;
    sum[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) a1[g][i] = a2[g][i] = 0.0f;
  }

  // This split's share of the sequence's block entries.
  const int s0 = p.table.indptr[seq], s1 = p.table.indptr[seq + 1];
  const int share = (s1 - s0 + splits - 1) / splits;
  const int e0 = s0 + split * share, e1 = min(s1, e0 + share);
  for (int e = e0 + warp; e < e1; e += kWarps) {
    const block_entry be = p.table.entries[e];
    if (be.pos0 > m || be.len <= 0) continue;
    const int valid = min(be.len, m - be.pos0 + 1);
    float r1[kMaxGroup][kPairs], r2[kMaxGroup][kPairs];  // queries as this block needs them
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= G) break;
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        r1[g][i] = q1[g][i];
        r2[g][i] = q2[g][i];
        if (P::kind == placement_kind::kBlockRelative && rot[i]) {
          float c, s;  // (R(m) q) . (R(pos0 + j) k) = (R(m - pos0) q) . (R(j) k)
          rope_angle(p.rope, static_cast<long long>(m) - be.pos0, lane * kPairs + i, false, c, s);
          rotate_pair(r1[g][i], r2[g][i], c, s);
        }
      }
    }
    const T* kt = p.kv.k(be.block, h);
    const T* vt = p.kv.v(be.block, h);
    for (int j0 = 0; j0 < valid; j0 += kUnroll) {
      float k1[kUnroll][kPairs], k2[kUnroll][kPairs], v1[kUnroll][kPairs], v2[kUnroll][kPairs];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = min(j0 + u, valid - 1);  // rows past the end repeat the last, unused
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          k1[u][i] = to_f32(kt[j * D + ea[i]]);
          k2[u][i] = to_f32(kt[j * D + eb[i]]);
          v1[u][i] = to_f32(vt[j * D + ea[i]]);
          v2[u][i] = to_f32(vt[j * D + eb[i]]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j0 + u >= valid) break;
#pragma unroll
        for (int i = 0; i < kPairs; ++i)
          if (P::kind == placement_kind::kAtAttention && rot[i]) {
            float c, s;
            rope_angle(p.rope, static_cast<long long>(be.pos0) + j0 + u, lane * kPairs + i, false,
                       c, s);
            rotate_pair(k1[u][i], k2[u][i], c, s);
          }
        float score[kMaxGroup];
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= G) break;
          float part = 0.0f;
#pragma unroll
          for (int i = 0; i < kPairs; ++i) part += r1[g][i] * k1[u][i] + r2[g][i] * k2[u][i];
          score[g] = part;
        }
        // The group's reductions interleave (independent shuffle chains).
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
          for (int g = 0; g < kMaxGroup; ++g)
            if (g < G) score[g] += __shfl_xor_sync(0xffffffffu, score[g], o);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= G) break;
          const float sc = score[g] * p.scale;
          const float corr = online_softmax_step(mx[g], sum[g], sc, fast_exp{});
          const float w = __expf(sc - mx[g]);
          sum[g] += w;
#pragma unroll
          for (int i = 0; i < kPairs; ++i) {
            a1[g][i] = a1[g][i] * corr + w * v1[u][i];
            a2[g][i] = a2[g][i] * corr + w * v2[u][i];
          }
        }
      }
    }
  }

  // Merge the warps' states.
  __shared__ float s_mx[kWarps][kMaxGroup], s_sum[kWarps][kMaxGroup];
  __shared__ float s_acc[kWarps][kMaxGroup][D];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= G) break;
    if (lane == 0) {
      s_mx[warp][g] = mx[g];
      s_sum[warp][g] = sum[g];
    }
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      s_acc[warp][g][ea[i]] = a1[g][i];
      s_acc[warp][g][eb[i]] = a2[g][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
    const int g = idx / D, d = idx % D;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_mx[w][g]);
    float total = 0.0f, o = 0.0f;
    if (M != -INFINITY)
      for (int w = 0; w < kWarps; ++w) {
        const float f = softmax_rescale(s_mx[w][g], M, fast_exp{});
        total += s_sum[w][g] * f;
        o += s_acc[w][g][d] * f;
      }
    const long long row = static_cast<long long>(t) * p.num_q_heads + h * G + g;
    const float value = total > 0.0f ? o / total : 0.0f;
    const float lse = softmax_lse(M, total, device_log{});
    if (splits == 1) {
      p.out[row * D + d] = value;
      if (p.lse != nullptr && d == 0) p.lse[row] = lse;
    } else {
      const long long rows = static_cast<long long>(p.num_tokens) * p.num_q_heads;
      const long long prow = split * rows + row;
      p.workspace[prow * D + d] = value;
      if (d == 0) p.workspace[splits * rows * D + prow] = lse;
    }
  }
}

/// Merges the splits' partial rows: one CTA of D threads per (token, query head).
template <class T, int D>
__global__ void __launch_bounds__(D) merge_splits_kernel(const attention_params<T> p, int splits) {
  const long long row = blockIdx.x, rows = static_cast<long long>(p.num_tokens) * p.num_q_heads;
  const int d = threadIdx.x;
  const float* part = p.workspace;
  const float* lse = p.workspace + splits * rows * D;
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, lse[s * rows + row]);
  float total = 0.0f, o = 0.0f;
  if (M != -INFINITY)
    for (int s = 0; s < splits; ++s) {
      const float l = lse[s * rows + row];
      if (l == -INFINITY) continue;
      const float w = expf(l - M);
      total += w;
      o += w * part[(s * rows + row) * D + d];
    }
  p.out[row * D + d] = total > 0.0f ? o / total : 0.0f;
  if (p.lse != nullptr && d == 0) p.lse[row] = M == -INFINITY ? -INFINITY : M + logf(total);
}

}  // namespace detail

/// Paged attention (decode when q_indptr is null, prefill otherwise), split over the blocks
/// when a workspace is given (choose_splits). Checks the launches with cudaPeekAtLastError;
/// does not synchronize.
template <class P, class T>
[[nodiscard]] cudaError_t paged_attention(const attention_params<T>& p, cudaStream_t stream) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  if (!can_implement(p)) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  const std::int32_t splits = choose_splits(p);
  return dispatch_shape(p.kv.head_dim, p.kv.block_size, [&](auto d, auto bs) {
    constexpr int D = decltype(d)::value;
    const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.kv.num_kv_heads),
                    static_cast<unsigned>(splits));
    detail::paged_attention_kernel<P, T, D, decltype(bs)::value>
        <<<grid, kWarps * 32, 0, stream>>>(p);
    if (splits > 1) {
      if (cudaError_t e = cudaPeekAtLastError(); e != cudaSuccess) return e;
      const auto rows = static_cast<unsigned>(p.num_tokens * p.num_q_heads);
      detail::merge_splits_kernel<T, D><<<rows, D, 0, stream>>>(p, splits);
    }
    return cudaPeekAtLastError();
  });
}

}  // namespace cuda
RELOKV_NAMESPACE_END
