#include <relokv/attention/attention_mass.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "support/attention_oracle.hpp"
#include "support/catch.hpp"
#include "support/test_data.hpp"

using relokv::block_entry;

namespace {

/// The mass in double: every key rotated afresh at its logical position, every query at its
/// own, softmax over the visible keys of each (row, query head), summed per key position.
std::vector<double> reference_mass(const relokv::rope_config& c,
                                   const std::vector<oracle::key_token>& keys,
                                   const std::vector<float>& q, const std::vector<int>& q_pos,
                                   int num_q_heads, int num_kv_heads, double scale, int positions,
                                   int window = 0) {
  const int D = c.head_dim, G = num_q_heads / num_kv_heads;
  std::vector<double> mass(static_cast<std::size_t>(positions), 0.0);
  for (std::size_t i = 0; i < q_pos.size(); ++i)
    for (int qh = 0; qh < num_q_heads; ++qh) {
      const int h = qh / G;
      const auto q0 = q.begin() + static_cast<std::ptrdiff_t>((i * num_q_heads + qh) * D);
      std::vector<double> qr(q0, q0 + D);
      oracle::rotate_exact(c, qr, q_pos[i]);
      std::vector<double> s;
      std::vector<int> at;
      for (const auto& kt : keys) {
        if (kt.pos > q_pos[i] || (window > 0 && kt.pos <= q_pos[i] - window)) continue;
        std::vector<double> kr(kt.k.begin() + h * D, kt.k.begin() + (h + 1) * D);
        oracle::rotate_exact(c, kr, kt.pos);
        double d = 0;
        for (int j = 0; j < D; ++j)
          d += qr[static_cast<std::size_t>(j)] * kr[static_cast<std::size_t>(j)];
        s.push_back(d * scale);
        at.push_back(kt.pos);
      }
      if (s.empty()) continue;
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (std::size_t j = 0; j < s.size(); ++j)
        mass[static_cast<std::size_t>(at[j])] += s[j] / sum;
    }
  return mass;
}

struct mass_case {
  relokv::rope_config cfg;
  std::vector<oracle::key_token> keys;
  std::vector<block_entry> table;
  std::vector<float> q;
  std::vector<int> q_pos;
  int positions = 0;
};

/// Three blocks (lens 16, 16, 7) read at positions 5.. (a gap before them), keys computed
/// elsewhere: at 900.. for the placements that store them independently of position, at their
/// reading positions for pre_rotated (relocation is the cache's copy, tested elsewhere). Four
/// query rows, the last two beyond the keys, the first inside them (causality).
template <class P, class T>
mass_case make_case(relokv::host_kv_storage<T>& st, const relokv::rope_table& rope,
                    const relokv::rope_config& cfg, int num_q_heads, std::mt19937& rng) {
  const auto& s = st.shape();
  mass_case m;
  m.cfg = cfg;
  int pos = 5;
  const int lens[3] = {16, 16, 7};
  for (int b = 0; b < 3; ++b) {
    for (int j = 0; j < lens[b]; ++j) {
      oracle::key_token t;
      t.pos = pos + j;
      t.k = relokv_test::randn(static_cast<std::size_t>(s.num_kv_heads * s.head_dim), rng);
      t.v = relokv_test::randn(static_cast<std::size_t>(s.num_kv_heads * s.head_dim), rng);
      const int written = P::relocation_rotates_keys ? pos + j : 900 + 16 * b + j;
      relokv::append_kv<P>(rope, st.layer(0), b, j, written, t.k.data(), t.v.data());
      // What the storage holds, as the reference reads it: each element rounded to T.
      for (float& x : t.k) x = relokv::to_f32(relokv::from_f32<T>(x));
      m.keys.push_back(std::move(t));
    }
    m.table.push_back({b, pos, lens[b]});
    pos += lens[b];
  }
  m.q_pos = {20, pos, pos + 3, pos + 4};
  m.q = relokv_test::randn(m.q_pos.size() * num_q_heads * s.head_dim, rng);
  m.positions = pos + 8;
  return m;
}

template <class P, class T>
void check_against_reference(relokv::rope_config cfg, int num_q_heads, int num_kv_heads) {
  std::mt19937 rng(11);
  cfg.head_dim = cfg.rotary_dim = 32;
  const relokv::rope_table rope(cfg, 2048);
  relokv::host_kv_storage<T> st(relokv::kv_shape{1, 4, num_kv_heads, 16, 32});
  const auto m = make_case<P>(st, rope, cfg, num_q_heads, rng);
  const float scale = 1.0f / std::sqrt(32.0f);
  std::vector<float> mass(static_cast<std::size_t>(m.positions), 0.0f);
  relokv::attention_mass_params<T> p;
  p.rope = &rope;
  p.kv = relokv::paged_kv_view<const T>(st.layer(0));
  p.blocks = m.table;
  p.q = m.q.data();
  p.q_pos = m.q_pos.data();
  p.num_tokens = static_cast<std::int32_t>(m.q_pos.size());
  p.num_q_heads = num_q_heads;
  p.scale = scale;
  p.mass = mass;
  relokv::attention_mass<P>(p);
  const auto want =
      reference_mass(m.cfg, m.keys, m.q, m.q_pos, num_q_heads, num_kv_heads, scale, m.positions);
  // Every row and head adds 1; positions without keys (the gap, past the keys) get nothing.
  const double total = std::accumulate(mass.begin(), mass.end(), 0.0);
  CHECK(total == Approx(double(m.q_pos.size()) * num_q_heads).epsilon(1e-5));
  double err = 0;
  for (std::size_t t = 0; t < mass.size(); ++t) err = std::max(err, std::fabs(mass[t] - want[t]));
  INFO("max |mass - fp64 reference| = " << err);
  // fp32 rotation tables and sums: 1e-5 per key and head. bf16 keys are rounded in the
  // reference too, as at_attention stores them (unrotated); the other placements round the
  // rotated key (2^-9 relative on a key moves a score by ~2^-9 |s|, a probability by as much).
  const bool same_rounding =
      std::is_same_v<T, float> || P::kind == relokv::placement_kind::kAtAttention;
  CHECK(err < (same_rounding ? 2e-5 : 5e-3) * num_q_heads);
  for (int t = 0; t < 5; ++t) CHECK(mass[static_cast<std::size_t>(t)] == 0.0f);
  // Causal: the first row alone (at 20) gives all its mass to keys 5..20.
  std::vector<float> first(mass.size(), 0.0f);
  p.num_tokens = 1;
  p.mass = first;
  relokv::attention_mass<P>(p);
  double seen = 0;
  for (std::size_t t = 0; t < first.size(); ++t) {
    if (t > 20) CHECK(first[t] == 0.0f);
    seen += first[t];
  }
  CHECK(seen == Approx(num_q_heads).epsilon(1e-5));
}

}  // namespace

