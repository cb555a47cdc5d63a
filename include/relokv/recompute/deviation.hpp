#pragma once
/// @file
/// Per-token KV deviation (L2 and cosine) and top-k selection: the host kernels behind
/// CacheBlend-style selective recompute.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "relokv/dtype.hpp"
#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

enum class deviation_metric : std::uint8_t {
  kL2,      ///< ||K_c - K_f|| + ||V_c - V_f|| (CacheBlend)
  kCosine,  ///< (1 - cos(K_c, K_f)) + (1 - cos(V_c, V_f)) (KVBoost)
};

/// Deviation of n tokens: row t of the cached K/V (storage type T) against the freshly
/// computed row t (fp32), both in storage form (as append_kv writes them), each row `width`
/// elements (num_kv_heads * head_dim).
/// @param out [n]
template <class T>
void token_deviation(deviation_metric metric, const T* cached_k, const T* cached_v,
                     const float* fresh_k, const float* fresh_v, std::int32_t n, std::int32_t width,
                     float* out) {
  const auto w = static_cast<std::size_t>(width);
  for (std::int32_t t = 0; t < n; ++t) {
    float dev = 0.0f;
    for (int kv = 0; kv < 2; ++kv) {
      const T* c = (kv == 0 ? cached_k : cached_v) + static_cast<std::size_t>(t) * w;
      const float* f = (kv == 0 ? fresh_k : fresh_v) + static_cast<std::size_t>(t) * w;
      float dd = 0.0f, cc = 0.0f, ff = 0.0f, cf = 0.0f;
      for (std::size_t i = 0; i < w; ++i) {
        const float a = to_f32(c[i]), b = f[i];
        dd += (a - b) * (a - b);
        cc += a * a;
        ff += b * b;
        cf += a * b;
      }
      if (metric == deviation_metric::kL2) {
        dev += std::sqrt(dd);
      } else {
        const float denom = std::sqrt(cc) * std::sqrt(ff);
        dev += denom > 0.0f ? 1.0f - cf / denom : (cc == ff ? 0.0f : 1.0f);
      }
    }
    out[t] = dev;
  }
}

/// Sets mask[i] = 1 for the k eligible entries (eligible[i] != 0) with the highest score; ties
/// go to the lower index. A NaN score (a cached or fresh row that is not finite) ranks above
/// every number, so that the token is recomputed rather than trusted; NaNs among themselves go
/// by index. Entries that are not eligible are left as they are.
inline void select_topk(std::span<const float> score, std::span<const std::uint8_t> eligible,
                        std::int64_t k, std::span<std::uint8_t> mask) {
  std::vector<std::int32_t> idx;
  for (std::size_t i = 0; i < score.size(); ++i)
    if (eligible[i]) idx.push_back(static_cast<std::int32_t>(i));
  k = std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(idx.size()));
  // A strict weak order over floats with NaN: nth_element's ordering is undefined otherwise.
  const auto better = [&](std::int32_t a, std::int32_t b) {
    const float sa = score[static_cast<std::size_t>(a)], sb = score[static_cast<std::size_t>(b)];
    const bool na = std::isnan(sa), nb = std::isnan(sb);
    if (na || nb) return na && (!nb || a < b);
    return sa > sb || (sa == sb && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  for (std::int64_t i = 0; i < k; ++i)
    mask[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)])] = 1;
}

RELOKV_NAMESPACE_END
