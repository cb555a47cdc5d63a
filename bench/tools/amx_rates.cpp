// What one core's AMX-BF16 unit sustains for the 2 x 2 tile blocking the engine's products use
// (four C tiles, two A and two B tiles a step, four TDPBF16PS), by where the operands sit and
// when they are loaded (bench/results/engine-2026-12-02.md). ./build/bench/relokv_amx_rates
// Every buffer is written first: untouched pages all map the kernel's one zero page, which
// makes any "large" buffer an L1-resident one.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <relokv/attention/detail/amx_bf16.hpp>

#if RELOKV_HOST_AMX
namespace {

struct buffers {
  std::uint16_t* a;
  std::uint16_t* b;
  buffers(std::size_t bytes)
      : a(static_cast<std::uint16_t*>(std::aligned_alloc(4096, bytes))),
        b(static_cast<std::uint16_t*>(std::aligned_alloc(4096, bytes))) {
    for (std::size_t i = 0; i < bytes / 2; ++i) a[i] = b[i] = 0x3F80;  // bf16 1.0
  }
  ~buffers() {
    std::free(a);
    std::free(b);
  }
  buffers(const buffers&) = delete;
  buffers& operator=(const buffers&) = delete;
};

constexpr long kSteps = 1'000'000;

// GMAC/s of kSteps steps, A cycling through na KiB and B through nb KiB (2 KiB a step each);
// loads after each operand's last product (the engine's order) or all four first; A's rows
// misalign elements off their cache lines.
double rate(const buffers& m, std::size_t na, std::size_t nb, bool loads_first,
            std::size_t misalign = 0) {
  const std::size_t sa = na / 2, sb = nb / 2;  // steps before each wraps
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, m.a, 64);
  _tile_loadd(5, m.a + 512, 64);
  _tile_loadd(6, m.b, 64);
  _tile_loadd(7, m.b + 512, 64);
  const auto t0 = std::chrono::steady_clock::now();
  for (long k = 0; k < kSteps; ++k) {
    const std::uint16_t* a = m.a + misalign + (static_cast<std::size_t>(k + 1) % sa) * 1024;
    const std::uint16_t* b = m.b + (static_cast<std::size_t>(k + 1) % sb) * 1024;
    if (loads_first) {
      _tile_loadd(4, a, 64);
      _tile_loadd(5, a + 512, 64);
      _tile_loadd(6, b, 64);
      _tile_loadd(7, b + 512, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    } else {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(4, a, 64);
      _tile_dpbf16ps(2, 5, 6);
      _tile_loadd(6, b, 64);
      _tile_dpbf16ps(3, 5, 7);
      _tile_loadd(5, a + 512, 64);
      _tile_loadd(7, b + 512, 64);
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 4.0 * kSteps * 16 * 16 * 32 / s / 1e9;
}

double peak() {
  const auto t0 = std::chrono::steady_clock::now();
  for (long k = 0; k < kSteps; ++k) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 4.0 * kSteps * 16 * 16 * 32 / s / 1e9;
}

}  // namespace

int main() {
  if (!relokv::detail::amx::enabled()) {
    std::printf("amx: not granted on this host\n");
    return 0;
  }
  relokv::detail::amx::configure();
  const buffers m(std::size_t{16} << 20);
  const double top = peak();
  std::printf("amx_peak_gmac_s %.0f\n", top);
  const struct {
    const char* name;
    std::size_t a, b;
    bool first;
    std::size_t misalign;  // bf16 elements: 8 puts every A row across two cache lines
  } cases[] = {
      {"l1_loads_first", 16, 16, true, 0},       {"l1_loads_after_use", 16, 16, false, 0},
      {"l1_a_rows_unaligned", 16, 16, false, 8}, {"a_l1_b_l2", 16, 512, false, 0},
      {"a_l2_b_l2", 128, 128, false, 0},         {"a_l2_b_l2_large", 512, 512, false, 0},
      {"a_l3_b_l2", 8192, 512, false, 0},
  };
  for (const auto& c : cases) {
    const double r = rate(m, c.a, c.b, c.first, c.misalign);
    std::printf("amx_%s_fraction %.2f\n", c.name, r / top);
  }
  _tile_release();
}
#else
int main() { std::printf("amx: not in this build (needs AMX-BF16 targets)\n"); }
#endif
