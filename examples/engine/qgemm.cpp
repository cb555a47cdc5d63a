// Products from GGUF weights in their own types (see qgemm.hpp).
#include "qgemm.hpp"
#include "qgemm_blocks.hpp"

#include "isa.hpp"
#include "sgemm.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include <relokv/dtype.hpp>

#include "qgemm_paired.hpp"

namespace relokv_engine {
#if RELOKV_ENGINE_PAIRED
using detail::has_paired_kernel;
using detail::kInterleavedRowBytes;
using detail::paired_rows;
using detail::q4_1_order;
#if RELOKV_ENGINE_Q5_0
using detail::q5_0_order;
#endif
#endif

namespace {
std::atomic<bool> g_integer{true};
// The integer kernels' instruction set: 0 the build's best, 1 AVX2's block kernels, 2 scalar.
std::atomic<int> g_isa{0};

block_isa block_isa_now() noexcept {
  switch (g_isa.load(std::memory_order_relaxed)) {
    case 1:
      return block_isa::kAvx2;
    case 2:
      return block_isa::kPortable;
    default:
      return RELOKV_ENGINE_VNNI && isa_cap() >= isa_level::kAvx512 ? block_isa::kVnni256
             : block_isa_available(block_isa::kAvx2)               ? block_isa::kAvx2
                                                                   : block_isa::kPortable;
  }
}
}  // namespace

void use_integer_kernels(bool on) noexcept { g_integer.store(on, std::memory_order_relaxed); }

bool integer_kernels_on() noexcept { return g_integer.load(std::memory_order_relaxed); }

bool has_integer_kernel(ggml_type t) noexcept {
  return has_block_decode(t) && integer_kernels_on();
}

const char* integer_kernel_isa() noexcept {
  switch (block_isa_now()) {
    case block_isa::kVnni256:
      return "avx512-vnni";
    case block_isa::kAvx2:
      return "avx2";
    case block_isa::kPortable:
      break;
  }
  return "portable";
}

std::vector<std::string> integer_kernel_isas() {
  std::vector<std::string> out;
  if (RELOKV_ENGINE_VNNI && isa_cap() >= isa_level::kAvx512) out.emplace_back("avx512-vnni");
  if (block_isa_available(block_isa::kAvx2)) out.emplace_back("avx2");
  out.emplace_back("portable");
  return out;
}

bool select_integer_kernel_isa(const std::string& isa) noexcept {
  const auto have = integer_kernel_isas();
  if (std::find(have.begin(), have.end(), isa) == have.end()) return false;
  g_isa.store(isa == "portable" ? 2 : isa == "avx2" ? 1 : 0, std::memory_order_relaxed);
  return true;
}

qmatrix qmatrix::over(ggml_type t, std::int32_t rows, std::int32_t cols, const std::uint8_t* data,
                      std::shared_ptr<const void> hold) {
  const type_traits tr = traits_of(t);
  qmatrix m;
  m.type = t;
  m.rows = rows;
  m.cols = cols;
  m.data = data;
  m.row_bytes = static_cast<std::size_t>(cols) / tr.block_elems * tr.block_bytes;
  m.hold = std::move(hold);
  return m;
}

qmatrix qmatrix::view(const gguf_file& f, const gguf_tensor& t, std::shared_ptr<const void> hold) {
  if (t.dims.size() != 2 || t.dims[0] == 0 || t.dims[1] == 0 || t.dims[0] > (1u << 24) ||
      t.dims[1] > (1u << 24))
    throw gguf_error(f.name(), t.offset, "tensor '" + t.name + "' is not a matrix");
  const type_traits tr = traits_of(t.type);
  if (t.dims[0] % tr.block_elems != 0)
    throw gguf_error(f.name(), t.offset,
                     "tensor '" + t.name + "': rows of " + std::to_string(t.dims[0]) +
                         " elements are not whole " + tr.name + " blocks");
  return over(t.type, static_cast<std::int32_t>(t.dims[1]), static_cast<std::int32_t>(t.dims[0]),
              t.data, std::move(hold));
}

qmatrix qmatrix::owned(std::vector<float> w, std::int32_t rows, std::int32_t cols) {
  auto v = std::make_shared<std::vector<float>>(std::move(w));
  const auto* data = reinterpret_cast<const std::uint8_t*>(v->data());
  return over(ggml_type::kF32, rows, cols, data, std::move(v));
}

void qmatrix::dequantize_row(std::int32_t r, float* out) const {
  dequantize_blocks(type, row(r), static_cast<std::uint64_t>(cols), out);
}

// GCC 12's false -Wmaybe-uninitialized inside the AVX-512 intrinsics again (see the kernels).
#if RELOKV_ENGINE_VNNI && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
void q8_activations::quantize(const float* x, std::int32_t rows, std::int32_t width) {
  n = rows;
  cols = width;
  const auto nbk = static_cast<std::size_t>(width / 32);
  q.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(width));
  d.resize(static_cast<std::size_t>(rows) * nbk);
  s.resize(d.size());
  ds.resize(2 * d.size());
  s16.resize(2 * d.size());
  for (std::size_t blk = 0; blk < d.size(); ++blk) {
    const float* xb = x + blk * 32;
    std::int8_t* qb = q.data() + blk * 32;
    int sum = 0, first = 0;
    float scale = 0.0f;
#if RELOKV_ENGINE_VNNI
    // The same values as the loop below: VCVTPS2DQ rounds to nearest even, as lrintf does.
    const __m512 lo = _mm512_loadu_ps(xb), hi = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    scale = amax / 127.0f;
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtsepi32_epi8(qhi));
    first = _mm512_reduce_add_epi32(qlo);
    sum = first + _mm512_reduce_add_epi32(qhi);
#else
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::abs(xb[j]));
    scale = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; ++j) {
      qb[j] = static_cast<std::int8_t>(std::lrintf(xb[j] * inv));
      sum += qb[j];
      if (j == 15) first = sum;
    }
