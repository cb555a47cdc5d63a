#pragma once
/// @file
/// The online-softmax state of one attention row, and how two states merge: the arithmetic the
/// host portable path, merge_attention_states and the CUDA kernels share. A row's state is its
/// running maximum score `mx` (-inf before any score) and its denominator `sum` (of
/// exp(score - mx)); its accumulator is scaled with it. The exponential is a parameter: the
/// host passes its polynomial (or std::exp), the device __expf.
#include <cmath>

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

RELOKV_NAMESPACE_END