TEMPLATE_TEST_CASE("attention_mass: equals the fp64 softmax mass per key, every placement",
                   "[attention][mass]", relokv::pre_rotated, relokv::at_attention,
                   relokv::block_relative) {
  using P = TestType;
  relokv::rope_config neox, gptj, yarn;
  gptj.layout = relokv::rope_layout::kGPTJ;
  yarn.scaling = relokv::rope_scaling::kYaRN;
  yarn.factor = 4.0;
  yarn.original_max_position = 512;
  SECTION("fp32, NeoX, GQA 4:2") { check_against_reference<P, float>(neox, 4, 2); }
  SECTION("fp32, GPT-J, MHA") { check_against_reference<P, float>(gptj, 2, 2); }
  SECTION("fp32, YaRN (magnitude on both sides)") { check_against_reference<P, float>(yarn, 6, 3); }
  SECTION("bf16, NeoX, GQA 6:3") { check_against_reference<P, relokv::bf16>(neox, 6, 3); }
}

TEST_CASE("attention_mass: head ranges add up to the whole; bad calls add nothing",
          "[attention][mass]") {
  using P = relokv::block_relative;
  std::mt19937 rng(3);
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = 32;
  const relokv::rope_table rope(cfg, 2048);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 4, 3, 16, 32});
  const auto m = make_case<P>(st, rope, cfg, 6, rng);
  relokv::attention_mass_params<float> p;
  p.rope = &rope;
  p.kv = relokv::paged_kv_view<const float>(st.layer(0));
  p.blocks = m.table;
  p.q = m.q.data();
  p.q_pos = m.q_pos.data();
  p.num_tokens = static_cast<std::int32_t>(m.q_pos.size());
  p.num_q_heads = 6;
  p.scale = 0.2f;
  std::vector<float> whole(static_cast<std::size_t>(m.positions), 0.0f), parts = whole;
  p.mass = whole;
  relokv::attention_mass<P>(p);
  p.mass = parts;
  p.heads = {0, 1};
  relokv::attention_mass<P>(p);
  p.heads = {1, 3};
  relokv::attention_mass<P>(p);
  for (std::size_t t = 0; t < whole.size(); ++t) CHECK(parts[t] == Approx(whole[t]).margin(1e-6));

  std::vector<float> untouched(static_cast<std::size_t>(m.positions), 0.0f);
  p.heads = {};
  p.mass = untouched;
  auto bad = m.table;
  bad[1].block = 4;  // outside the 4 blocks of the view
  p.blocks = bad;
  CHECK_THROWS_WITH(relokv::attention_mass<P>(p), Catch::Contains("block entry 1"));
  bad = m.table;
  bad[2].len = 17;
  p.blocks = bad;
  CHECK_THROWS_WITH(relokv::attention_mass<P>(p), Catch::Contains("len 17"));
  p.blocks = m.table;
  p.mass = std::span<float>(untouched).first(20);  // keys at 5..43 do not fit
  CHECK_THROWS_WITH(relokv::attention_mass<P>(p), Catch::Contains("outside the 20 of mass"));
  p.mass = untouched;
  p.num_q_heads = 4;  // not a multiple of 3 KV heads
  CHECK_THROWS_WITH(relokv::attention_mass<P>(p), Catch::Contains("multiple"));
  p.num_q_heads = 6;
  p.q = nullptr;
  CHECK_THROWS_WITH(relokv::attention_mass<P>(p), Catch::Contains("null q"));
  for (float x : untouched) CHECK(x == 0.0f);
}

