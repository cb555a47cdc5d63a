// Products from quantized weights against dequantize-then-fp32, on random blocks of every
// type, with tails: rows whose block count is odd, activation counts not a multiple of four.
#include "qgemm.hpp"

#include <relokv/dtype.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "support/catch.hpp"

using relokv_engine::ggml_type;
using relokv_engine::qmatrix;

namespace {

// Random bytes for every block, with each fp16 scale replaced by a finite one of a plausible
// size (the types' value bytes are valid whatever they hold).
std::vector<std::uint8_t> random_blocks(ggml_type t, int rows, int cols, std::mt19937& rng) {
  const auto tr = relokv_engine::traits_of(t);
  const auto row_bytes = static_cast<std::size_t>(cols) / tr.block_elems * tr.block_bytes;
  std::vector<std::uint8_t> b(row_bytes * static_cast<std::size_t>(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& x : b) x = static_cast<std::uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.002f, 0.05f);
  const auto put = [&](std::size_t at, float v) {
    const auto h = relokv::fp16::from_float(v).bits;
    std::memcpy(&b[at], &h, 2);
  };
  const std::size_t nblocks = b.size() / tr.block_bytes;
  for (std::size_t k = 0; k < nblocks; ++k) {
    const std::size_t o = k * tr.block_bytes;
    switch (t) {
      case ggml_type::kQ4_0:
      case ggml_type::kQ5_0:
      case ggml_type::kQ8_0:
        put(o, scale(rng));
        break;
      case ggml_type::kQ4_1:
        put(o, scale(rng));
        put(o + 2, -8.0f * scale(rng));
        break;
      case ggml_type::kQ4_K:
        put(o, scale(rng) / 8);
        put(o + 2, scale(rng) / 8);
        break;
      case ggml_type::kQ6_K:
        put(o + 208, scale(rng) / 16);
        break;
      case ggml_type::kF16:
        put(o, scale(rng) * 20 - 0.5f);
        break;
      case ggml_type::kBF16: {
        const auto v = relokv::bf16::from_float(scale(rng) * 20 - 0.5f).bits;
        std::memcpy(&b[o], &v, 2);
        break;
      }
      case ggml_type::kF32: {
        const float v = scale(rng) * 20 - 0.5f;
        std::memcpy(&b[o], &v, 4);
        break;
      }
    }
  }
  return b;
}

qmatrix matrix_of(ggml_type t, int rows, int cols, const std::vector<std::uint8_t>& bytes) {
  return qmatrix::over(t, rows, cols, bytes.data());
}

/// The product of a dequantized row with an activation row in double, and the sum of the
/// products' magnitudes (what fp32 rounding is relative to).
struct reference_dot {
  double exact = 0, mag = 0;
  reference_dot(const std::vector<float>& wr, const float* x) {
    for (std::size_t c = 0; c < wr.size(); ++c) {
      const double p = double(wr[c]) * x[c];
      exact += p;
      mag += std::abs(p);
    }
  }
};

/// The same for activations quantized per block of 32 (scales `d`, one per block): also the
/// bound of the quantization's error, |x - d q| <= d / 2 per element.
struct quantized_reference {
  double exact = 0, bound = 0, mag = 0;
  quantized_reference(const std::vector<float>& wr, const float* x, const float* d) {
    for (std::size_t c = 0; c < wr.size(); ++c) {
      const double p = double(wr[c]) * x[c];
      exact += p;
      mag += std::abs(p);
      bound += std::abs(double(wr[c])) * d[c / 32] / 2;
    }
  }
};

// Calls check(r, i, got, exact, bound, mag) for every output y[i][r] of a product of w with
// the activation rows of x ([n][cols]), quantized with the block scales xd, against w's rows
// dequantized (quantized_reference).
template <class F>
void each_output(const qmatrix& w, const std::vector<float>& x, const float* xd,
                 const std::vector<float>& y, int n, F&& check) {
  const int rows = w.rows, cols = w.cols;
  std::vector<float> wr(static_cast<std::size_t>(cols));
  for (int r = 0; r < rows; ++r) {
    w.dequantize_row(r, wr.data());
    for (int i = 0; i < n; ++i) {
      const auto [exact, bound, mag] =
          quantized_reference(wr, x.data() + static_cast<std::size_t>(i * cols),
                              xd + static_cast<std::size_t>(i * (cols / 32)));
      check(r, i, y[static_cast<std::size_t>(i * rows + r)], exact, bound, mag);
    }
  }
}

}  // namespace

