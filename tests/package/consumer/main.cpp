// A minimal relokv consumer: plans one request twice and checks the second is served from cache.
#include <relokv/relokv.hpp>

#include <cstdio>
#include <vector>

static_assert(RELOKV_VERSION_MAJOR == EXPECTED_MAJOR, "RELOKV_VERSION_MAJOR != CMake version");
static_assert(RELOKV_VERSION_MINOR == EXPECTED_MINOR, "RELOKV_VERSION_MINOR != CMake version");
static_assert(RELOKV_VERSION_PATCH == EXPECTED_PATCH, "RELOKV_VERSION_PATCH != CMake version");

int main() {
  relokv::relocatable_cache<> cache(relokv::lru_block_pool(64), 16);
  std::vector<relokv::token_t> sys(20, 7), doc(40, 9);
  const auto layout = relokv::layout_builder(16).prefix(sys).span(doc).build();
  auto first = cache.plan(layout);
  cache.commit(first.id);
  cache.release(first.id);
  auto second = cache.plan(layout);
  // 2 prefix blocks (16 + 4) and 3 span blocks (16 + 16 + 8; a span ends sealed): all exact.
  const bool ok = second.ok() && second.misses == 0 && second.exact_hits == 5;
  std::printf("relokv %d.%d.%d consumer: %s\n", RELOKV_VERSION_MAJOR, RELOKV_VERSION_MINOR,
              RELOKV_VERSION_PATCH, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
