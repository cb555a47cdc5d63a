// YaRN's truncate and DeepSeek's mscale_all_dim against values computed from Hugging Face's
// formulas, and layer_rope: per-layer tables and windows, shared where configs agree.
#include <relokv/rope/layer_rope.hpp>
#include <relokv/store/block_format.hpp>

#include <cmath>
#include <vector>

#include "support/catch.hpp"

namespace {
relokv::rope_config yarn_config(bool truncate) {
  relokv::rope_config c;
  c.head_dim = c.rotary_dim = 64;
  c.theta = 10000.0;
  c.scaling = relokv::rope_scaling::kYaRN;
  c.factor = 8.0;
  c.original_max_position = 4096;
  c.yarn_truncate = truncate;
  return c;
}
}  // namespace

TEST_CASE("rope: YaRN's truncate rounds the correction range out, or keeps it fractional",
          "[rope]") {
  // Reference: transformers' _compute_yarn_parameters (find_correction_range with truncate
  // true: low 10, high 23; false: 10.472..., 22.513...), evaluated in Python in double.
  const int idx[6] = {0, 9, 10, 14, 20, 31};
  const double truncated[6] = {1,
                               0.074989420933245579,
                               0.056234132519034911,
                               0.012995118765669051,
                               0.0010338215427473547,
                               1.6669017902041549e-05};
  const double fractional[6] = {1,
                                0.074989420933245579,
                                0.056234132519034911,
                                0.013224133901796551,
                                0.0009728577591530728,
                                1.6669017902041549e-05};
  const auto t = yarn_config(true), f = yarn_config(false);
  for (int k = 0; k < 6; ++k) {
    INFO("pair " << idx[k]);
    CHECK(relokv::inv_freq(t, idx[k]) == Approx(truncated[k]).epsilon(1e-13));
    CHECK(relokv::inv_freq(f, idx[k]) == Approx(fractional[k]).epsilon(1e-13));
  }
  CHECK_FALSE(t == f);  // distinct configurations, distinct tables
}

TEST_CASE("rope: DeepSeek's mscale and mscale_all_dim set the magnitude and softmax factor",
          "[rope]") {
  auto c = yarn_config(true);
  c.factor = 4.0;
  CHECK(relokv::magnitude(c) == Approx(1.0 + 0.1 * std::log(4.0)));  // the default
  CHECK(relokv::softmax_factor(c) == 1.0);
  c.yarn_mscale = 1.0;
  c.yarn_mscale_all_dim = 0.5;
  const double m1 = 0.1 * std::log(4.0) + 1.0, mh = 0.05 * std::log(4.0) + 1.0;
  CHECK(relokv::magnitude(c) == Approx(m1 / mh).epsilon(1e-15));
  CHECK(relokv::softmax_factor(c) == Approx(mh * mh).epsilon(1e-15));
  c.yarn_mscale = c.yarn_mscale_all_dim = 0.707;  // DeepSeek-V2: the ratio is 1
  CHECK(relokv::magnitude(c) == Approx(1.0).epsilon(1e-15));
  c.yarn_attn_factor = 1.25;  // an explicit factor wins
  CHECK(relokv::magnitude(c) == 1.25);
  // The table applies the magnitude to its rows, and not to its unit rows.
  const relokv::rope_table table(c, 64);
  float cs[32], sn[32];
  table.angles(0, cs, sn);
  CHECK(cs[0] == Approx(1.25));
  table.angles(0, cs, sn, /*unit=*/true);
  CHECK(cs[0] == 1.0f);
  c.yarn_mscale_all_dim = -1.0;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("mscale_all_dim must not be negative"));
}

TEST_CASE("layer_rope: Gemma 3's two bases and windows, one table per distinct config", "[rope]") {
  relokv::rope_config local, global;
  local.head_dim = local.rotary_dim = global.head_dim = global.rotary_dim = 256;
  local.theta = 10000.0;
  global.theta = 1000000.0;
  std::vector<relokv::layer_rope::layer> layers;
  for (int l = 0; l < 18; ++l)
    layers.push_back((l + 1) % 6 == 0 ? relokv::layer_rope::layer{global, 0}
                                      : relokv::layer_rope::layer{local, 512});
  const relokv::layer_rope g(layers, 1024);
  CHECK(g.num_layers() == 18);
  CHECK(g.num_tables() == 2);
  CHECK_FALSE(g.uniform());
  CHECK(g.window(0) == 512);
  CHECK(g.window(5) == 0);
  CHECK(&g.table(0) == &g.table(4));
  CHECK(&g.table(5) == &g.table(11));
  CHECK(g.table(5).config().theta == 1000000.0);
  CHECK(g.table(0).config().theta == 10000.0);
  // Position 100's rotation of pair 10 differs between the bases as the bases say.
  float c0[128], s0[128], c5[128], s5[128];
  g.table(0).angles(100, c0, s0);
  g.table(5).angles(100, c5, s5);
  CHECK(std::atan2(s0[10], c0[10]) ==
        Approx(std::remainder(100.0 * std::pow(10000.0, -20.0 / 256), 2 * M_PI)).margin(1e-5));
  CHECK(std::atan2(s5[10], c5[10]) ==
        Approx(std::remainder(100.0 * std::pow(1000000.0, -20.0 / 256), 2 * M_PI)).margin(1e-5));
  const relokv::layer_rope uniform(local, 4, 256);
  CHECK(uniform.uniform());
  CHECK(uniform.num_tables() == 1);
  CHECK_THROWS_WITH(g.table(18), Catch::Contains("layer 18 outside [0, 18)"));
  CHECK_THROWS_WITH(g.window(-1), Catch::Contains("outside"));
  layers[3].window = -1;
  CHECK_THROWS_WITH(relokv::layer_rope(layers), Catch::Contains("layer 3 has a negative window"));
  layers[3].window = 512;
  layers[7].rope.head_dim = layers[7].rope.rotary_dim = 128;
  CHECK_THROWS_WITH(relokv::layer_rope(layers), Catch::Contains("layer 7 has head_dim 128"));
  CHECK_THROWS_WITH(relokv::layer_rope(std::vector<relokv::layer_rope::layer>{}),
                    Catch::Contains("at least one layer"));
}

TEST_CASE("layer_rope: store fingerprints tell RoPE variants and geometries apart", "[rope]") {
  const auto at = relokv::placement_kind::kAtAttention;
  auto c = yarn_config(true);
  const auto base = relokv::store_fingerprint(7, c, at);
  auto f = c;
  f.yarn_truncate = false;
  CHECK(relokv::store_fingerprint(7, f, at) != base);
  f = c;
  f.yarn_mscale = f.yarn_mscale_all_dim = 0.707;
  CHECK(relokv::store_fingerprint(7, f, at) != base);
  // A uniform geometry keeps the single-RoPE fingerprint; windows and a second base change it.
  CHECK(relokv::store_fingerprint(7, relokv::layer_rope(c, 4, 64), at) == base);
  std::vector<relokv::layer_rope::layer> layers(4, relokv::layer_rope::layer{c, 0});
  layers[1].window = 512;
  const auto windowed = relokv::store_fingerprint(7, relokv::layer_rope(layers, 64), at);
  CHECK(windowed != base);
  layers[1].window = 1024;
  CHECK(relokv::store_fingerprint(7, relokv::layer_rope(layers, 64), at) != windowed);
  layers[1].window = 0;
  layers[3].rope.theta = 1e6;
  CHECK(relokv::store_fingerprint(7, relokv::layer_rope(layers, 64), at) != base);
}