TEST_CASE("qgemm: integer kernels agree with dequantize-then-fp32 within the rounding of Q8",
          "[qgemm]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const auto isas = relokv_engine::integer_kernel_isas();
  CHECK(isas.back() == "portable");
  CHECK_FALSE(relokv_engine::select_integer_kernel_isa("sse9"));
  for (const auto& isa : isas) {
    REQUIRE(relokv_engine::select_integer_kernel_isa(isa));
    CHECK(relokv_engine::integer_kernel_isa() == isa);
    for (const ggml_type t : {ggml_type::kQ4_0, ggml_type::kQ4_1, ggml_type::kQ5_0,
                              ggml_type::kQ8_0, ggml_type::kQ4_K, ggml_type::kQ6_K}) {
      const bool k_quant = t == ggml_type::kQ4_K || t == ggml_type::kQ6_K;
      REQUIRE(relokv_engine::has_integer_kernel(t));
      // 1, 3, 5, 7, 18 and 23 blocks: each of the steps the Q4_1, Q8_0 and Q5_0 kernels take
      // (sixteen blocks, four, two, one) and the tails after them; K-quants: one and three
      // super-blocks
      for (const int cols :
           k_quant ? std::vector<int>{256, 768} : std::vector<int>{32, 96, 160, 224, 576, 736}) {
        // seven activation rows (a group of four, then three) and one (decode: weight rows
        // four at a time where they are short, then one)
        for (const int n : {7, 1}) {
          const int rows = 5;
          const auto bytes = random_blocks(t, rows, cols, rng);
          const qmatrix w = matrix_of(t, rows, cols, bytes);
          std::vector<float> x(static_cast<std::size_t>(n * cols));
          for (auto& v : x) v = nd(rng);
          x[3] = 40.0f;  // an outlier: its block's scale is coarse, the bound follows it
          relokv_engine::q8_activations xq;
          xq.quantize(x.data(), n, cols);
          std::vector<float> y(static_cast<std::size_t>(n * rows), -1.0f);
          relokv_engine::qmatmul_rows(w, x.data(), &xq, n, y.data(), rows, 0, rows);
          each_output(
              w, x, xq.d.data(), y, n,
              [&](int r, int i, float got, double exact, double bound, double mag) {
                INFO(isa << " " << relokv_engine::traits_of(t).name << " cols " << cols << " row "
                         << r << " act " << i << " of " << n);
                CHECK(std::abs(got - exact) <= bound * 1.001 + 1e-4 * (1 + std::abs(exact)));
                // The fast kernel and the reference loops: the same integer sums, fp32
                // order aside (relative to the terms' magnitude: the offsets' terms
                // cancel).
                const float ref = relokv_engine::qdot_portable(w, r, xq, i);
                CHECK(std::abs(got - ref) <= 1e-5 * (1 + std::abs(ref) + mag));
              });
        }
      }
    }
  }
  REQUIRE(relokv_engine::select_integer_kernel_isa(isas.front()));
}

TEST_CASE("qgemm: every other type through dequantized panels equals the fp32 product", "[qgemm]") {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  for (const ggml_type t : {ggml_type::kF32, ggml_type::kF16, ggml_type::kBF16, ggml_type::kQ4_0,
                            ggml_type::kQ5_0, ggml_type::kQ4_K, ggml_type::kQ6_K}) {
    // 2,100 rows of 512: a panel of 2,048 rows (4 MiB of fp32) and a tail of 52
    const int cols = 512, rows = 2100, n = 3;
    const auto bytes = random_blocks(t, rows, cols, rng);
    const qmatrix w = matrix_of(t, rows, cols, bytes);
    std::vector<float> x(static_cast<std::size_t>(n * cols)), y(static_cast<std::size_t>(n * rows));
    for (auto& v : x) v = nd(rng);
    relokv_engine::qmatmul_rows(w, x.data(), nullptr, n, y.data(), rows, 0, rows);
    std::vector<float> wr(static_cast<std::size_t>(cols));
    for (int r = 0; r < rows; ++r) {
      w.dequantize_row(r, wr.data());
      for (int i = 0; i < n; ++i) {
        const auto [exact, mag] = reference_dot(wr, x.data() + static_cast<std::size_t>(i * cols));
        INFO(relokv_engine::traits_of(t).name << " row " << r);
        CHECK(std::abs(y[static_cast<std::size_t>(i * rows + r)] - exact) <= 1e-5 * (1 + mag));
      }
    }
  }
}

