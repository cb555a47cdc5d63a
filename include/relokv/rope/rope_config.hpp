#pragma once
/// @file
/// RoPE configuration and per-pair inverse frequencies (NeoX/GPT-J layouts, partial rotary,
/// linear, Llama-3.1 and YaRN scaling, YaRN's truncate and DeepSeek's mscale_all_dim).
#include <cmath>
#include <cstdint>
#include <string>

#include "relokv/types.hpp"

RELOKV_NAMESPACE_BEGIN

/// How rotated dimensions pair up.
enum class rope_layout : std::uint8_t {
  kNeoX,  ///< pair i is (x[i], x[i + rotary_dim/2]) (Llama in HF, NeoX)
  kGPTJ,  ///< pair i is (x[2i], x[2i+1]) (GPT-J, llama.cpp's "normal" mode)
};

enum class rope_scaling : std::uint8_t { kNone, kLinear, kLlama3, kYaRN };

/// RoPE parameters, as a model's config (or GGUF metadata) gives them.
struct rope_config {
  std::int32_t head_dim = 128;
  std::int32_t rotary_dim = 128;  ///< <= head_dim, even; dimensions past it are not rotated
  double theta = 10000.0;
  rope_layout layout = rope_layout::kNeoX;
  rope_scaling scaling = rope_scaling::kNone;
  double factor = 1.0;  ///< linear, Llama-3.1 and YaRN scale factor
  // Llama-3.1
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int32_t original_max_position = 8192;  ///< also YaRN's original context length
  // YaRN
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  /// YaRN attention factor applied to cos and sin; 0 means the default: 0.1 ln(factor) + 1,
  /// or DeepSeek's mscale ratio when yarn_mscale and yarn_mscale_all_dim are both set.
  double yarn_attn_factor = 0.0;
  /// YaRN `truncate` (Hugging Face's default true): the correction range's ends are rounded
  /// out to whole dimensions (floor, ceil); false keeps them fractional (GPT-OSS).
  bool yarn_truncate = true;
  /// DeepSeek-style YaRN (`mscale`, `mscale_all_dim`): with both set, the factor on cos and
  /// sin is get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), where
  /// get_mscale(s, m) = 0.1 m ln(s) + 1 (1 for s <= 1). The softmax scale's own factor
  /// (get_mscale(factor, mscale_all_dim)^2 in DeepSeek-V2/V3) is the caller's: softmax_factor.
  double yarn_mscale = 0.0;
  double yarn_mscale_all_dim = 0.0;

  friend bool operator==(const rope_config&, const rope_config&) = default;

  /// @throws error naming the bad field.
  void validate() const {
    if (head_dim <= 0 || head_dim > kMaxHeadDim)
      throw error("rope_config: head_dim must be in (0, " + std::to_string(kMaxHeadDim) +
                  "], got " + std::to_string(head_dim));
    if (rotary_dim <= 0 || rotary_dim > head_dim || rotary_dim % 2 != 0)
      throw error("rope_config: rotary_dim must be even and in (0, head_dim], got " +
                  std::to_string(rotary_dim) + " for head_dim " + std::to_string(head_dim));
    if (!(theta > 1.0)) throw error("rope_config: theta must be > 1");
    if (scaling != rope_scaling::kNone && !(factor > 0.0))
      throw error("rope_config: scaling factor must be positive");
    if (scaling == rope_scaling::kLlama3 &&
        (!(high_freq_factor > low_freq_factor) || original_max_position <= 0))
      throw error("rope_config: Llama-3.1 scaling needs high_freq_factor > low_freq_factor");
    if (scaling == rope_scaling::kYaRN && (original_max_position <= 0 || !(beta_fast > beta_slow)))
      throw error("rope_config: YaRN needs original_max_position > 0 and beta_fast > beta_slow");
    if (yarn_attn_factor < 0.0 || yarn_mscale < 0.0 || yarn_mscale_all_dim < 0.0)
      throw error(
          "rope_config: YaRN attention factor, mscale and mscale_all_dim must not be "
          "negative");
  }
  [[nodiscard]] std::int32_t pairs() const noexcept { return rotary_dim / 2; }
};

/// Scaled inverse frequency of pair i (radians per position), in double precision.
[[nodiscard]] inline double inv_freq(const rope_config& c, std::int32_t i) noexcept {
  const double base = std::pow(c.theta, -2.0 * i / c.rotary_dim);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  switch (c.scaling) {
    case rope_scaling::kNone:
      return base;
    case rope_scaling::kLinear:
      return base / c.factor;
    case rope_scaling::kLlama3: {
      const double wavelen = kTwoPi / base;
      const double low_wavelen = c.original_max_position / c.low_freq_factor;
      const double high_wavelen = c.original_max_position / c.high_freq_factor;
      if (wavelen < high_wavelen) return base;            // high frequency: kept
      if (wavelen > low_wavelen) return base / c.factor;  // low frequency: interpolated
      const double smooth = (c.original_max_position / wavelen - c.low_freq_factor) /
                            (c.high_freq_factor - c.low_freq_factor);
      return (1.0 - smooth) * base / c.factor + smooth * base;
    }
    case rope_scaling::kYaRN: {
      // Dimension index where a given number of rotations fits the original context.
      const auto dim_for = [&](double rotations) {
        return c.rotary_dim * std::log(c.original_max_position / (rotations * kTwoPi)) /
               (2.0 * std::log(c.theta));
      };
      double low = dim_for(c.beta_fast);
      double high = dim_for(c.beta_slow);
      if (c.yarn_truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = low < 0 ? 0 : low;
      high = high > c.rotary_dim - 1 ? c.rotary_dim - 1 : high;
      if (high == low) high += 0.001;
      double ramp = (i - low) / (high - low);
      ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
      const double extrapolation = 1.0 - ramp;  // 1: keep the original frequency
      return base / c.factor * (1.0 - extrapolation) + base * extrapolation;
    }
  }
  return base;
}

/// YaRN's get_mscale(scale, m): 0.1 m ln(scale) + 1, and 1 for scale <= 1.
[[nodiscard]] inline double yarn_get_mscale(double scale, double m = 1.0) noexcept {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

/// Factor applied to cos and sin (YaRN's attention scaling; 1 otherwise).
[[nodiscard]] inline double magnitude(const rope_config& c) noexcept {
  if (c.scaling != rope_scaling::kYaRN) return 1.0;
  if (c.yarn_attn_factor > 0.0) return c.yarn_attn_factor;
  if (c.yarn_mscale > 0.0 && c.yarn_mscale_all_dim > 0.0)
    return yarn_get_mscale(c.factor, c.yarn_mscale) /
           yarn_get_mscale(c.factor, c.yarn_mscale_all_dim);
  return yarn_get_mscale(c.factor);
}

/// Factor on the softmax scale that DeepSeek-style YaRN asks for beside the magnitude:
/// get_mscale(factor, mscale_all_dim)^2 where mscale_all_dim is set, 1 otherwise.
[[nodiscard]] inline double softmax_factor(const rope_config& c) noexcept {
  if (c.scaling != rope_scaling::kYaRN || !(c.yarn_mscale_all_dim > 0.0)) return 1.0;
  const double m = yarn_get_mscale(c.factor, c.yarn_mscale_all_dim);
  return m * m;
}

RELOKV_NAMESPACE_END
