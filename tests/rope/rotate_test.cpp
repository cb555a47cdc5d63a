#include <relokv/rope/rotate.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "support/catch.hpp"

namespace {
std::vector<float> randn(int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}
double norm(const std::vector<float>& v, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i)
    s += double(v[static_cast<std::size_t>(i)]) * v[static_cast<std::size_t>(i)];
  return std::sqrt(s);
}
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return m / scale;
}
std::vector<relokv::rope_config> variants() {
  std::vector<relokv::rope_config> out;
  for (auto layout : {relokv::rope_layout::kNeoX, relokv::rope_layout::kGPTJ}) {
    relokv::rope_config c;
    c.head_dim = 64;
    c.rotary_dim = 64;
    c.layout = layout;
    out.push_back(c);
    c.rotary_dim = 32;  // partial rotary
    out.push_back(c);
    c.rotary_dim = 64;
    c.scaling = relokv::rope_scaling::kLinear;
    c.factor = 4;
    out.push_back(c);
    c.scaling = relokv::rope_scaling::kLlama3;
    c.factor = 8;
    c.theta = 500000;
    out.push_back(c);
    c.scaling = relokv::rope_scaling::kYaRN;
    c.factor = 4;
    c.theta = 10000;
    c.original_max_position = 4096;
    c.yarn_attn_factor = 1.0;  // unit magnitude here; tested separately
    out.push_back(c);
  }
  return out;
}
}  // namespace

TEST_CASE("rope: position 0 is the identity", "[rope]") {
  for (const auto& c : variants()) {
    relokv::rope_table t(c, 256);
    auto x = randn(c.head_dim, 1);
    const auto y = x;
    t.rotate(x.data(), 0);
    CHECK(x == y);
  }
}

TEST_CASE("rope: R(a) R(b) = R(a + b), norms are preserved", "[rope]") {
  for (const auto& c : variants()) {
    relokv::rope_table t(c, 4096);
    for (auto [a, b] : {std::pair{3, 5}, {1000, 2500}, {-7, 20}, {4000, 3000}}) {
      auto x = randn(c.head_dim, 2);
      auto y = x;
      const double n0 = norm(x, c.head_dim);
      t.rotate(x.data(), a);
      t.rotate(x.data(), b);
      t.rotate(y.data(), a + b);
      CHECK(max_rel_diff(x, y) < 2e-6);
      CHECK(std::fabs(norm(x, c.head_dim) - n0) < 1e-5 * n0);
    }
  }
}

TEST_CASE("rope: table and exact evaluation agree; beyond the table is exact", "[rope]") {
  relokv::rope_config c;
  c.head_dim = 128;
  c.rotary_dim = 128;
  relokv::rope_table t(c, 1024);
  std::vector<float> cs(64), sn(64);
  for (long pos : {0L, 1L, 1023L, 1024L, 40000L, -5L}) {
    t.angles(pos, cs.data(), sn.data());
    for (int i = 0; i < 64; ++i) {
      const double a = double(pos) * relokv::inv_freq(c, i);
      CHECK(std::fabs(cs[static_cast<std::size_t>(i)] - std::cos(a)) < 1e-7);
      CHECK(std::fabs(sn[static_cast<std::size_t>(i)] - std::sin(a)) < 1e-7);
    }
  }
}

TEST_CASE("rope: partial rotary leaves the tail untouched", "[rope]") {
  for (auto layout : {relokv::rope_layout::kNeoX, relokv::rope_layout::kGPTJ}) {
    relokv::rope_config c;
    c.head_dim = 64;
    c.rotary_dim = 16;
    c.layout = layout;
    relokv::rope_table t(c, 128);
    auto x = randn(64, 3);
    const auto y = x;
    t.rotate(x.data(), 77);
    for (int d = 16; d < 64; ++d)
      CHECK(x[static_cast<std::size_t>(d)] == y[static_cast<std::size_t>(d)]);
    bool moved = false;
    for (int d = 0; d < 16; ++d)
      moved |= x[static_cast<std::size_t>(d)] != y[static_cast<std::size_t>(d)];
    CHECK(moved);
  }
}