TEST_CASE("qgemm: int8 activations round to nearest even against max|x| / 127", "[qgemm]") {
  // The vector quantization (AVX-512 builds) and the scalar one give the same bytes: ties go
  // to even, the largest element to +-127, an all-zero block to zeros with scale 0.
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  const int cols = 96, n = 2;
  std::vector<float> x(static_cast<std::size_t>(n * cols));
  for (auto& v : x) v = nd(rng);
  const float ties[] = {127.0f, 2.5f, -2.5f, 3.5f, 0.5f, -0.5f, -126.5f, 1.5f};
  std::copy(std::begin(ties), std::end(ties), x.begin());  // block 0: scale 1
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);         // block 2: all zero
  relokv_engine::q8_activations xq;
  xq.quantize(x.data(), n, cols);
  for (int b = 0; b < n * cols / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::abs(x[static_cast<std::size_t>(b * 32 + j)]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const auto at = static_cast<std::size_t>(b * 32 + j);
      const auto want = static_cast<std::int8_t>(std::lrintf(x[at] * inv));
      INFO("block " << b << " element " << j);
      CHECK(xq.q[at] == want);
      sum += want;
    }
    CHECK(xq.d[static_cast<std::size_t>(b)] == amax / 127.0f);
    CHECK(xq.s[static_cast<std::size_t>(b)] == amax / 127.0f * static_cast<float>(sum));
  }
  const std::int8_t first[] = {127, 2, -2, 4, 0, 0, -126, 2};
  for (int j = 0; j < 8; ++j) CHECK(xq.q[static_cast<std::size_t>(j)] == first[j]);
  CHECK(xq.d[2] == 0.0f);
}

TEST_CASE("qgemm: a split over row ranges writes only its rows", "[qgemm]") {
  std::mt19937 rng(13);
  const int rows = 9, cols = 64, n = 2;
  const auto bytes = random_blocks(ggml_type::kQ4_1, rows, cols, rng);
  const qmatrix w = matrix_of(ggml_type::kQ4_1, rows, cols, bytes);
  std::vector<float> x(static_cast<std::size_t>(n * cols), 0.5f);
  relokv_engine::q8_activations xq;
  xq.quantize(x.data(), n, cols);
  std::vector<float> whole(static_cast<std::size_t>(n * rows)), parts(whole.size(), 123.0f);
  relokv_engine::qmatmul_rows(w, x.data(), &xq, n, whole.data(), rows, 0, rows);
  relokv_engine::qmatmul_rows(w, x.data(), &xq, n, parts.data(), rows, 0, 4);
  for (int i = 0; i < n; ++i)
    for (int r = 4; r < rows; ++r) CHECK(parts[static_cast<std::size_t>(i * rows + r)] == 123.0f);
  relokv_engine::qmatmul_rows(w, x.data(), &xq, n, parts.data(), rows, 4, rows);
  CHECK(parts == whole);
}

TEST_CASE("qgemm: fp32 activations with Q4_1 and Q8_0, in registers and on panels", "[qgemm]") {
  std::mt19937 rng(14);
  std::normal_distribution<float> nd;
  for (const ggml_type t : {ggml_type::kQ4_1, ggml_type::kQ8_0})
    for (const int n : {1, relokv_engine::kIntegerMaxRows, relokv_engine::kIntegerMaxRows + 1}) {
      const int cols = 96, rows = 3;
      const auto bytes = random_blocks(t, rows, cols, rng);
      const qmatrix w = matrix_of(t, rows, cols, bytes);
      CHECK(relokv_engine::integer_product(w, n) == (n <= relokv_engine::kIntegerMaxRows));
      std::vector<float> x(static_cast<std::size_t>(n * cols)),
          y(static_cast<std::size_t>(n * rows));
      for (auto& v : x) v = nd(rng);
      relokv_engine::qmatmul_rows(w, x.data(), nullptr, n, y.data(), rows, 0, rows);
      std::vector<float> wr(static_cast<std::size_t>(cols));
      for (int r = 0; r < rows; ++r) {
        w.dequantize_row(r, wr.data());
        for (int i = 0; i < n; ++i) {
          const auto [exact, mag] =
              reference_dot(wr, x.data() + static_cast<std::size_t>(i * cols));
          const float got = y[static_cast<std::size_t>(i * rows + r)];
          CHECK(std::abs(got - exact) <= 1e-5 * (1 + mag));
          const float ref = relokv_engine::qdot_fp32_portable(
              w, r, x.data() + static_cast<std::size_t>(i * cols));
          CHECK(std::abs(got - ref) <= 1e-5f * (1.0f + static_cast<float>(mag)));
        }
      }
    }
}