#endif
    s16[2 * blk] = scale * static_cast<float>(first);
    s16[2 * blk + 1] = scale * static_cast<float>(sum - first);
    d[blk] = scale;
    s[blk] = scale * static_cast<float>(sum);
    ds[2 * blk] = scale;
    ds[2 * blk + 1] = s[blk];
  }
#if RELOKV_ENGINE_PAIRED  // the layouts only the AVX-512 kernels read
  q4_1_order(q, rows, width, qp, qp_stride);
#if RELOKV_ENGINE_Q5_0
  q5_0_order(q, rows, width, qq);
#endif
#endif
}
#if RELOKV_ENGINE_VNNI && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

float qdot_portable(const qmatrix& w, std::int32_t r, const q8_activations& xq, std::int32_t i) {
  return block_dot_portable(w, r, xq, i);
}

float qdot_fp32_portable(const qmatrix& w, std::int32_t r, const float* x) {
  std::vector<float> row(static_cast<std::size_t>(w.cols));
  w.dequantize_row(r, row.data());
  return sgemm_dot(x, row.data(), w.cols);
}

void qmatmul_rows(const qmatrix& w, const float* x, const q8_activations* xq, std::int32_t n,
                  float* y, std::int32_t ldy, std::int32_t r0, std::int32_t r1) {
  if (r1 <= r0 || n <= 0) return;
  if (xq != nullptr && integer_product(w, n)) {
    const block_isa isa = block_isa_now();
#if RELOKV_ENGINE_PAIRED
    if (isa == block_isa::kVnni256 && has_paired_kernel(w.type)) {
      const int nb = w.cols / 32;
      std::int32_t r = r0;
      // Decode: four short rows at a time (SmolLM2's 576 columns: their sums' chains and the
      // row loop's overheads had left the kernel at half its speed on long rows). Long rows
      // stream faster one at a time (bench/bench_gemv.cpp).
      if (n == 1 && w.row_bytes <= kInterleavedRowBytes)
        for (; r + 4 <= r1; r += 4) {
          const std::uint8_t* rows[4] = {w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)};
          paired_rows<4, 1>(w.type, rows, nb, *xq, 0, y + r);
        }
      for (; r < r1; ++r) {
        const std::uint8_t* row = w.row(r);
        std::int32_t i = 0;
        float out[4];
        for (; i + 4 <= n; i += 4) {
          paired_rows<1, 4>(w.type, &row, nb, *xq, i, out);
          for (int k = 0; k < 4; ++k) y[static_cast<std::size_t>(i + k) * ldy + r] = out[k];
        }
        for (; i < n; ++i) {
          paired_rows<1, 1>(w.type, &row, nb, *xq, i, out);
          y[static_cast<std::size_t>(i) * ldy + r] = out[0];
        }
      }
      return;
    }
#endif
    block_rows(isa, w, *xq, n, y, ldy, r0, r1);
    return;
  }
  // fp32: the same batch-invariant product (sgemm.hpp) for every n, so that a row's outputs
  // do not depend on how many rows came with it.
  if (w.type == ggml_type::kF32) {  // the weights as they are
    sgemm_nt(x, w.cols, n, reinterpret_cast<const float*>(w.row(r0)), w.cols, r1 - r0, w.cols,
             y + r0, ldy);
    return;
  }
  // Panels of rows dequantized into a per-thread buffer that stays in L2 (about 128 KiB),
  // each multiplied with the same kernel.
  const std::int32_t kPanel =
      std::max<std::int32_t>(8, static_cast<std::int32_t>((std::size_t{128} << 10) / sizeof(float) /
                                                          static_cast<std::size_t>(w.cols)));
  thread_local std::vector<float> panel;
  panel.resize(static_cast<std::size_t>(std::min(kPanel, r1 - r0)) *
               static_cast<std::size_t>(w.cols));
  for (std::int32_t p0 = r0; p0 < r1; p0 += kPanel) {
    const std::int32_t rows = std::min(kPanel, r1 - p0);
    for (std::int32_t r = 0; r < rows; ++r)
      w.dequantize_row(p0 + r, panel.data() + static_cast<std::size_t>(r) * w.cols);
    sgemm_nt(x, w.cols, n, panel.data(), w.cols, rows, w.cols, y + p0, ldy);
  }
}

}  // namespace relokv_engine
