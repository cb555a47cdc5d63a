// relokv quickstart: a retrieval request whose documents come back in another order still
// reuses their cached KV blocks. Host-only; shows the public API as it stands.
#include <relokv/relokv.hpp>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

namespace {

std::vector<relokv::token_t> tokens(relokv::token_t first, int n) {
  std::vector<relokv::token_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = first + i;
  return t;
}

const char* name(relokv::block_status s) {
  switch (s) {
    case relokv::block_status::kExactHit:
      return "exact";
    case relokv::block_status::kRelocatedHit:
      return "relocated";
    case relokv::block_status::kMiss:
      return "miss";
  }
  return "?";
}

void show(const char* title, const relokv::reuse_plan& p) {
  std::printf("%s: %d exact, %d relocated, %d missed blocks; %d tokens to compute\n  ", title,
              p.exact_hits, p.relocated_hits, p.misses, p.tokens_to_compute);
  for (const auto& b : p.blocks)
    std::printf("[blk %d pos0 %d len %d %s] ", b.physical, b.pos0, b.len, name(b.status));
  std::printf("\n");
}

}  // namespace

int main() {
  constexpr int kBlock = 16;
  // One cache instance: XXH3-128 keys, an LRU pool of 256 blocks, RoPE applied at attention
  // (keys stored unrotated, so a block is valid at any position), and the recompute strategy
  // chosen per request at run time.
  using strategy = relokv::recompute::any_strategy;
  relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool, relokv::at_attention,
                            strategy>
      cache(relokv::lru_block_pool(256), kBlock, relokv::xxh3_128(/*deployment seed=*/42));

  const auto system = tokens(1000, 24);
  const auto doc_a = tokens(2000, 40), doc_b = tokens(3000, 33), doc_c = tokens(4000, 50);
  const auto question = tokens(5000, 12);

  // Request 1 (builder): system prompt, documents A B C, question.
  const auto r1 = relokv::layout_builder(kBlock)
                      .prefix(system)
                      .span(doc_a)
                      .span(doc_b)
                      .span(doc_c)
                      .question(question)
                      .build();
  auto p1 = cache.plan(r1);
  show("request 1 (A B C)", p1);
  cache.commit(p1.id);  // the engine computed the masked tokens; now they are reusable
  cache.release(p1.id);

  // Request 2 (marker tokens): the same documents in another order, C A B.
  relokv::marker_config m;
  m.separator = -2;  // marker ids the engine reserves
  m.dep_begin = -3;
  m.dep_end = -4;
  m.vocab_size = 49152;
  m.block_size = kBlock;
  std::vector<relokv::token_t> stream(system);
  for (const auto* doc : {&doc_c, &doc_a, &doc_b}) {
    stream.push_back(m.separator);
    stream.insert(stream.end(), doc->begin(), doc->end());
  }
  stream.push_back(m.dep_begin);
  stream.insert(stream.end(), question.begin(), question.end());
  stream.push_back(m.dep_end);
  const auto r2 = relokv::parse_markers(stream, m);
  auto p2 = cache.plan(r2);
  show("request 2 (C A B)", p2);

  // The same request under each PIC variant, served by the same cache at the same time.
  const std::pair<const char*, strategy> variants[] = {
      {"none (naive PIC)", relokv::recompute::none{}},
      {"first_k (EPIC, k=16)", relokv::recompute::first_k(16)},
      {"seam_window (KVBoost's selective part, R=16)", relokv::recompute::seam_window(16)},
      {"deviation_topk (CacheBlend, 15%)", relokv::recompute::deviation_topk(0.15f)},
      {"full (exact reference)", relokv::recompute::full{}}};
  for (const auto& [label, s] : variants) {
    auto p = cache.plan(r2, s);
    std::printf("  %-34s %3d tokens to compute, %zu blocks copied on write\n", label,
                p.tokens_to_compute, p.copies.size());
    if (s.dynamic()) {
      // Engine loop for a dynamic strategy: compute the masked tokens of a layer, measure
      // the deviation of their fresh K/V from the cached K/V, refine the mask for the next.
      const auto reused = p.reused_mask();
      auto mask = p.compute;
      for (int step = 0; step < s.steps(); ++step) {
        std::vector<float> deviation(mask.size());
        for (std::size_t t = 0; t < mask.size(); ++t)  // stand-in for token_deviation(...)
          deviation[t] = static_cast<float>((t * 7919) % 101);
        s.refine(step, deviation, reused, mask);
      }
      std::printf("  %-34s %3d tokens after refining at the check layer\n", "",
                  static_cast<int>(std::count(mask.begin(), mask.end(), 1)));
    }
    cache.release(p.id);
  }

  // A malformed request gets an error that names the offset and the rule.
  stream.push_back(m.separator);
  try {
    (void)relokv::parse_markers(stream, m);
  } catch (const relokv::layout_error& e) {
    std::printf("malformed request rejected: %s\n", e.what());
  }
  cache.release(p2.id);

  const bool reused = p2.relocated_hits > 0 && p2.exact_hits >= 2;
  std::printf("quickstart: %s\n", reused ? "ok" : "FAILED (no relocated reuse)");
  return reused ? 0 : 1;
}
