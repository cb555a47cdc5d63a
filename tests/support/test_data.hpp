#pragma once
// Small data generators shared by the tests.
#include <relokv/types.hpp>

#include <random>
#include <vector>

namespace relokv_test {

/// n consecutive token ids starting at first.
inline std::vector<relokv::token_t> iota_tokens(relokv::token_t first, int n) {
  std::vector<relokv::token_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = first + i;
  return t;
}

/// n standard-normal floats.
inline std::vector<float> randn(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace relokv_test