TEST_CASE("qgemm: the int16 tiles agree with dequantize-then-fp32 for every quantized type",
          "[qgemm]") {
  const auto isas = relokv_engine::tile_kernel_isas();
  REQUIRE(isas.back() == "portable");
  CHECK_FALSE(relokv_engine::select_tile_kernel_isa("sse9"));
  std::mt19937 rng(15);
  std::normal_distribution<float> nd;
  for (const auto& isa : isas) {
    REQUIRE(relokv_engine::select_tile_kernel_isa(isa));
    INFO("tiles: " << relokv_engine::tile_kernel_isa());
    for (const ggml_type t : {ggml_type::kQ4_0, ggml_type::kQ4_1, ggml_type::kQ5_0,
                              ggml_type::kQ8_0, ggml_type::kQ4_K, ggml_type::kQ6_K}) {
      // 600 rows of 512: two panels (512 KiB of int16 holds 512 rows), a last register tile of
      // one group with 8 of its 16 rows; 11 activation rows: tiles of four (or three), then the
      // rest.
      const int cols = 512, rows = 600, n = 11;
      // The engine runs the tiles where they are vectorized, BLAS on panels elsewhere.
      CHECK(relokv_engine::has_tile_kernel(t) == (isa != "portable"));
      const auto bytes = random_blocks(t, rows, cols, rng);
      const qmatrix w = matrix_of(t, rows, cols, bytes);
      std::vector<float> x(static_cast<std::size_t>(n * cols));
      for (auto& v : x) v = nd(rng);
      x[5] = 60.0f;  // an outlier: its block's scale is coarse, the bound follows it
      relokv_engine::q16_activations xq;
      xq.quantize(x.data(), n, cols, relokv_engine::tile_weight_bound(t));
      std::vector<float> y(static_cast<std::size_t>(n * rows), -1.0f);
      // Two calls over row ranges that split a group: each writes its rows only.
      relokv_engine::tile_matmul_rows(w, xq, y.data(), rows, 0, 37);
      for (int i = 0; i < n; ++i) CHECK(y[static_cast<std::size_t>(i * rows + 37)] == -1.0f);
      relokv_engine::tile_matmul_rows(w, xq, y.data(), rows, 37, rows);
      each_output(w, x, xq.d.data(), y, n,
                  [&](int r, int i, float got, double exact, double bound, double mag) {
                    INFO(relokv_engine::traits_of(t).name << " row " << r << " act " << i);
                    CHECK(std::abs(got - exact) <= bound * 1.001 + 2e-5 * (1 + mag));
                  });
    }
  }
  REQUIRE(relokv_engine::select_tile_kernel_isa(isas.front()));
}

TEST_CASE("qgemm: the tiles' int32 sums do not overflow at the largest weights", "[qgemm]") {
  // Q6_K with every value -32 and every scale -128: integers of 4,096; activations at the
  // quantization limit in every element.
  const int cols = 256, rows = 16, n = 5;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows) * 210, 0);
  for (int r = 0; r < rows; ++r) {
    std::uint8_t* b = bytes.data() + static_cast<std::size_t>(r) * 210;
    std::memset(b + 192, 0x80, 16);  // int8 scales of -128
    const auto h = relokv::fp16::from_float(1.0f / 4096).bits;
    std::memcpy(b + 208, &h, 2);
  }
  const qmatrix w = matrix_of(ggml_type::kQ6_K, rows, cols, bytes);
  std::vector<float> x(static_cast<std::size_t>(n * cols), 3.0f), wr(cols);
  relokv_engine::q16_activations xq;
  xq.quantize(x.data(), n, cols, relokv_engine::tile_weight_bound(ggml_type::kQ6_K));
  CHECK(std::int64_t{32} * 4096 * xq.limit < (std::int64_t{1} << 31));
  std::vector<float> y(static_cast<std::size_t>(n * rows));
  relokv_engine::tile_matmul_rows(w, xq, y.data(), rows, 0, rows);
  w.dequantize_row(0, wr.data());
  CHECK(wr[0] == 1.0f);  // -32 * -128 / 4096
  for (const float v : y) CHECK(v == Approx(3.0 * cols).epsilon(1e-5));
}