TEMPLATE_TEST_CASE("attention_mass: a windowed layer's rows give mass inside their window only",
                   "[attention][mass][window]", relokv::pre_rotated, relokv::at_attention,
                   relokv::block_relative) {
  // question_topk ranks by the question's attention; in a sliding-window layer (Gemma 3) that
  // attention reaches only the last `window` positions, and the probe must see what attention
  // sees. Windows of 1 (each row's own key, where there is one), 9 (cuts a block) and 20.
  using P = TestType;
  std::mt19937 rng(17);
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = 32;
  const relokv::rope_table rope(cfg, 2048);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 4, 2, 16, 32});
  const auto m = make_case<P>(st, rope, cfg, 4, rng);
  const float scale = 1.0f / std::sqrt(32.0f);
  for (const int window : {1, 9, 20}) {
    std::vector<float> mass(static_cast<std::size_t>(m.positions), 0.0f);
    relokv::attention_mass_params<float> p;
    p.rope = &rope;
    p.kv = relokv::paged_kv_view<const float>(st.layer(0));
    p.blocks = m.table;
    p.q = m.q.data();
    p.q_pos = m.q_pos.data();
    p.num_tokens = static_cast<std::int32_t>(m.q_pos.size());
    p.num_q_heads = 4;
    p.scale = scale;
    p.mass = mass;
    p.window = window;
    relokv::attention_mass<P>(p);
    const auto want = reference_mass(m.cfg, m.keys, m.q, m.q_pos, 4, 2, scale, m.positions, window);
    double err = 0;
    for (std::size_t t = 0; t < mass.size(); ++t) err = std::max(err, std::fabs(mass[t] - want[t]));
    INFO("window " << window << ": max |mass - fp64 reference| = " << err);
    CHECK(err < 2e-5 * 4);
    // Nothing before the earliest window: the first row is at 20, the others past the keys.
    for (int t = 0; t < 20 - window + 1 && t < m.positions; ++t)
      CHECK(mass[static_cast<std::size_t>(t)] == 0.0f);
  }
  relokv::attention_mass_params<float> bad;
  bad.rope = &rope;
  bad.kv = relokv::paged_kv_view<const float>(st.layer(0));
  bad.num_q_heads = 4;
  bad.window = -1;
  CHECK_THROWS_WITH(relokv::attention_mass<P>(bad), Catch::Contains("negative window"));
}
