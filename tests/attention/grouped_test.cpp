#include <relokv/attention/grouped.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "support/attention_oracle.hpp"
#include "support/catch.hpp"
#include "support/test_data.hpp"

namespace {

/// APE's grouped attention in double: each group's softmax over its visible keys at scores
/// divided by T, merged with log-weights T * LSE(s / T) + log S.
std::vector<double> reference(const relokv::rope_config& c,
                              const std::vector<std::vector<oracle::key_token>>& groups,
                              const std::vector<std::pair<double, double>>& ts,
                              const std::vector<float>& q, int m, int Hq, int Hk, double scale) {
  const int D = c.head_dim, G = Hq / Hk;
  std::vector<double> out(static_cast<std::size_t>(Hq * D), 0.0);
  for (int qh = 0; qh < Hq; ++qh) {
    std::vector<double> qr(q.begin() + qh * D, q.begin() + (qh + 1) * D);
    oracle::rotate_exact(c, qr, m);
    std::vector<double> logw, o;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const double T = ts[g].first, S = ts[g].second;
      std::vector<double> s;
      std::vector<const oracle::key_token*> vis;
      for (const auto& kt : groups[g]) {
        if (kt.pos > m) continue;
        std::vector<double> kr(kt.k.begin() + (qh / G) * D, kt.k.begin() + (qh / G + 1) * D);
        oracle::rotate_exact(c, kr, kt.pos);
        double d = 0;
        for (int i = 0; i < D; ++i)
          d += qr[static_cast<std::size_t>(i)] * kr[static_cast<std::size_t>(i)];
        s.push_back(d * scale / T);
        vis.push_back(&kt);
      }
      if (s.empty()) continue;
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      std::vector<double> og(static_cast<std::size_t>(D), 0.0);
      for (std::size_t j = 0; j < s.size(); ++j)
        for (int i = 0; i < D; ++i)
          og[static_cast<std::size_t>(i)] +=
              s[j] / sum * vis[j]->v[static_cast<std::size_t>((qh / G) * D + i)];
      logw.push_back(T * (mx + std::log(sum)) + std::log(S));
      o.insert(o.end(), og.begin(), og.end());
    }
    const double mx = *std::max_element(logw.begin(), logw.end());
    double z = 0;
    for (double l : logw) z += std::exp(l - mx);
    for (std::size_t g = 0; g < logw.size(); ++g)
      for (int i = 0; i < D; ++i)
        out[static_cast<std::size_t>(qh * D + i)] +=
            std::exp(logw[g] - mx) / z *
            o[g * static_cast<std::size_t>(D) + static_cast<std::size_t>(i)];
  }
  return out;
}

template <class P>
void check_groups(int Hq, int Hk, bool decode) {
  std::mt19937 rng(5);
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = 32;
  const relokv::rope_table rope(cfg, 2048);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 8, Hk, 16, 32});
  // Blocks: prefix 0 (10 tokens), spans 1-3 (16, 16, 9), own 4 (7): group by group.
  const int lens[5] = {10, 16, 16, 9, 7};
  std::vector<relokv::block_entry> table;
  std::vector<std::vector<oracle::key_token>> by_group(3);
  int pos = 0;
  for (int b = 0; b < 5; ++b) {
    const int g = b == 0 ? 0 : (b < 4 ? 1 : 2);
    for (int j = 0; j < lens[b]; ++j) {
      oracle::key_token t;
      t.pos = pos + j;
      t.k = relokv_test::randn(static_cast<std::size_t>(Hk * 32), rng);
      t.v = relokv_test::randn(static_cast<std::size_t>(Hk * 32), rng);
      relokv::append_kv<P>(rope, st.layer(0), b, j, pos + j, t.k.data(), t.v.data());
      by_group[static_cast<std::size_t>(g)].push_back(std::move(t));
    }
    table.push_back({b, pos, lens[b]});
    pos += lens[b];
  }
  const std::vector<relokv::attention_group> groups = {
      {0, 1, 1.0f, 1.0f}, {1, 3, 0.7f, 1.3f}, {4, 1, 1.0f, 1.0f}};
  const std::vector<std::pair<double, double>> ts = {{1, 1}, {0.7, 1.3}, {1, 1}};
  const std::vector<int> qpos = decode ? std::vector<int>{pos - 1} : std::vector<int>{51, 53, 57};
  const auto n = static_cast<int>(qpos.size());
  const auto q = relokv_test::randn(static_cast<std::size_t>(n * Hq * 32), rng);
  std::vector<float> out(q.size(), 0.0f), lse(static_cast<std::size_t>(n * Hq), 0.0f);
  const std::int32_t ind[2] = {0, static_cast<std::int32_t>(table.size())};
  const std::int32_t qind[2] = {0, n};
  relokv::attention_params<float> p;
  p.rope = &rope;
  p.kv = relokv::paged_kv_view<const float>(st.layer(0));
  p.table = {table.data(), ind, 1};
  p.q = q.data();
  p.q_pos = qpos.data();
  p.q_indptr = decode ? nullptr : qind;
  p.num_tokens = n;
  p.num_q_heads = Hq;
  p.scale = 1.0f / std::sqrt(32.0f);
  p.out = out.data();
  p.lse = lse.data();
  relokv::grouped_attention<P>(p, groups);
  double err = 0, mag = 0;
  for (int i = 0; i < n; ++i) {
    const std::vector<float> qi(q.begin() + i * Hq * 32, q.begin() + (i + 1) * Hq * 32);
    const auto want = reference(cfg, by_group, ts, qi, qpos[static_cast<std::size_t>(i)], Hq, Hk,
                                1.0 / std::sqrt(32.0));
    for (std::size_t d = 0; d < want.size(); ++d) {
      err = std::max(err, std::fabs(out[static_cast<std::size_t>(i * Hq * 32) + d] - want[d]));
      mag = std::max(mag, std::fabs(want[d]));
    }
  }
  INFO("max |out - fp64| / max |out| = " << err / mag);
  CHECK(err / mag < 1e-5);
}

}  // namespace

