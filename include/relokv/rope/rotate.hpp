#pragma once
/// @file
/// Rotation math shared by host and device kernels, and the host cos/sin table.
///
/// Precision: angles are formed in double (pos * inv_freq) and cos/sin evaluated in double, then
/// rounded to float, so a table entry is within 0.5 ulp of the exact value. Attention composes
/// R(pos0 + j) = R(pos0) R(j) from two table entries in float: at most ~2 ulp more. Forming
/// the angle in float instead would lose about pos * 2^-24 radians (2e-3 rad at 32k), which is
/// why the table (and the exact path beyond it) never does.
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "relokv/detail/huge_page_allocator.hpp"
#include "relokv/rope/rope_config.hpp"

RELOKV_NAMESPACE_BEGIN

/// Index of the two elements of pair i in a head vector.
RELOKV_HOST_DEVICE void pair_index(rope_layout layout, std::int32_t pairs, std::int32_t i,
                                   std::int32_t& a, std::int32_t& b) {
  if (layout == rope_layout::kNeoX) {
    a = i;
    b = i + pairs;
  } else {
    a = 2 * i;
    b = 2 * i + 1;
  }
}

/// Rotates the first 2*pairs dimensions of x in place by per-pair (cos, sin).
/// @pre cs and sn hold `pairs` entries.
RELOKV_HOST_DEVICE void rotate_inplace(float* x, rope_layout layout, std::int32_t pairs,
                                       const float* cs, const float* sn) {
  if (layout == rope_layout::kNeoX) {
    for (std::int32_t i = 0; i < pairs; ++i) {
      const float x1 = x[i], x2 = x[i + pairs];
      x[i] = x1 * cs[i] - x2 * sn[i];
      x[i + pairs] = x1 * sn[i] + x2 * cs[i];
    }
  } else {
    for (std::int32_t i = 0; i < pairs; ++i) {
      const float x1 = x[2 * i], x2 = x[2 * i + 1];
      x[2 * i] = x1 * cs[i] - x2 * sn[i];
      x[2 * i + 1] = x1 * sn[i] + x2 * cs[i];
    }
  }
}

/// cos and sin of pos * inv_freq[i] (times magnitude), evaluated exactly in double.
RELOKV_HOST_DEVICE void exact_angles(const double* inv_freq, std::int32_t pairs, double pos,
                                     double mag, float* cs, float* sn) {
  for (std::int32_t i = 0; i < pairs; ++i) {
    const double a = pos * inv_freq[i];
    cs[i] = static_cast<float>(mag * ::cos(a));
    sn[i] = static_cast<float>(mag * ::sin(a));
  }
}

/// Non-owning view of a cos/sin table, on the host (rope_table::view) or the device
/// (cuda::device_rope_table::view): [max_position][pairs] rows, with the magnitude (YaRN)
/// included, unit-magnitude rows for composing relative rotations (null where the magnitude is
/// 1, or where a copy leaves them out), and the inverse frequencies for exact evaluation
/// beyond the table. Host and device kernels look angles up through it by the same rule.
struct rope_table_view {
  const float* cos = nullptr;
  const float* sin = nullptr;
  const float* unit_cos = nullptr;
  const float* unit_sin = nullptr;
  const double* inv_freq = nullptr;
  std::int32_t pairs = 0;
  std::int32_t rotary_dim = 0;
  std::int32_t max_position = 0;
  rope_layout layout = rope_layout::kNeoX;
  double magnitude = 1.0;
};

/// The table rows holding position pos (unit: without the magnitude), or false when the table
/// does not hold them (pos outside [0, max_position), or unit rows absent): then the angles
/// are evaluated exactly (exact_angles, rope_angle).
RELOKV_HOST_DEVICE bool table_rows(const rope_table_view& r, long long pos, bool unit,
                                   const float*& cs, const float*& sn) {
  if (pos < 0 || pos >= r.max_position) return false;
  const bool u = unit && r.magnitude != 1.0;
  if (u && r.unit_cos == nullptr) return false;
  const long long off = pos * r.pairs;
  cs = (u ? r.unit_cos : r.cos) + off;
  sn = (u ? r.unit_sin : r.sin) + off;
  return true;
}

/// cos and sin of pair i at position pos: from the table when it holds the position, else in
/// double, as exact_angles does. The lookup of the device kernels (one pair per lane).
RELOKV_HOST_DEVICE void rope_angle(const rope_table_view& r, long long pos, std::int32_t i,
                                   bool unit, float& c, float& s) {
  const float* cs = nullptr;
  const float* sn = nullptr;
  if (table_rows(r, pos, unit, cs, sn)) {
    c = cs[i];
    s = sn[i];
    return;
  }
  const double a = static_cast<double>(pos) * r.inv_freq[i];
  const double mag = unit ? 1.0 : r.magnitude;
  c = static_cast<float>(mag * ::cos(a));
  s = static_cast<float>(mag * ::sin(a));
}

