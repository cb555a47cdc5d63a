#pragma once
/// @file
/// The online-softmax state of attention rows (softmax_rows), and how two states merge: the
/// arithmetic every host path, merge_attention_states and the CUDA kernels share. A row's state is
/// its running maximum score `mx` (-inf before any score) and its denominator `sum` (of exp(score -
/// mx)); its accumulator is scaled with it. The exponential is a parameter: the host passes its
/// polynomial (or std::exp), the device __expf.
#include <cmath>
#include <cstddef>

#include "relokv/config.hpp"

RELOKV_NAMESPACE_BEGIN

/// The factor that carries a state kept at maximum m_old over to maximum m_new >= m_old: 0
/// when the state holds no score yet (m_old is -inf), so that nothing of it survives.
RELOKV_EXEC_CHECK_DISABLE
template <class Exp>
RELOKV_HOST_DEVICE float softmax_rescale(float m_old, float m_new, Exp exp) {
  return m_old == -INFINITY ? 0.0f : exp(m_old - m_new);
}

/// Moves a row's state to cover scores whose maximum is `block_max` (one score, or a block of
/// them): mx becomes the larger of the two, sum is rescaled to it. The caller scales its
/// accumulator by the returned factor, then adds exp(score - mx) of the new scores to sum and
/// their weighted values to the accumulator.
RELOKV_EXEC_CHECK_DISABLE
template <class Exp>
RELOKV_HOST_DEVICE float online_softmax_step(float& mx, float& sum, float block_max, Exp exp) {
  const float m_new = mx < block_max ? block_max : mx;
  const float corr = softmax_rescale(mx, m_new, exp);
  sum *= corr;
  mx = m_new;
  return corr;
}

/// The natural log of a row's softmax denominator: mx + log(sum), -inf when no key was visible.
RELOKV_EXEC_CHECK_DISABLE
template <class Log>
RELOKV_HOST_DEVICE float softmax_lse(float mx, float sum, Log log) {
  return sum > 0.0f ? mx + log(sum) : -INFINITY;
}

/// Merging two normalized parts of a row, given by their log-sum-exps la and lb (both finite):
/// the weights fa and fb of their outputs in the union, and the union's log-sum-exp.
RELOKV_EXEC_CHECK_DISABLE
template <class Exp, class Log>
RELOKV_HOST_DEVICE void softmax_merge(float la, float lb, float& fa, float& fb, float& lse, Exp exp,
                                      Log log) {
  const float mx = la < lb ? lb : la;
  const float wa = softmax_rescale(la, mx, exp), wb = softmax_rescale(lb, mx, exp);
  const float total = wa + wb;
  fa = wa / total;
  fb = wb / total;
  lse = mx + log(total);
}

/// The online-softmax state of attention rows, what every host path (portable, AVX2, AVX-512,
/// AMX) keeps and the finishing step reads: per row its running maximum `mx` (-inf before any
/// score) and its denominator `sum`, as two arrays, so that a SIMD path loads sixteen rows'
/// maxima in one vector. A view: the caller owns the floats (a scratch of the kernel's).
struct softmax_rows {
  float* mx = nullptr;   ///< [rows]
  float* sum = nullptr;  ///< [rows]

  /// The rows from `r` on.
  [[nodiscard]] RELOKV_HOST_DEVICE softmax_rows from(std::size_t r) const {
    return {mx + r, sum + r};
  }
  /// Rows [0, n) before any score.
  RELOKV_HOST_DEVICE void reset(std::size_t n) const {
    for (std::size_t r = 0; r < n; ++r) {
      mx[r] = -INFINITY;
      sum[r] = 0.0f;
    }
  }
  /// Row r moves to cover scores whose maximum is `block_max` (online_softmax_step): returns
  /// the factor its accumulator is scaled by; add() then takes the new weights' sum.
  RELOKV_EXEC_CHECK_DISABLE
  template <class Exp>
  RELOKV_HOST_DEVICE float rescale(std::size_t r, float block_max, Exp exp) const {
    return online_softmax_step(mx[r], sum[r], block_max, exp);
  }
  /// Row r adds the weights exp(score - mx) of its new scores, after rescale().
  RELOKV_HOST_DEVICE void add(std::size_t r, float block_sum) const { sum[r] += block_sum; }
  /// Row r's denominator carried by `corr` (a SIMD path's own rescale of mx) and the new
  /// weights added: sum * corr + block_sum.
  RELOKV_HOST_DEVICE void fold(std::size_t r, float corr, float block_sum) const {
    sum[r] = sum[r] * corr + block_sum;
  }
  /// Row r's state set whole (a path that sees all of a row's scores at once: AMX).
  RELOKV_HOST_DEVICE void set(std::size_t r, float max, float denominator) const {
    mx[r] = max;
    sum[r] = denominator;
  }
  /// What row r's accumulator is multiplied by at the end: 1 / sum, 0 for a row that saw no
  /// key (its output stays zeros).
  [[nodiscard]] RELOKV_HOST_DEVICE float inverse(std::size_t r) const {
    return sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
  }
  /// Row r's log-sum-exp (softmax_lse): -inf for a row that saw no key.
  RELOKV_EXEC_CHECK_DISABLE
  template <class Log>
  [[nodiscard]] RELOKV_HOST_DEVICE float lse(std::size_t r, Log log) const {
    return softmax_lse(mx[r], sum[r], log);
  }
};

RELOKV_NAMESPACE_END
