#pragma once
/// @file
/// The portable path: any head_dim, block size and compiler; the reference the fast paths are
/// tested against.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "relokv/attention/detail/kernel_common.hpp"
#include "relokv/attention/detail/simd.hpp"
#include "relokv/attention/softmax.hpp"
#include "relokv/concepts/rope_placement.hpp"
#include "relokv/dtype.hpp"
#include "relokv/memory/paged_view.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

template <class P, class T>
void portable_block_head(const block_head_t<T>& bh, attention_scratch& w) {
  prefetch_cursor(bh.pf, bh.pf_bytes, 1).finish();
  const T* kt = bh.kt;
  const T* vt = bh.vt;
  const int valid = bh.valid, first = bh.first, h = bh.h, G = bh.G, D = bh.D, pairs = bh.pairs;
  const rope_layout layout = bh.layout;
  const float* qsrc = bh.qsrc;
  const auto hd = static_cast<std::size_t>(D);
  {
    const float* kf;
    const float* vf;
    constexpr bool direct = std::is_same_v<std::remove_const_t<T>, float>;
    if constexpr (direct && P::kind != placement_kind::kAtAttention) {
      kf = reinterpret_cast<const float*>(kt);
    } else {
      for (int j = first; j < valid; ++j)
        to_float_row(kt + static_cast<std::ptrdiff_t>(j) * D, w.kbuf.data() + j * hd, D);
      if constexpr (P::kind == placement_kind::kAtAttention)
        for (int j = first; j < valid; ++j)
          rotate_inplace(
              w.kbuf.data() + j * hd, layout, pairs,
              w.kcos.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs),
              w.ksin.data() + static_cast<std::size_t>(j) * static_cast<std::size_t>(pairs));
      kf = w.kbuf.data();
    }
    if constexpr (direct) {
      vf = reinterpret_cast<const float*>(vt);
    } else {
      for (int j = first; j < valid; ++j)
        to_float_row(vt + static_cast<std::ptrdiff_t>(j) * D, w.vbuf.data() + j * hd, D);
      vf = w.vbuf.data();
    }
    for (int g = 0; g < G; ++g) {
      const std::size_t qh = static_cast<std::size_t>(h * G + g);
      const float* qg = qsrc + qh * hd;
      float* s = w.scores.data();
      float bmax = -std::numeric_limits<float>::infinity();
      for (int j = first; j < valid; ++j) {
        s[j] = dot(qg, kf + static_cast<std::ptrdiff_t>(j) * D, D);
        bmax = std::max(bmax, s[j]);
      }
      // 0 on the first block; the CUDA kernels take the same step per score
      const float corr = bh.sm.rescale(qh, bmax, host_exp{});
      const float m_new = bh.sm.mx[qh];
      float bsum = 0.0f;
      for (int j = first; j < valid; ++j) {
        s[j] = exp_nonpositive(s[j] - m_new);
        bsum += s[j];
      }
      bh.sm.add(qh, bsum);
      float* acc = bh.acc + qh * hd;
      for (int d = 0; d < D; ++d) acc[d] *= corr;
      for (int j = first; j < valid; ++j) {
        const float p = s[j];
        const float* vj = vf + static_cast<std::ptrdiff_t>(j) * D;
        for (int d = 0; d < D; ++d) acc[d] += p * vj[d];
      }
    }
  }
}

/// The portable path as attend_group's dispatch tag: any head_dim, block size and dtype.
struct portable_path {
  static constexpr bool kSimd = false;     ///< no SIMD kernels (no grouped prefill)
  static constexpr bool kBf16Dot = false;  ///< no bf16 products (fp32 accumulators in order)
  template <class P, class T>
  static void block_head(const block_head_t<T>& bh, attention_scratch& w) {
    portable_block_head<P>(bh, w);
  }
};

}  // namespace detail
RELOKV_NAMESPACE_END