TEMPLATE_TEST_CASE("grouped_attention: APE's groups equal the fp64 reference, every placement",
                   "[attention][grouped]", relokv::pre_rotated, relokv::at_attention,
                   relokv::block_relative) {
  SECTION("prefill, GQA 4:2") { check_groups<TestType>(4, 2, false); }
  SECTION("decode, MHA 3:3") { check_groups<TestType>(3, 3, true); }
}

TEST_CASE("grouped_attention: T = S = 1 is plain attention; bad groups write nothing",
          "[attention][grouped]") {
  using P = relokv::block_relative;
  std::mt19937 rng(9);
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = 32;
  const relokv::rope_table rope(cfg, 2048);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 4, 2, 16, 32});
  std::vector<relokv::block_entry> table;
  for (int b = 0; b < 3; ++b) {
    for (int j = 0; j < 16; ++j) {
      const auto k = relokv_test::randn(64, rng), v = relokv_test::randn(64, rng);
      relokv::append_kv<P>(rope, st.layer(0), b, j, 16 * b + j, k.data(), v.data());
    }
    table.push_back({b, 16 * b, 16});
  }
  const std::vector<int> qpos = {40, 47};
  const auto q = relokv_test::randn(2 * 4 * 32, rng);
  std::vector<float> plain(q.size()), grouped(q.size());
  const std::int32_t ind[2] = {0, 3}, qind[2] = {0, 2};
  relokv::attention_params<float> p;
  p.rope = &rope;
  p.kv = relokv::paged_kv_view<const float>(st.layer(0));
  p.table = {table.data(), ind, 1};
  p.q = q.data();
  p.q_pos = qpos.data();
  p.q_indptr = qind;
  p.num_tokens = 2;
  p.num_q_heads = 4;
  p.scale = 0.17f;
  p.out = plain.data();
  relokv::paged_attention<P>(p);
  p.out = grouped.data();
  const std::vector<relokv::attention_group> ones = {{0, 1}, {1, 1}, {2, 1}};
  relokv::grouped_attention<P>(p, ones);
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(grouped[i] == Approx(plain[i]).margin(1e-6));

  std::vector<float> untouched(q.size(), 7.0f);
  p.out = untouched.data();
  using G = std::vector<relokv::attention_group>;
  CHECK_THROWS_WITH(relokv::grouped_attention<P>(p, G{{0, 1}, {2, 1}}),
                    Catch::Contains("must start at 1"));
  CHECK_THROWS_WITH(relokv::grouped_attention<P>(p, G{{0, 1}, {1, 1}}),
                    Catch::Contains("cover 2 of the 3"));
  CHECK_THROWS_WITH(relokv::grouped_attention<P>(p, G{{0, 1}, {1, 2, 0.0f, 1.0f}}),
                    Catch::Contains("temperature and scale"));
  CHECK_THROWS_WITH(relokv::grouped_attention<P>(p, G{{0, 1}, {1, 2, 1.0f, NAN}}),
                    Catch::Contains("temperature and scale"));
  for (float x : untouched) CHECK(x == 7.0f);
}
