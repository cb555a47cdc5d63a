// llama.cpp's sequence image, written and read back, and every malformed image refused with a
// message (no llama.cpp needed).
#include <cstring>
#include <stdexcept>
#include <vector>

#include "seq_image.hpp"
#include "support/catch.hpp"

using relokv_llama_cpp::image_geometry;
using relokv_llama_cpp::seq_image;
using relokv_llama_cpp::write_image;

namespace {
image_geometry geo() {
  image_geometry g;
  g.n_layers = 3;
  g.ggml_type = 1;  // GGML_TYPE_F16
  g.elem_bytes = 2;
  g.row_elems = 6;
  return g;
}
/// A distinct byte pattern per (layer, cell, k|v, byte).
std::byte pattern(std::int32_t l, std::int32_t c, bool v, std::size_t i) {
  return static_cast<std::byte>((l * 37 + c * 11 + (v ? 101 : 0) + static_cast<int>(i) * 3) & 0xff);
}
std::vector<std::uint8_t> image(bool v_trans, const std::vector<std::int32_t>& pos) {
  const image_geometry g = geo();
  return write_image(pos, 5, v_trans, g,
                     [&](std::int32_t l, std::int32_t c, bool v, std::byte* out) {
                       for (std::size_t i = 0; i < g.row_bytes(); ++i) out[i] = pattern(l, c, v, i);
                     });
}
}  // namespace

TEST_CASE("seq_image: rows read back as written, V plain or transposed", "[llama_cpp]") {
  const std::vector<std::int32_t> pos{40, 41, 7, 300};
  for (bool vt : {false, true}) {
    const seq_image im = seq_image::parse(image(vt, pos), geo());
    REQUIRE(im.cells() == 4);
    CHECK(im.v_trans() == vt);
    for (std::int32_t c = 0; c < 4; ++c) CHECK(im.pos(c) == pos[static_cast<std::size_t>(c)]);
    std::vector<std::byte> row(geo().row_bytes());
    for (std::int32_t l = 0; l < 3; ++l)
      for (std::int32_t c = 0; c < 4; ++c)
        for (bool v : {false, true}) {
          im.row(l, c, v, row.data());
          for (std::size_t i = 0; i < row.size(); ++i) CHECK(row[i] == pattern(l, c, v, i));
        }
  }
  // No cells: the header alone.
  CHECK(seq_image::parse(image(false, {}), geo()).cells() == 0);
}

TEST_CASE("seq_image: every truncation and every wrong field is refused", "[llama_cpp]") {
  const auto good = image(false, {0, 1, 2});
  // Every proper prefix: a clear error, never a read past the end.
  for (std::size_t n = 0; n < good.size(); ++n) {
    std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    if (n == 16) continue;  // "0 cells" is a valid image only when the count says 0
    CHECK_THROWS_AS(seq_image::parse(cut, geo()), std::runtime_error);
  }
  auto with = [&](std::size_t at, std::uint32_t v) {
    auto b = good;
    std::memcpy(b.data() + at, &v, sizeof v);
    return b;
  };
  CHECK_THROWS_WITH(seq_image::parse(with(0, 0x12345678), geo()), Catch::Contains("magic"));
  CHECK_THROWS_WITH(seq_image::parse(with(8, 2), geo()), Catch::Contains("n_stream"));
  CHECK_THROWS_WITH(seq_image::parse(with(12, 1u << 30), geo()), Catch::Contains("cell count"));
  CHECK_THROWS_WITH(seq_image::parse(with(16 + 4, 2), geo()), Catch::Contains("sequence count"));
  const std::size_t data = 16 + 3 * 12;
  CHECK_THROWS_WITH(seq_image::parse(with(data, 7), geo()), Catch::Contains("v_trans"));
  CHECK_THROWS_WITH(seq_image::parse(with(data + 4, 4), geo()), Catch::Contains("n_layer"));
  CHECK_THROWS_WITH(seq_image::parse(with(data + 8, 0), geo()), Catch::Contains("k_type"));
  CHECK_THROWS_WITH(seq_image::parse(with(data + 12, 99), geo()), Catch::Contains("k_row_bytes"));
  auto longer = good;
  longer.push_back(0);
  CHECK_THROWS_WITH(seq_image::parse(longer, geo()), Catch::Contains("after the last layer"));
  image_geometry other = geo();
  other.ggml_type = 0;  // an f32 engine reading an f16 image
  CHECK_THROWS_WITH(seq_image::parse(good, other), Catch::Contains("k_type"));
}

TEST_CASE("seq_image: a sliding-window model's two images, global layers then windowed",
          "[llama_cpp]") {
  // Gemma 3's split in five layers: layer 2 global (llama.cpp's base cache), the others
  // windowed (its SWA cache, written after); rows land on their model layers.
  image_geometry g = geo();
  g.n_layers = 5;
  g.parts = {{2}, {0, 1, 3, 4}};
  const std::vector<std::int32_t> pos{3, 4, 9};
  const auto fill = [&](std::int32_t l, std::int32_t c, bool v, std::byte* out) {
    for (std::size_t i = 0; i < g.row_bytes(); ++i) out[i] = pattern(l, c, v, i);
  };
  for (bool vt : {false, true}) {
    const auto bytes = write_image(pos, 1, vt, g, fill);
    const seq_image im = seq_image::parse(bytes, g);
    REQUIRE(im.cells() == 3);
    std::vector<std::byte> row(g.row_bytes());
    for (std::int32_t l = 0; l < 5; ++l)
      for (std::int32_t c = 0; c < 3; ++c)
        for (bool v : {false, true}) {
          im.row(l, c, v, row.data());
          for (std::size_t i = 0; i < row.size(); ++i) CHECK(row[i] == pattern(l, c, v, i));
        }
    // The first image holds one layer: its n_layer field says 1.
    std::uint32_t n_layer = 0;
    std::memcpy(&n_layer, bytes.data() + 16 + 3 * 12 + 4, sizeof n_layer);
    CHECK(n_layer == 1);
  }
  // Parts that disagree on their cells, or do not cover the layers, are refused.
  auto bytes = write_image(pos, 1, false, g, fill);
  // The second cache starts after the first's n_stream, cells, v_trans, n_layer and rows.
  const std::size_t second = 8 + 8 + 3 * 12 + 8 + 2 * (12 + 3 * g.row_bytes());
  const std::int32_t moved = 77;
  std::memcpy(bytes.data() + second + 8, &moved, sizeof moved);
  CHECK_THROWS_WITH(seq_image::parse(bytes, g),
                    Catch::Contains("part 1's cell 0 is at position 77"));
  image_geometry missing = g;
  missing.parts = {{2}, {0, 1, 3}};
  CHECK_THROWS_WITH(seq_image::parse(write_image(pos, 1, false, g, fill), missing),
                    Catch::Contains("the parts hold 4 layers of 5"));
  CHECK(seq_image::parse(write_image({}, 1, false, g, fill), g).cells() == 0);
}
