#pragma once
// Matrix products straight from GGUF weights, in their own types: no fp32 copy of the model.
//
// Which kernel runs where (the one place that says it; RELOKV_ISA=amx|avx512|avx2|portable
// caps the choice, isa.hpp):
//
//   product                        kernel, best first                          file
//   decode (<= 8 rows; a server's  Q4_1, Q8_0, Q5_0*: AVX-512 VNNI paired      qgemm_paired.cpp
//   batch in groups of 8), int8    other quantized types: 256-bit VNNI blocks  qgemm_blocks.cpp
//   activations per 32 elements    AVX2 blocks (VPMADDUBSW); portable loops    qgemm_blocks.cpp
//   prefill, any row count         AMX tiles, bf16 hi + lo terms (AMX hosts)   qgemm_amx.cpp
//                                  int16 tiles: VPDPWSSD (AVX-512) or VPMADDWD qgemm_tiles.cpp
//   F32/F16/BF16 weights, the      dequantized panels (~128 KiB) times the     qgemm.cpp,
//   logits row, integer kernels    batch-invariant fp32 kernel                 sgemm.cpp
//   switched off
//
//   * paired kernels need AVX512_VBMI (Q5_0's also AVX512_BITALG): Ice Lake and later, Zen 4.
// Every path is batch-invariant: a row's outputs do not depend on how many rows come with it
// (exact hits and a server's batches rely on it; forward.cpp's matmuls chooses per product).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf.hpp"

namespace relokv_engine {

/// A weight matrix [rows][cols], row-major (a GGUF tensor of dims {cols, rows}), in its GGUF
/// type. It points into memory it does not own (the file's mapping, or an fp32 vector) and
/// keeps that memory alive through `hold`.
struct qmatrix {
  ggml_type type = ggml_type::kF32;
  std::int32_t rows = 0, cols = 0;
  const std::uint8_t* data = nullptr;
  std::size_t row_bytes = 0;
  std::shared_ptr<const void> hold;