TEST_CASE("rope: NeoX and GPT-J are the same rotation on permuted dimensions", "[rope]") {
  relokv::rope_config neox;
  neox.head_dim = neox.rotary_dim = 32;
  auto gptj = neox;
  gptj.layout = relokv::rope_layout::kGPTJ;
  relokv::rope_table tn(neox, 64), tg(gptj, 64);
  const auto x = randn(32, 4);
  std::vector<float> a = x, b(32);
  for (int i = 0; i < 16; ++i) {  // NeoX pair (i, i+16) -> GPT-J pair (2i, 2i+1)
    b[static_cast<std::size_t>(2 * i)] = x[static_cast<std::size_t>(i)];
    b[static_cast<std::size_t>(2 * i + 1)] = x[static_cast<std::size_t>(i + 16)];
  }
  tn.rotate(a.data(), 37);
  tg.rotate(b.data(), 37);
  for (int i = 0; i < 16; ++i) {
    CHECK(a[static_cast<std::size_t>(i)] == b[static_cast<std::size_t>(2 * i)]);
    CHECK(a[static_cast<std::size_t>(i + 16)] == b[static_cast<std::size_t>(2 * i + 1)]);
  }
}

TEST_CASE("rope: Llama-3.1 frequencies at and between the band edges", "[rope]") {
  relokv::rope_config c;
  c.head_dim = c.rotary_dim = 128;
  c.theta = 500000;
  c.scaling = relokv::rope_scaling::kLlama3;
  c.factor = 8;
  c.low_freq_factor = 1;
  c.high_freq_factor = 4;
  c.original_max_position = 8192;
  const double two_pi = 2 * std::acos(-1.0);
  const double high_wavelen = 8192.0 / 4, low_wavelen = 8192.0 / 1;
  int kept = 0, scaled = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 128);
    const double wl = two_pi / base;
    const double f = relokv::inv_freq(c, i);
    if (wl < high_wavelen) {
      CHECK(f == base);
      ++kept;
    } else if (wl > low_wavelen) {
      CHECK(f == Approx(base / 8).epsilon(1e-12));
      ++scaled;
    } else {
      const double smooth = (8192.0 / wl - 1) / (4 - 1);
      CHECK(f == Approx((1 - smooth) * base / 8 + smooth * base).epsilon(1e-12));
      CHECK(f < base);
      CHECK(f > base / 8);
      ++blended;
    }
  }
  CHECK(kept > 0);
  CHECK(scaled > 0);
  CHECK(blended > 0);
  // Exactly on a band edge (theta chosen so that pair 1 of 2 has that wavelength) the
  // library's blend meets the plain rule on the other side: scaling is continuous.
  for (double edge_wavelen : {high_wavelen, low_wavelen}) {
    auto e = c;
    e.head_dim = e.rotary_dim = 4;
    e.theta = (edge_wavelen / two_pi) * (edge_wavelen / two_pi);  // base_1 = theta^-1/2
    const double base = std::pow(e.theta, -0.5);
    const double want = edge_wavelen == high_wavelen ? base : base / 8;
    CHECK(relokv::inv_freq(e, 1) == Approx(want).epsilon(1e-9));
  }
}

TEST_CASE("rope: linear scaling divides positions, YaRN keeps high frequencies", "[rope]") {
  relokv::rope_config c;
  c.head_dim = c.rotary_dim = 64;
  auto lin = c;
  lin.scaling = relokv::rope_scaling::kLinear;
  lin.factor = 4;
  for (int i = 0; i < 32; ++i)
    CHECK(relokv::inv_freq(lin, i) == Approx(relokv::inv_freq(c, i) / 4));
  auto y = c;
  y.scaling = relokv::rope_scaling::kYaRN;
  y.factor = 4;
  y.original_max_position = 4096;
  CHECK(relokv::inv_freq(y, 0) == relokv::inv_freq(c, 0));                // extrapolated
  CHECK(relokv::inv_freq(y, 31) == Approx(relokv::inv_freq(c, 31) / 4));  // interpolated
  CHECK(relokv::magnitude(y) == Approx(0.1 * std::log(4.0) + 1));
  CHECK(relokv::magnitude(c) == 1.0);
}

TEST_CASE("rope: bad configurations are rejected with the field named", "[rope]") {
  relokv::rope_config c;
  c.rotary_dim = 129;
  CHECK_THROWS_AS(relokv::rope_table(c), relokv::error);
  c.rotary_dim = 256;
  CHECK_THROWS_AS(relokv::rope_table(c), relokv::error);
  c = relokv::rope_config{};
  c.scaling = relokv::rope_scaling::kLlama3;
  c.high_freq_factor = 0.5;
  CHECK_THROWS_AS(relokv::rope_table(c), relokv::error);
}