TEST_CASE("qgemm: panels unpacked in registers are the bits of those unpacked row by row",
          "[qgemm]") {
  // Every tile ISA and type; 600 rows (37 whole groups, then 8 rows unpacked row by row) over
  // two calls that split a group, so both unpackings meet in one panel.
  std::mt19937 rng(27);
  std::normal_distribution<float> nd;
  for (const auto& isa : relokv_engine::tile_kernel_isas()) {
    REQUIRE(relokv_engine::select_tile_kernel_isa(isa));
    for (const ggml_type t : {ggml_type::kQ4_0, ggml_type::kQ4_1, ggml_type::kQ5_0,
                              ggml_type::kQ8_0, ggml_type::kQ4_K, ggml_type::kQ6_K}) {
      INFO("tiles: " << isa << ", " << relokv_engine::traits_of(t).name);
      const int cols = 512, rows = 600, n = 7;
      const auto bytes = random_blocks(t, rows, cols, rng);
      const qmatrix w = matrix_of(t, rows, cols, bytes);
      std::vector<float> x(static_cast<std::size_t>(n * cols));
      for (auto& v : x) v = nd(rng);
      relokv_engine::q16_activations xq;
      xq.quantize(x.data(), n, cols, relokv_engine::tile_weight_bound(t));
      std::vector<float> y[2];
      for (int fast = 0; fast < 2; ++fast) {
        relokv_engine::use_vectorized_panels(fast == 1);
        y[fast].assign(static_cast<std::size_t>(n * rows), -1.0f);
        relokv_engine::tile_matmul_rows(w, xq, y[fast].data(), rows, 0, 40);
        relokv_engine::tile_matmul_rows(w, xq, y[fast].data(), rows, 40, rows);
      }
      relokv_engine::use_vectorized_panels(true);
      CHECK(std::memcmp(y[0].data(), y[1].data(), y[0].size() * sizeof(float)) == 0);
    }
  }
  REQUIRE(relokv_engine::select_tile_kernel_isa(relokv_engine::tile_kernel_isas().front()));
}

TEST_CASE("qgemm: the AMX tiles agree with dequantize-then-fp32 for every type they serve",
          "[qgemm]") {
  // Where the build or host has no AMX, amx_matmul_rows runs the same arithmetic in plain
  // loops: the test then checks the arithmetic, not the tiles.
  INFO("AMX tiles: " << (relokv_engine::has_amx_tiles() ? "on" : "off (plain loops)"));
  std::mt19937 rng(16);
  std::normal_distribution<float> nd;
  for (const ggml_type t :
       {ggml_type::kQ4_0, ggml_type::kQ4_1, ggml_type::kQ5_0, ggml_type::kQ8_0, ggml_type::kQ4_K,
        ggml_type::kQ6_K, ggml_type::kF16, ggml_type::kBF16}) {
    // 600 rows of 512: two panels of 256 rows (1 MiB) and one of 88 (a lone last tile
    // column of 8 rows); 37 activation rows: a block of two tiles, then one of 5 rows.
    const int cols = 512, rows = 600, n = 37;
    const auto bytes = random_blocks(t, rows, cols, rng);
    const qmatrix w = matrix_of(t, rows, cols, bytes);
    std::vector<float> x(static_cast<std::size_t>(n * cols));
    for (auto& v : x) v = nd(rng);
    x[5] = 60.0f;  // an outlier: bf16 pairs are relative to each element, not to its block
    x[7] = 1e-3f;
    relokv_engine::bf16_activations xb;
    xb.size(n, cols);
    xb.convert_rows(x.data(), 0, 20);
    xb.convert_rows(x.data(), 20, n);
    std::vector<float> y(static_cast<std::size_t>(n * rows), -1.0f);
    // Two calls over row ranges that split a tile column: each writes its rows only.
    relokv_engine::amx_matmul_rows(w, xb, y.data(), rows, 0, 37);
    for (int i = 0; i < n; ++i) CHECK(y[static_cast<std::size_t>(i * rows + 37)] == -1.0f);
    relokv_engine::amx_matmul_rows(w, xb, y.data(), rows, 37, rows);
    std::vector<float> wr(static_cast<std::size_t>(cols));
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
      w.dequantize_row(r, wr.data());
      for (int i = 0; i < n; ++i) {
        const reference_dot ref(wr, x.data() + static_cast<std::size_t>(i * cols));
        const float got = y[static_cast<std::size_t>(i * rows + r)];
        INFO(relokv_engine::traits_of(t).name << " row " << r << " act " << i);
        // hi + lo keeps 16 significant bits of each factor (2^-16 relative each), fp32
        // accumulation over 3 x 512 terms adds its own; 2^-13 of the magnitudes bounds both.
        CHECK(std::abs(got - ref.exact) <= ref.mag * 0x1p-13);
        worst = std::max(worst, std::abs(got - ref.exact) / ref.mag);
      }
    }
    INFO(relokv_engine::traits_of(t).name << " worst error over magnitude " << worst);
    CHECK(worst < 0x1p-15);
  }
}

