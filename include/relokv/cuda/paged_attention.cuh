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
};

template <class T>
support can_implement(const attention_params<T>& p) {
  if (auto s = check_shape(p.kv.head_dim, p.kv.block_size); !s) return s;
  if (p.kv.num_kv_heads <= 0 || p.num_q_heads % p.kv.num_kv_heads != 0)
    return {false, "num_q_heads must be a multiple of num_kv_heads"};
  if (p.num_q_heads / p.kv.num_kv_heads > kMaxGroup)
    return {false, "GQA group of " + std::to_string(p.num_q_heads / p.kv.num_kv_heads) +
                       " query heads per KV head; at most " + std::to_string(kMaxGroup)};
  if (p.rope.pairs * 2 > p.kv.head_dim) return {false, "rotary_dim exceeds head_dim"};
  return {};
}

namespace detail {

/// __expf and logf as the functors of softmax.hpp's state arithmetic (shared with the host).
struct fast_exp {
  __device__ float operator()(float x) const { return __expf(x); }
};
struct device_log {
  __device__ float operator()(float x) const { return logf(x); }
};

/// One CTA per (query token, KV head): kWarps warps split the sequence's blocks, each lane
/// owns D/64 element pairs (so rotations stay in registers), warps merge online-softmax
/// states through shared memory at the end.
template <class P, class T, int D, int BS>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(const attention_params<T> p) {
  constexpr int kPairs = D / 2 / 32;  // pairs per lane
  const int t = blockIdx.x, h = blockIdx.y;
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
  for (int i = 0; i < kPairs; ++i) pair_elems(p.rope, lane * kPairs + i, ea[i], eb[i], rot[i]);

  float q1[kMaxGroup][kPairs], q2[kMaxGroup][kPairs];  // unrotated (block_relative) or at m
  for (int g = 0; g < G; ++g) {
    const float* qg = p.q + (static_cast<long long>(t) * p.num_q_heads + h * G + g) * D;
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
  for (int g = 0; g < kMaxGroup; ++g) {
    mx[g] = -INFINITY;
    sum[g] = 0.0f;
    for (int i = 0; i < kPairs; ++i) a1[g][i] = a2[g][i] = 0.0f;
  }

  const int e0 = p.table.indptr[seq], e1 = p.table.indptr[seq + 1];
  for (int e = e0 + warp; e < e1; e += kWarps) {
    const block_entry be = p.table.entries[e];
    if (be.pos0 > m || be.len <= 0) continue;
    const int valid = min(be.len, m - be.pos0 + 1);
    float r1[kMaxGroup][kPairs], r2[kMaxGroup][kPairs];  // queries as this block needs them
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < kPairs; ++i) {
        r1[g][i] = q1[g][i];
        r2[g][i] = q2[g][i];
        if (P::kind == placement_kind::kBlockRelative && rot[i]) {
          float c, s;  // (R(m) q) . (R(pos0 + j) k) = (R(m - pos0) q) . (R(j) k)
          rope_angle(p.rope, static_cast<long long>(m) - be.pos0, lane * kPairs + i, false, c, s);
          rotate_pair(r1[g][i], r2[g][i], c, s);
        }
      }
    const T* kt = p.kv.k(be.block, h);
    const T* vt = p.kv.v(be.block, h);
    for (int j = 0; j < valid; ++j) {
      float k1[kPairs], k2[kPairs], v1[kPairs], v2[kPairs];
      for (int i = 0; i < kPairs; ++i) {
        k1[i] = to_f32(kt[j * D + ea[i]]);
        k2[i] = to_f32(kt[j * D + eb[i]]);
        v1[i] = to_f32(vt[j * D + ea[i]]);
        v2[i] = to_f32(vt[j * D + eb[i]]);
        if (P::kind == placement_kind::kAtAttention && rot[i]) {
          float c, s;
          rope_angle(p.rope, static_cast<long long>(be.pos0) + j, lane * kPairs + i, false, c, s);
          rotate_pair(k1[i], k2[i], c, s);
        }
      }
      for (int g = 0; g < G; ++g) {
        float part = 0.0f;
        for (int i = 0; i < kPairs; ++i) part += r1[g][i] * k1[i] + r2[g][i] * k2[i];
        const float score = warp_sum(part) * p.scale;
        const float corr = online_softmax_step(mx[g], sum[g], score, fast_exp{});
        const float w = __expf(score - mx[g]);
        sum[g] += w;
        for (int i = 0; i < kPairs; ++i) {
          a1[g][i] = a1[g][i] * corr + w * v1[i];
          a2[g][i] = a2[g][i] * corr + w * v2[i];
        }
      }
    }
  }

  // Merge the warps' states.
  __shared__ float s_mx[kWarps][kMaxGroup], s_sum[kWarps][kMaxGroup];
  __shared__ float s_acc[kWarps][kMaxGroup][D];
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      s_mx[warp][g] = mx[g];
      s_sum[warp][g] = sum[g];
    }
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
    p.out[row * D + d] = total > 0.0f ? o / total : 0.0f;
    if (p.lse != nullptr && d == 0) p.lse[row] = softmax_lse(M, total, device_log{});
  }
}

}  // namespace detail

/// Paged attention (decode when q_indptr is null, prefill otherwise). Checks the launch with
/// cudaPeekAtLastError; does not synchronize.
template <class P, class T>
[[nodiscard]] cudaError_t paged_attention(const attention_params<T>& p, cudaStream_t stream) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  if (!can_implement(p)) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return dispatch_shape(p.kv.head_dim, p.kv.block_size, [&](auto d, auto bs) {
    const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.kv.num_kv_heads));
    detail::paged_attention_kernel<P, T, decltype(d)::value, decltype(bs)::value>
        <<<grid, kWarps * 32, 0, stream>>>(p);
    return cudaPeekAtLastError();
  });
}

}  // namespace cuda
RELOKV_NAMESPACE_END
