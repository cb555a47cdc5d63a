#pragma once
// Brute-force attention in double precision: every key rotated afresh at its logical position
// with exact cos/sin, queries at theirs, causal by position. The oracle the kernels must match.
#include <relokv/rope/rope_config.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace oracle {

struct key_token {
  int pos;               // logical position in the reading request
  std::vector<float> k;  // [num_kv_heads][head_dim], unrotated
  std::vector<float> v;  // [num_kv_heads][head_dim]
};

inline void rotate_exact(const relokv::rope_config& c, std::vector<double>& x, double pos) {
  const double mag = relokv::magnitude(c);
  for (int i = 0; i < c.rotary_dim / 2; ++i) {
    const int a = c.layout == relokv::rope_layout::kNeoX ? i : 2 * i;
    const int b = c.layout == relokv::rope_layout::kNeoX ? i + c.rotary_dim / 2 : 2 * i + 1;
    const double ang = pos * relokv::inv_freq(c, i);
    const double x1 = x[static_cast<std::size_t>(a)], x2 = x[static_cast<std::size_t>(b)];
    x[static_cast<std::size_t>(a)] = mag * (x1 * std::cos(ang) - x2 * std::sin(ang));
    x[static_cast<std::size_t>(b)] = mag * (x1 * std::sin(ang) + x2 * std::cos(ang));
  }
}

/// out: [num_q_heads][head_dim] for one query (unrotated q: [num_q_heads][head_dim]) at m.
/// lse (when given): [num_q_heads], log of each head's softmax denominator (-inf: no key).
/// window > 0: only the keys at positions in (m - window, m] (a sliding-window layer).
inline std::vector<double> attend(const relokv::rope_config& c, const std::vector<key_token>& keys,
                                  const std::vector<float>& q, int m, int num_q_heads,
                                  int num_kv_heads, double scale,
                                  std::vector<double>* lse = nullptr, int window = 0) {
  if (lse != nullptr)
    lse->assign(static_cast<std::size_t>(num_q_heads), -std::numeric_limits<double>::infinity());
  const int D = c.head_dim, G = num_q_heads / num_kv_heads;
  std::vector<double> out(static_cast<std::size_t>(num_q_heads * D), 0.0);
  for (int qh = 0; qh < num_q_heads; ++qh) {
    const int h = qh / G;
    std::vector<double> qr(q.begin() + qh * D, q.begin() + (qh + 1) * D);
    rotate_exact(c, qr, m);
    std::vector<double> s;
    std::vector<const key_token*> vis;
    for (const auto& kt : keys) {
      if (kt.pos > m || (window > 0 && kt.pos <= m - window)) continue;
      std::vector<double> kr(kt.k.begin() + h * D, kt.k.begin() + (h + 1) * D);
      rotate_exact(c, kr, kt.pos);
      double d = 0;
      for (int i = 0; i < D; ++i)
        d += qr[static_cast<std::size_t>(i)] * kr[static_cast<std::size_t>(i)];
      s.push_back(d * scale);
      vis.push_back(&kt);
    }
    if (s.empty()) continue;
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (auto& x : s) sum += (x = std::exp(x - mx));
    if (lse != nullptr) (*lse)[static_cast<std::size_t>(qh)] = mx + std::log(sum);
    for (std::size_t j = 0; j < s.size(); ++j)
      for (int i = 0; i < D; ++i)
        out[static_cast<std::size_t>(qh * D + i)] +=
            s[j] / sum * vis[j]->v[static_cast<std::size_t>(h * D + i)];
  }
  return out;
}

}  // namespace oracle
