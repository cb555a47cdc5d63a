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
#include <atomic>
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
  /// Splits per (token, KV head): 0 fills one wave of the kernel's resident CTAs, as far as
  /// the workspace allows (choose_splits); n > 0 asks for n (the workspace must hold them).
  std::int32_t num_splits = 0;
  /// Sliding window, as relokv::attention_params::window: a query at logical position m sees
  /// the keys at logical positions in (m - window, m]; 0: no window.
  std::int32_t window = 0;
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
  if (p.window < 0)
    return {false, "window must be 0 (none) or positive, got " + std::to_string(p.window)};
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

namespace detail {

/// The split count for `resident` CTAs per multiprocessor (what the kernel's registers and
/// shared memory allow): 1 without a workspace; else the requested number, or (0) as many
/// as fill the device's CTA slots in one wave (a partial second wave costs up to half the
/// kernel's time on a short decode), capped by kMaxSplits and by what the workspace holds.
template <class T>
[[nodiscard]] std::int32_t split_count(const attention_params<T>& p, int resident) {
  if (p.workspace == nullptr) return 1;
  if (p.num_splits > 0) return p.num_splits;
  const long long ctas = static_cast<long long>(p.num_tokens) * p.kv.num_kv_heads;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 1;
  const long long slots = static_cast<long long>(std::max(resident, 1)) * sms;
  if (ctas <= 0 || 2 * ctas > slots) return 1;
  auto s = static_cast<std::int32_t>(std::min<long long>(slots / ctas, kMaxSplits));
  const std::size_t per_split =
      split_workspace_floats(p.num_tokens, p.num_q_heads, p.kv.head_dim, 1);
  s = static_cast<std::int32_t>(
      std::min<std::size_t>(static_cast<std::size_t>(s), p.workspace_floats / per_split));
  return std::max<std::int32_t>(s, 1);
}

/// __expf and logf as the functors of softmax.hpp's state arithmetic (shared with the host).
struct fast_exp {
  __device__ float operator()(float x) const { return __expf(x); }
};
struct device_log {
  __device__ float operator()(float x) const { return logf(x); }
};

template <int V>
inline constexpr int kLog2 = V <= 1 ? 0 : 1 + kLog2<V / 2>;

/// Stages St.. of the transposed reduction of V values per lane: at stage St, lanes whose bit
/// (16 >> St) is set keep the upper half of the values they still hold, the others the lower
/// half, each adding its partner's copy of what it keeps. After log2(V) stages lane l holds the
/// sum, over the lanes that differ from it in bits 16 .. 32 / V, of value l / (32 / V), in
/// sc[0]. (Recursion, not a loop, so that every index is a constant and sc stays in registers.)
template <int V, int St, int N>
__device__ __forceinline__ void transposed_reduce(float (&sc)[V], int lane) {
  if constexpr (St < N) {
    constexpr int o = 16 >> St, half = V >> (St + 1);
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float send = upper ? sc[i] : sc[i + half];
      const float keep = upper ? sc[i + half] : sc[i];
      sc[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
    transposed_reduce<V, St + 1, N>(sc, lane);
  }
}

/// One CTA per (query token, KV head, split): kWarps warps walk the split's share of the
/// sequence's blocks a tile of C tokens at a time. Lanes own D/64 element pairs of every row
/// (so rotations stay in registers). A tile's kG x C partial dot products are reduced across the
/// warp by a transposed butterfly (each stage exchanges half of the values still held, 31
/// shuffles for 32 scores instead of 5 per score), after which lane l holds score l / kRep;
/// the softmax then takes one step per tile and query head, and P.V broadcasts each
/// probability from the lane that holds it. kG is the GQA group rounded up to a power of two
/// (query heads g >= G are masked), so that the group's state stays in registers. Warps merge
/// their states through shared memory; with one split the CTA writes the result, with several
/// a normalised partial row and its log-sum-exp to the workspace (merge_splits_kernel).
template <class P, class T, int D, int BS, int kG>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(const attention_params<T> p) {
  constexpr int kPairs = D / 2 / 32;  // pairs per lane
  // Tokens per tile: up to 32 scores, at most 64 floats of K/V per lane, dividing BS.
  constexpr int C0 = 32 / kG < BS ? 32 / kG : BS;
  constexpr int C = C0 < 16 / kPairs ? C0 : 16 / kPairs;
  constexpr int V = kG * C;             // scores per tile, at most 32
  constexpr int kScatter = kLog2<V>;    // transposed-reduction stages
  constexpr int kRep = 32 / V;          // lanes that end with the same score
  constexpr int kGroupLanes = 32 / kG;  // lanes holding one query head's scores
  static_assert((1 << kScatter) == V && BS % C == 0);
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
  const int mine = lane / kRep;  // the score this lane holds after the reduction
  const int my_g = mine / C, my_c = mine % C;

  int ea[kPairs], eb[kPairs];
  bool rot[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) pair_elems(p.rope, lane * kPairs + i, ea[i], eb[i], rot[i]);

  // Queries unrotated (rotated per block, below) or at m (pre_rotated); 0 for g >= G.
  float q1[kG][kPairs], q2[kG][kPairs];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const float* qg = p.q + (static_cast<long long>(t) * p.num_q_heads + h * G + g) * D;
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      q1[g][i] = g < G ? qg[ea[i]] : 0.0f;
      q2[g][i] = g < G ? qg[eb[i]] : 0.0f;
      if (P::kind == placement_kind::kPreRotated && rot[i]) {
        float c, s;
        rope_angle(p.rope, m, lane * kPairs + i, false, c, s);
        rotate_pair(q1[g][i], q2[g][i], c, s);
      }
    }
  }