/// Host cos/sin table for positions [0, max_position), with exact evaluation beyond it and for
/// negative positions. Immutable after construction; share it between threads.
static_assert(std::is_trivially_copyable_v<rope_table_view>);

class rope_table {
 public:
  explicit rope_table(const rope_config& cfg, std::int32_t max_position = 8192)
      : cfg_(cfg), max_position_(max_position < 1 ? 1 : max_position) {
    cfg_.validate();
    const std::int32_t p = cfg_.pairs();
    freq_.resize(static_cast<std::size_t>(p));
    for (std::int32_t i = 0; i < p; ++i) freq_[static_cast<std::size_t>(i)] = inv_freq(cfg_, i);
    mag_ = magnitude(cfg_);
    const auto n = static_cast<std::size_t>(max_position_) * static_cast<std::size_t>(p);
    cos_.resize(n);
    sin_.resize(n);
    for (std::int32_t pos = 0; pos < max_position_; ++pos)
      exact_angles(freq_.data(), p, pos, mag_, cos_.data() + static_cast<std::size_t>(pos) * p,
                   sin_.data() + static_cast<std::size_t>(pos) * p);
    // Unit-magnitude rotations, for composing (magnitude applies once per vector).
    if (mag_ != 1.0) {
      ucos_.resize(n);
      usin_.resize(n);
      for (std::int32_t pos = 0; pos < max_position_; ++pos)
        exact_angles(freq_.data(), p, pos, 1.0, ucos_.data() + static_cast<std::size_t>(pos) * p,
                     usin_.data() + static_cast<std::size_t>(pos) * p);
    }
  }

  [[nodiscard]] const rope_config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::int32_t pairs() const noexcept { return cfg_.pairs(); }
  [[nodiscard]] std::int32_t max_position() const noexcept { return max_position_; }
  [[nodiscard]] const double* inv_freqs() const noexcept { return freq_.data(); }
  [[nodiscard]] double magnitude_factor() const noexcept { return mag_; }

  /// cos/sin of the rotation to apply at position pos (any integer, negative included).
  /// `unit` drops YaRN's magnitude (used for relative rotations between stored vectors).
  void angles(std::int64_t pos, float* cs, float* sn, bool unit = false) const {
    const std::int32_t p = pairs();
    const float* c = nullptr;
    const float* s = nullptr;
    if (table_rows(view(), pos, unit, c, s)) {
      for (std::int32_t i = 0; i < p; ++i) {
        cs[i] = c[i];
        sn[i] = s[i];
      }
      return;
    }
    exact_angles(freq_.data(), p, static_cast<double>(pos), unit ? 1.0 : mag_, cs, sn);
  }

  /// The table as host and device kernels read it (valid while this table lives).
  [[nodiscard]] rope_table_view view() const noexcept {
    return {cos_.data(),
            sin_.data(),
            mag_ != 1.0 ? ucos_.data() : nullptr,
            mag_ != 1.0 ? usin_.data() : nullptr,
            freq_.data(),
            cfg_.pairs(),
            cfg_.rotary_dim,
            max_position_,
            cfg_.layout,
            mag_};
  }

  /// Hints that angles(pos) is needed soon (a table row is 2 * pairs floats, usually a miss).
  void prefetch(std::int64_t pos) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    if (pos < 0 || pos >= max_position_) return;
    const auto off = static_cast<std::size_t>(pos) * static_cast<std::size_t>(pairs());
    for (std::size_t i = 0; i < static_cast<std::size_t>(pairs()); i += 16) {
      __builtin_prefetch(cos_.data() + off + i);
      __builtin_prefetch(sin_.data() + off + i);
    }
#else
    (void)pos;
#endif
  }

  /// Rotates a head vector (head_dim floats) to position pos.
  void rotate(float* x, std::int64_t pos, bool unit = false) const {
    float cs[512], sn[512];
    angles(pos, cs, sn, unit);
    rotate_inplace(x, cfg_.layout, pairs(), cs, sn);
  }

 private:
  rope_config cfg_;
  std::int32_t max_position_;
  double mag_ = 1.0;
  std::vector<double> freq_;
  // [position][pair]; long tables are streamed a row per block by block_relative decode
  std::vector<float, detail::huge_page_allocator<float>> cos_, sin_, ucos_, usin_;
};

RELOKV_NAMESPACE_END
