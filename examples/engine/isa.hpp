#pragma once
// The instruction-set cap of the reference engine. The engine is built for the host
// (-march=native) and picks its kernels at run time among those the build has; RELOKV_ISA
// caps that choice for the whole process, so that one host runs (and CI tests) every level
// below its own: the exactness tests run under each level the host can execute.
//
//   RELOKV_ISA=portable   scalar loops only
//   RELOKV_ISA=avx2       AVX2 kernels (x86-64-v3), no AVX-512, no AMX
//   RELOKV_ISA=avx512     AVX-512 (VNNI, VBMI...) where built, no AMX
//   RELOKV_ISA=amx        everything the build and host have (the default)
//
// What the cap does not reach: the header-only attention kernels are chosen when they are
// compiled (simd.hpp); their AVX2 and portable builds have their own test binaries
// (relokv_attention_avx2_test). The AMX attention tiles are switched off under a cap below amx.
#include <stdexcept>
#include <string>

namespace relokv_engine {

enum class isa_level : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

/// Parses a level's name ("portable", "avx2", "avx512", "amx").
/// @throws std::invalid_argument naming the accepted values
[[nodiscard]] isa_level parse_isa_level(const std::string& name);
/// The cap from RELOKV_ISA, read once (kAmx when unset, or when it names no level: the engine's
/// model loader refuses that, check_isa_env).
[[nodiscard]] isa_level isa_cap() noexcept;
/// @throws std::invalid_argument when RELOKV_ISA is set and names no level
void check_isa_env();
/// The level's name.
[[nodiscard]] const char* isa_name(isa_level l) noexcept;
/// Whether the engine itself was compiled for AVX-512 (its kernels' target, -march=native on
/// an AVX-512 host): a test asks the engine, not its own translation unit's flags.
[[nodiscard]] bool engine_built_with_avx512() noexcept;

}  // namespace relokv_engine