  float mx[kG], sum[kG], a1[kG][kPairs], a2[kG][kPairs];  // the same in every lane
#pragma unroll
  for (int g = 0; g < kG; ++g) {
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
    // The first slot inside the window (by the reading request's positions); none: skip.
    const long long cut = p.window > 0 ? static_cast<long long>(m) - p.window + 1 - be.pos0 : 0;
    const int first = cut <= 0 ? 0 : static_cast<int>(cut < valid ? cut : valid);
    if (first >= valid) continue;
    float r1[kG][kPairs], r2[kG][kPairs];  // queries as this block needs them
#pragma unroll
    for (int g = 0; g < kG; ++g)
#pragma unroll
      for (int i = 0; i < kPairs; ++i) {
        r1[g][i] = q1[g][i];
        r2[g][i] = q2[g][i];
        // (R(m) q) . (R(pos0 + j) k) = (R(m - pos0) q) . (R(j) k): block_relative stored
        // R(j) k; at_attention applies R(j) below, from the table's first BS rows (which stay
        // in L1), instead of reading a row per key position.
        if (P::kind != placement_kind::kPreRotated && rot[i]) {
          float c, s;
          rope_angle(p.rope, static_cast<long long>(m) - be.pos0, lane * kPairs + i, false, c, s);
          rotate_pair(r1[g][i], r2[g][i], c, s);
        }
      }
    const T* kt = p.kv.k(be.block, h);
    const T* vt = p.kv.v(be.block, h);
    for (int j0 = first; j0 < valid; j0 += C) {
      float k1[C][kPairs], k2[C][kPairs], v1[C][kPairs], v2[C][kPairs];
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int j = min(j0 + c, valid - 1);  // rows past the end repeat the last, masked
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          k1[c][i] = to_f32(kt[j * D + ea[i]]);
          k2[c][i] = to_f32(kt[j * D + eb[i]]);
          v1[c][i] = to_f32(vt[j * D + ea[i]]);
          v2[c][i] = to_f32(vt[j * D + eb[i]]);
        }
      }
      if constexpr (P::kind == placement_kind::kAtAttention) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const int j = min(j0 + c, valid - 1);  // the offset in the block
#pragma unroll
          for (int i = 0; i < kPairs; ++i)
            if (rot[i]) {
              float cs, sn;
              rope_angle(p.rope, j, lane * kPairs + i, false, cs, sn);
              rotate_pair(k1[c][i], k2[c][i], cs, sn);
            }
        }
      }
      // Partial dot products, then the transposed reduction.
      float sc[V];
#pragma unroll
      for (int g = 0; g < kG; ++g)
#pragma unroll
        for (int c = 0; c < C; ++c) {
          float part = 0.0f;
#pragma unroll
          for (int i = 0; i < kPairs; ++i) part += r1[g][i] * k1[c][i] + r2[g][i] * k2[c][i];
          sc[g * C + c] = part;
        }
      transposed_reduce<V, 0, kScatter>(sc, lane);
      float score = sc[0];
#pragma unroll
      for (int o = 16 >> kScatter; o > 0; o >>= 1) score += __shfl_xor_sync(0xffffffffu, score, o);
      score = (my_g < G && j0 + my_c < valid) ? score * p.scale : -INFINITY;

      // One softmax step per query head and tile.
      float tmax = score;
#pragma unroll
      for (int o = 1; o < kGroupLanes; o <<= 1)
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      float corr[kG], m_mine = -INFINITY;
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        const float tm = __shfl_sync(0xffffffffu, tmax, g * kGroupLanes);
        const float m_new = fmaxf(mx[g], tm);
        corr[g] = softmax_rescale(mx[g], m_new, fast_exp{});
        mx[g] = m_new;
        if (g == my_g) m_mine = m_new;
      }
      const float prob = score == -INFINITY ? 0.0f : __expf(score - m_mine);
      float psum = lane % kRep == 0 ? prob : 0.0f;  // each score counted once
#pragma unroll
      for (int o = 1; o < kGroupLanes; o <<= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        sum[g] = sum[g] * corr[g] + __shfl_sync(0xffffffffu, psum, g * kGroupLanes);
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          a1[g][i] *= corr[g];
          a2[g][i] *= corr[g];
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const float w = __shfl_sync(0xffffffffu, prob, (g * C + c) * kRep);
#pragma unroll
          for (int i = 0; i < kPairs; ++i) {
            a1[g][i] += w * v1[c][i];
            a2[g][i] += w * v2[c][i];
          }
        }
      }
    }
  }

  // Merge the warps' states.
  __shared__ float s_mx[kWarps][kG], s_sum[kWarps][kG];
  __shared__ float s_acc[kWarps][kG][D];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
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

