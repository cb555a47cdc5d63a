#pragma once
// The AVX-512 VNNI "paired" decode kernels of the example engine (qgemm_paired.cpp): Q4_1, Q8_0
// and Q5_0 rows against int8 activations laid out as the weights lie, for hosts with
// AVX512_VBMI (Ice Lake and later, Zen 4). qgemm.cpp decides when they run; elsewhere these
// declarations are compiled out and the block kernels (qgemm_blocks.hpp) serve.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "qgemm.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define RELOKV_ENGINE_VNNI 1
#else
#define RELOKV_ENGINE_VNNI 0
#endif
// Q5_0's AVX-512 kernel also spreads bits with VPSHUFBITQMB and gathers bytes with VPERMT2B.
// The paired kernels gather bytes with VPERMT2B (AVX512_VBMI: Ice Lake and later, Zen 4; not
// Cascade Lake, whose VNNI serves the 256-bit block kernels).
#if RELOKV_ENGINE_VNNI && defined(__AVX512VBMI__)
#define RELOKV_ENGINE_PAIRED 1
#else
#define RELOKV_ENGINE_PAIRED 0
#endif
#if RELOKV_ENGINE_PAIRED && defined(__AVX512BITALG__)
#define RELOKV_ENGINE_Q5_0 1
#else
#define RELOKV_ENGINE_Q5_0 0
#endif
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace relokv_engine::detail {

#if RELOKV_ENGINE_PAIRED
/// Rows at most this long (bytes) are multiplied four at a time in decode.
inline constexpr std::size_t kInterleavedRowBytes = 640;
/// Whether w's type has a paired kernel.
[[nodiscard]] bool has_paired_kernel(ggml_type t) noexcept;
/// W weight rows against R activation rows from row i0 of xq; out gets W * R sums (row-major
/// by activation row). Instantiated for <4, 1>, <1, 4> and <1, 1>.
template <int W, int R>
void paired_rows(ggml_type t, const std::uint8_t* const* w, int nb, const q8_activations& xq,
                 int i0, float* out);
/// The activations in Q4_1's and Q5_0's kernel orders (q8_activations::quantize keeps them).
void q4_1_order(const std::vector<std::int8_t>& q, std::int32_t rows, std::int32_t width,
                std::vector<std::int8_t>& out, std::size_t& stride);
void q5_0_order(const std::vector<std::int8_t>& q, std::int32_t rows, std::int32_t width,
                std::vector<std::int8_t>& out);
#endif

}  // namespace relokv_engine::detail