TEST_CASE("qgemm: AMX activations reject rows that are not whole steps", "[qgemm]") {
  relokv_engine::bf16_activations xb;
  CHECK_THROWS_AS(xb.size(4, 48), std::logic_error);
}

// Issue 45, item 0: every fp32 product the engine can take must be batch-invariant (a row's
// outputs the same bits whatever the number of rows computed with it), or exact cache hits,
// which leave fewer rows to compute, are not exact. OpenBLAS's AVX2 SGEMM was not.
#include "sgemm.hpp"

TEST_CASE("qgemm: the fp32 product is batch-invariant and the same sum on every path", "[qgemm]") {
  std::mt19937 rng(45);
  std::normal_distribution<float> nd;
  INFO("sgemm: " << relokv_engine::sgemm_isa());
  for (const int k : {8, 13, 64, 576, 1000}) {
    const int m = 23, nmax = 41;
    std::vector<float> x(static_cast<std::size_t>(nmax * k)), w(static_cast<std::size_t>(m * k));
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = nd(rng);
    // The reference: each element alone.
    std::vector<float> ref(static_cast<std::size_t>(nmax * m));
    for (int i = 0; i < nmax; ++i)
      for (int r = 0; r < m; ++r)
        ref[static_cast<std::size_t>(i * m + r)] =
            relokv_engine::sgemm_dot(x.data() + i * k, w.data() + r * k, k);
    for (const int n : {1, 2, 3, 4, 5, 7, 8, 9, 13, 41}) {
      // Rows [nmax - n, nmax): the last rows of the batch, at a different tile position in
      // every n; and rows of w from an odd offset.
      const int i0 = nmax - n, r0 = 1;
      std::vector<float> y(static_cast<std::size_t>(n * m), -1.0f);
      relokv_engine::sgemm_nt(x.data() + i0 * k, k, n, w.data() + r0 * k, k, m - r0, k,
                              y.data() + r0, m);
      std::size_t differing = 0;
      for (int i = 0; i < n; ++i)
        for (int r = r0; r < m; ++r)
          differing += std::memcmp(&y[static_cast<std::size_t>(i * m + r)],
                                   &ref[static_cast<std::size_t>((i0 + i) * m + r)], 4) != 0;
      INFO("k " << k << ", n " << n);
      CHECK(differing == 0);
      for (int i = 0; i < n; ++i) CHECK(y[static_cast<std::size_t>(i * m)] == -1.0f);  // r < r0
    }
  }
  // Through qmatmul_rows: fp32 activations against every type's dequantized panels, with the
  // integer kernels off (the path OpenBLAS served), for n = 1 ... 20 rows.
  relokv_engine::use_integer_kernels(false);
  for (const ggml_type t :
       {ggml_type::kF32, ggml_type::kQ4_1, ggml_type::kQ8_0, ggml_type::kQ4_K, ggml_type::kQ6_K}) {
    const int cols = 256, rows = 37, nmax = 20;
    const auto bytes = random_blocks(t, rows, cols, rng);
    const qmatrix w = matrix_of(t, rows, cols, bytes);
    std::vector<float> x(static_cast<std::size_t>(nmax * cols));
    for (auto& v : x) v = nd(rng);
    std::vector<float> all(static_cast<std::size_t>(nmax * rows));
    relokv_engine::qmatmul_rows(w, x.data(), nullptr, nmax, all.data(), rows, 0, rows);
    for (int n = 1; n < nmax; ++n) {
      std::vector<float> y(static_cast<std::size_t>(n * rows));
      const int i0 = nmax - n;
      relokv_engine::qmatmul_rows(w, x.data() + i0 * cols, nullptr, n, y.data(), rows, 0, rows);
      INFO("type " << static_cast<int>(t) << ", n " << n);
      CHECK(std::memcmp(y.data(), all.data() + i0 * rows, y.size() * sizeof(float)) == 0);
    }
  }
  relokv_engine::use_integer_kernels(true);
}