/// Merges the splits' partial rows: one CTA of D threads per (token, query head). The
/// splits' log-sum-exps are read once, in parallel, into shared weights; each thread then
/// issues its splits' independent loads of its column.
template <class T, int D>
__global__ void __launch_bounds__(D) merge_splits_kernel(const attention_params<T> p, int splits) {
  static_assert(D % 32 == 0);
  __shared__ float weight[kMaxSplits];
  __shared__ float warp_max[D / 32];
  const long long row = blockIdx.x, rows = static_cast<long long>(p.num_tokens) * p.num_q_heads;
  const int d = threadIdx.x;
  const float* part = p.workspace;
  const float* lse = p.workspace + splits * rows * D;
  float m = -INFINITY;
  for (int s = d; s < splits; s += D) {
    weight[s] = lse[s * rows + row];
    m = fmaxf(m, weight[s]);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (d % 32 == 0) warp_max[d / 32] = m;
  __syncthreads();
  float M = warp_max[0];
#pragma unroll
  for (int w = 1; w < D / 32; ++w) M = fmaxf(M, warp_max[w]);
  for (int s = d; s < splits; s += D)  // an empty split (-inf) weighs 0, even when all are
    weight[s] = weight[s] == -INFINITY ? 0.0f : expf(weight[s] - M);
  __syncthreads();
  float total = 0.0f, o = 0.0f;
#pragma unroll 8
  for (int s = 0; s < splits; ++s) {
    total += weight[s];
    o += weight[s] * part[(s * rows + row) * D + d];
  }
  p.out[row * D + d] = total > 0.0f ? o / total : 0.0f;
  if (p.lse != nullptr && d == 0) p.lse[row] = total > 0.0f ? M + logf(total) : -INFINITY;
}

/// CTAs of paged_attention_kernel<P, T, D, BS, kG> resident per multiprocessor (1 when the
/// query fails). The answer depends only on the kernel and the device, so it is asked once per
/// device (the first 16) rather than on every launch.
template <class P, class T, int D, int BS, int kG>
int resident_ctas() {
  static std::atomic<int> known[16] = {};  // 0: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  const bool cached = device >= 0 && device < 16;
  if (cached)
    if (const int n = known[device].load(std::memory_order_relaxed); n > 0) return n;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, paged_attention_kernel<P, T, D, BS, kG>,
                                                    kWarps * 32, 0) != cudaSuccess ||
      n < 1)
    return 1;
  if (cached) known[device].store(n, std::memory_order_relaxed);
  return n;
}

/// Calls f(kernel, head_dim constant, resident CTAs per SM) with the decode/prefill kernel
/// instantiated for p's shape and GQA group (rounded up to 1, 2, 4 or 8).
template <class P, class T, class F>
cudaError_t with_kernel(const attention_params<T>& p, F&& f) {
  const int group = p.num_q_heads / p.kv.num_kv_heads;
  return dispatch_shape(p.kv.head_dim, p.kv.block_size, [&](auto d, auto bs) -> cudaError_t {
    constexpr int D = decltype(d)::value, BS = decltype(bs)::value;
    auto go = [&](auto kg) {
      constexpr int kG = decltype(kg)::value;
      return f(&paged_attention_kernel<P, T, D, BS, kG>, d, resident_ctas<P, T, D, BS, kG>());
    };
    using std::integral_constant;
    if (group <= 1) return go(integral_constant<int, 1>{});
    if (group <= 2) return go(integral_constant<int, 2>{});
    if (group <= 4) return go(integral_constant<int, 4>{});
    return go(integral_constant<int, 8>{});
  });
}

}  // namespace detail

/// The splits paged_attention<P> uses for p: 1 without a workspace; else p.num_splits, or (0)
/// as many as fill the device's CTA slots for this kernel in one wave, as the workspace allows.
template <class P, class T>
[[nodiscard]] std::int32_t choose_splits(const attention_params<T>& p) {
  std::int32_t splits = 1;
  (void)detail::with_kernel<P>(p, [&](auto, auto, int resident) {
    splits = detail::split_count(p, resident);
    return cudaSuccess;
  });
  return splits;
}

/// Paged attention (decode when q_indptr is null, prefill otherwise), split over the blocks
/// when a workspace is given (choose_splits). Checks the launches with cudaPeekAtLastError;
/// does not synchronize.
template <class P, class T>
[[nodiscard]] cudaError_t paged_attention(const attention_params<T>& p, cudaStream_t stream) {
  static_assert(rope_placement<P>, "P must model relokv::rope_placement");
  if (!can_implement(p)) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return detail::with_kernel<P>(p, [&](auto kernel, auto d, int resident) -> cudaError_t {
    constexpr int D = decltype(d)::value;
    const std::int32_t splits = detail::split_count(p, resident);
    const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.kv.num_kv_heads),
                    static_cast<unsigned>(splits));
    kernel<<<grid, kWarps * 32, 0, stream>>>(p);
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
