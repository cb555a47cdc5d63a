// The engine's instruction-set cap (see isa.hpp).
#include "isa.hpp"

#include <cstdlib>

namespace relokv_engine {

namespace {
constexpr const char* kNames[] = {"portable", "avx2", "avx512", "amx"};  // by isa_level
}  // namespace

isa_level parse_isa_level(const std::string& name) {
  for (int l = 0; l < 4; ++l)
    if (name == kNames[l]) return static_cast<isa_level>(l);
  throw std::invalid_argument("RELOKV_ISA: '" + name +
                              "' is not a level (portable, avx2, avx512 or amx)");
}

void check_isa_env() {
  const char* v = std::getenv("RELOKV_ISA");
  if (v != nullptr && *v != '\0') (void)parse_isa_level(v);
}

isa_level isa_cap() noexcept {
  static const isa_level cap = [] {
    try {
      const char* v = std::getenv("RELOKV_ISA");
      return v == nullptr || *v == '\0' ? isa_level::kAmx : parse_isa_level(v);
    } catch (const std::invalid_argument&) {
      return isa_level::kAmx;
    }
  }();
  return cap;
}

const char* isa_name(isa_level l) noexcept { return kNames[static_cast<int>(l)]; }

bool engine_built_with_avx512() noexcept {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

}  // namespace relokv_engine