  [[nodiscard]] bool empty() const noexcept { return rows == 0; }
  [[nodiscard]] const std::uint8_t* row(std::int32_t r) const noexcept {
    return data + static_cast<std::size_t>(r) * row_bytes;
  }
  [[nodiscard]] std::size_t bytes() const noexcept {
    return row_bytes * static_cast<std::size_t>(rows);
  }
  /// A [rows][cols] matrix of type t whose blocks start at data (row_bytes follows from the
  /// type); `hold` keeps them alive. cols must hold whole blocks of t.
  static qmatrix over(ggml_type t, std::int32_t rows, std::int32_t cols, const std::uint8_t* data,
                      std::shared_ptr<const void> hold = nullptr);
  /// The tensor as it is in the file (which `hold` keeps mapped).
  /// @throws gguf_error when a row does not hold whole blocks of its type
  static qmatrix view(const gguf_file& f, const gguf_tensor& t, std::shared_ptr<const void> hold);
  /// An fp32 matrix this qmatrix owns (the synthetic model; tests).
  static qmatrix owned(std::vector<float> w, std::int32_t rows, std::int32_t cols);
  /// Row r as fp32 (cols floats).
  void dequantize_row(std::int32_t r, float* out) const;
};

/// Turns the integer kernels off (true: the default) for the whole process: every type then
/// goes through dequantized fp32 panels, fp32 activations included (faithfulness checks
/// against fp32 references). Set it before any product runs.
void use_integer_kernels(bool on) noexcept;
/// Whether use_integer_kernels left them on.
[[nodiscard]] bool integer_kernels_on() noexcept;
/// Whether products with a type run on integer dot products (else: dequantized panels).
[[nodiscard]] bool has_integer_kernel(ggml_type t) noexcept;
/// Products of at most this many activation rows may use the int8 kernels (the engine uses
/// them in decode); longer ones (prefill) go to the int16 tiles, tile_matmul_rows
/// (bench/results/engine-2026-12-01b.md).
inline constexpr std::int32_t kIntegerMaxRows = 8;
/// Whether a product of n activation rows with w runs on the integer kernels.
[[nodiscard]] inline bool integer_product(const qmatrix& w, std::int32_t n) noexcept {
  return n <= kIntegerMaxRows && has_integer_kernel(w.type);
}
/// The integer kernels' instruction set in use: "avx512-vnni" (AVX-512 kernels for Q4_1, Q8_0
/// and, with AVX512_BITALG, Q5_0; 256-bit VPDPBUSD block kernels for the others), "avx2" (block
/// kernels on VPMADDUBSW) or "portable" (scalar loops).
[[nodiscard]] const char* integer_kernel_isa() noexcept;
/// The instruction sets this build has, best first (a host runs what its build targets).
[[nodiscard]] std::vector<std::string> integer_kernel_isas();
/// Makes the integer kernels use `isa` (one of integer_kernel_isas()) for the whole process;
/// tests and benchmarks compare them. False, and nothing changes, when the build lacks it.
bool select_integer_kernel_isa(const std::string& isa) noexcept;

/// Activations in int8 blocks of 32 with an fp32 scale each (Q8 as the formats intend): the
/// integer kernels' right-hand side, quantized once per product and shared by its rows.
struct q8_activations {
  std::int32_t n = 0, cols = 0;
  std::vector<std::int8_t> q;  ///< [n][cols]
  std::vector<float> d;        ///< [n][cols / 32]: the scale of each block
  std::vector<float> s;        ///< [n][cols / 32]: d * (sum of the block's q)
  /// q laid out for the AVX-512 Q4_1 kernel, qp_stride bytes a row (empty in builds without it)
  std::vector<std::int8_t> qp;
  std::size_t qp_stride = 0;
  std::vector<std::int8_t> qq;  ///< q for the AVX-512 Q5_0 kernel ([n][cols]; empty without it)
  std::vector<float> ds;        ///< [n][cols / 32][2]: d and s side by side
  std::vector<float> s16;       ///< [n][cols / 16]: d * (sum of each half block's q)
  /// Quantizes x ([n][cols], cols a multiple of 32): q = round(x / d), d = max|x| / 127.
  void quantize(const float* x, std::int32_t n, std::int32_t cols);
};

/// Activations in int16 blocks of 32 with an fp32 scale each: the prefill tiles' left-hand
/// side. Nearly fp32's precision (each element within limit^-1 of its block's largest), where
/// int8 would flip near-tied logits (bench/results/engine-2026-12-01.md).
struct q16_activations {
  std::int32_t n = 0, cols = 0;
  std::int32_t limit = 32767;   ///< the largest |q|: 32767, less where the weights are large
  std::vector<std::int16_t> q;  ///< [n][cols]
  std::vector<float> d;         ///< [n][cols / 32]: the scale of each block
  std::vector<float> s;         ///< [n][cols / 32]: d * (sum of the block's q)
  /// Sizes the buffers for n rows of cols (a multiple of 32) against weights whose integers
  /// are at most `bound` (tile_weight_bound), so that a block's sum fits int32.
  void size(std::int32_t n, std::int32_t cols, std::int32_t bound);
  /// size(n, cols, bound), then quantizes all of x ([n][cols]).
  void quantize(const float* x, std::int32_t n, std::int32_t cols, std::int32_t bound);
  /// Quantizes rows [i0, i1) of x into the sized buffers (lanes split the rows).
  void quantize_rows(const float* x, std::int32_t i0, std::int32_t i1);
};

/// Whether products of many rows with w's type run on the int16 tiles (Q4_0, Q4_1, Q5_0,
/// Q8_0, Q4_K, Q6_K, unless use_integer_kernels(false)). Not where the tiles would run their
/// portable loops: dequantized fp32 panels are faster than those.
[[nodiscard]] bool has_tile_kernel(ggml_type t) noexcept;
/// The largest |integer| the tiles multiply for t (K-quants fold sub-block scales in).
[[nodiscard]] std::int32_t tile_weight_bound(ggml_type t) noexcept;
/// The tiles' instruction set in use: "avx512-vnni", "avx2" or "portable".
[[nodiscard]] const char* tile_kernel_isa() noexcept;
/// The tiles' instruction sets this build has, best first.
[[nodiscard]] std::vector<std::string> tile_kernel_isas();
/// Makes the tiles use `isa` (one of tile_kernel_isas()) for the whole process; tests and
/// benchmarks compare them. False, and nothing changes, when the build lacks it.
bool select_tile_kernel_isa(const std::string& isa) noexcept;
/// Whether the tiles' panels of Q4_0, Q4_1 and Q8_0 are unpacked sixteen rows at a time in
/// vector registers (AVX-512 or AVX2; on by default) or row by row as the other types are: the
/// panels, and so every product, are the same bits either way (tests compare them).
void use_vectorized_panels(bool on) noexcept;
/// y[i][r] = dot(x[i], w[r]) for i < x.n and r in [r0, r1) on the int16 tiles: the rows'
/// blocks unpacked to int16 panels of at most 512 KiB (per thread), multiplied with VPDPWSSD
/// in register tiles of 4 x 48 (AVX-512 VNNI) or VPMADDWD in tiles of 3 x 16 (AVX2), each
/// block's sum scaled by both scales in fp32.
void tile_matmul_rows(const qmatrix& w, const q16_activations& x, float* y, std::int32_t ldy,
                      std::int32_t r0, std::int32_t r1);

/// Activations for the AMX tiles: each row as bf16 hi and lo (x - hi, rounded), laid out
/// [hi | lo]. Rows are padded with zeros to a multiple of 32 (two tiles).
struct bf16_activations {
  /// 32 bf16, one cache line: tile rows that straddle two lines slow the products
  /// (relokv_amx_rates).
  struct alignas(64) line {
    std::uint16_t v[32];
  };
  std::int32_t n = 0, cols = 0, padded = 0;
  std::vector<line> lines;  ///< [padded][2 * cols] bf16
  /// The buffer as one array of bf16 (not line by line: offsets cross lines).
  [[nodiscard]] const std::uint16_t* data() const noexcept {
    return reinterpret_cast<const std::uint16_t*>(lines.data());
  }
  [[nodiscard]] std::uint16_t* data() noexcept {
    return reinterpret_cast<std::uint16_t*>(lines.data());
  }
  /// Sizes the buffer for n rows of cols (a multiple of 32), the padding zeroed.
  /// @throws std::logic_error when cols is not a multiple of 32
  void size(std::int32_t n, std::int32_t cols);
  /// Converts rows [i0, i1) of x ([n][cols] fp32) into the sized buffer (lanes split the rows).
  void convert_rows(const float* x, std::int32_t i0, std::int32_t i1);
};

/// Whether this build and host run the AMX tiles (AMX-BF16, granted by the kernel) and
/// neither use_amx_tiles(false) nor use_integer_kernels(false) turned them off.
[[nodiscard]] bool has_amx_tiles() noexcept;
/// Turns the AMX tiles off (false) or back on for the whole process (benchmarks compare them
/// with the int16 tiles). Set it before any product runs.
void use_amx_tiles(bool on) noexcept;
/// y[i][r] = dot(x[i], w[r]) for i < x.n and r in [r0, r1) on AMX: the rows dequantized and
/// split into bf16 hi + lo panels of at most 1 MiB (per thread), three TDPBF16PS products a
/// step (Xhi Whi + Xlo Whi + Xhi Wlo) accumulated in fp32, in blocks of 32 x 32 outputs.
/// Without AMX the same arithmetic runs in plain loops (slow; the tiles' reference).
void amx_matmul_rows(const qmatrix& w, const bf16_activations& x, float* y, std::int32_t ldy,
                     std::int32_t r0, std::int32_t r1);

/// y[i][r] = dot(x[i], w[r]) for i < n and r in [r0, r1), y's rows `ldy` floats apart.
/// With `xq` (x quantized by q8_activations::quantize) and integer_product(w, n): the integer
/// kernels. Otherwise x in fp32: dequantized panels and sgemm_nt, for every n (batch-invariant:
/// a row's outputs do not depend on n).
void qmatmul_rows(const qmatrix& w, const float* x, const q8_activations* xq, std::int32_t n,
                  float* y, std::int32_t ldy, std::int32_t r0, std::int32_t r1);

/// One row's dot product with quantized activations row i, by the portable reference loops
/// (what the fast kernels are tested against).
[[nodiscard]] float qdot_portable(const qmatrix& w, std::int32_t r, const q8_activations& xq,
                                  std::int32_t i);
/// The same with fp32 activations x (cols floats): the row dequantized, then sgemm_dot, the
/// sum every fp32 product computes (bit for bit what qmatmul_rows gives without xq).
[[nodiscard]] float qdot_fp32_portable(const qmatrix& w, std::int32_t r, const float* x);

}  // namespace relokv_engine
