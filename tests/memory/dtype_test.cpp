#include <relokv/dtype.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "support/catch.hpp"

TEST_CASE("fp16: every half converts to float and back unchanged", "[dtype]") {
  int mismatches = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const relokv::fp16 x{static_cast<std::uint16_t>(h)};
    const float f = x.to_float();
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (nan) {
      mismatches += std::isnan(f) ? 0 : 1;
      continue;
    }
    mismatches += relokv::fp16::from_float(f).bits == h ? 0 : 1;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp16: closed-form values and rounding", "[dtype]") {
  CHECK(relokv::fp16{0x3c00}.to_float() == 1.0f);
  CHECK(relokv::fp16{0xc000}.to_float() == -2.0f);
  CHECK(relokv::fp16{0x0001}.to_float() == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(relokv::fp16{0x7bff}.to_float() == 65504.0f);
  CHECK(std::isinf(relokv::fp16{0x7c00}.to_float()));
  CHECK(relokv::fp16::from_float(1e6f).bits == 0x7c00);
  CHECK(relokv::fp16::from_float(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // tie to even
  CHECK(relokv::fp16::from_float(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);
  CHECK(relokv::fp16::from_float(std::ldexp(1.0f, -26)).bits == 0);
  CHECK(relokv::fp16::from_float(-0.0f).bits == 0x8000);
}

TEST_CASE("bf16: rounding to nearest even, NaN preserved", "[dtype]") {
  CHECK(relokv::bf16::from_float(1.0f).bits == 0x3f80);
  CHECK(relokv::bf16{0x3f80}.to_float() == 1.0f);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0)
  CHECK(relokv::bf16::from_float(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);
  CHECK(relokv::bf16::from_float(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);
  CHECK(std::isnan(relokv::bf16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  for (float f : {0.1f, -3.7f, 1234.5f, 1e-20f}) {
    const float r = relokv::bf16::from_float(f).to_float();
    CHECK(std::fabs(r - f) <= std::fabs(f) * std::ldexp(1.0f, -8));
  }
}
