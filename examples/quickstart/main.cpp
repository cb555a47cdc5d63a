// relokv quickstart: a complete engine loop, host-only. Three documents are prefilled once;
// a second request reads them in another order, reuses their cached KV blocks at new
// positions, recomputes what the strategy asks, and decodes. Every attention output is
// checked against attention over freshly rotated keys.
//
// The "model" is a toy: a token's Q, K and V are fixed pseudo-random vectors of its id and the
// layer, the same in any context. A real model's K/V depend on the context (which is what the
// recompute strategies correct for); here reuse is exact, so the check can demand agreement to
// rounding. docs/integrating.md, "Writing an engine loop", is this program's core.
#include <relokv/relokv.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

namespace {

constexpr int kBlock = 16, kLayers = 2, kQHeads = 4, kKvHeads = 2, kHeadDim = 64;
constexpr int kQRow = kQHeads * kHeadDim, kKvRow = kKvHeads * kHeadDim;

// The toy model: component i of Q (which 0), K (1) or V (2) of token t in layer l.
float toy(relokv::token_t t, int l, int which, int i) {
  auto x = static_cast<std::uint32_t>(t) * 2654435761u ^
           static_cast<std::uint32_t>((l * 3 + which) * 40503 + i);
  x = (x ^ (x >> 15)) * 2246822519u;
  return static_cast<float>((x ^ (x >> 13)) % 2048) / 1024.0f - 1.0f;
}
std::vector<float> project(relokv::token_t t, int l, int which, int n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = toy(t, l, which, i);
  return v;
}

// The check: causal attention of a query at position m over every token of the request, keys
// rotated afresh at their positions in this request (no cache involved).
float reference_error(const relokv::rope_table& rope, const std::vector<relokv::token_t>& toks,
                      int l, relokv::pos_t m, const float* q, const float* out, float scale) {
  float err = 0.0f;
  for (int qh = 0; qh < kQHeads; ++qh) {
    std::vector<float> qr(q + qh * kHeadDim, q + (qh + 1) * kHeadDim), s, acc(kHeadDim, 0.0f);
    rope.rotate(qr.data(), m);
    for (relokv::pos_t p = 0; p <= m; ++p) {
      auto k = project(toks[static_cast<std::size_t>(p)], l, 1, kKvRow);
      float* kh = k.data() + qh / (kQHeads / kKvHeads) * kHeadDim;
      rope.rotate(kh, p);
      float d = 0.0f;
      for (int i = 0; i < kHeadDim; ++i) d += qr[static_cast<std::size_t>(i)] * kh[i];
      s.push_back(d * scale);
    }
    const float mx = *std::max_element(s.begin(), s.end());
    float sum = 0.0f;
    for (relokv::pos_t p = 0; p <= m; ++p) {
      const float w = std::exp(s[static_cast<std::size_t>(p)] - mx);
      sum += w;
      const auto v = project(toks[static_cast<std::size_t>(p)], l, 2, kKvRow);
      for (int i = 0; i < kHeadDim; ++i)
        acc[static_cast<std::size_t>(i)] +=
            w * v[static_cast<std::size_t>(qh / (kQHeads / kKvHeads) * kHeadDim + i)];
    }
    for (int i = 0; i < kHeadDim; ++i)
      err =
          std::max(err, std::abs(acc[static_cast<std::size_t>(i)] / sum - out[qh * kHeadDim + i]));
  }
  return err;
}

std::vector<relokv::token_t> tokens(relokv::token_t first, int n) {
  std::vector<relokv::token_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = first + i;
  return t;
}

using cache_type = relokv::relocatable_cache<relokv::xxh3_128, relokv::lru_block_pool,
                                             relokv::at_attention, relokv::recompute::any_strategy>;
float worst = 0.0f;  // largest difference from the reference, over every output

// --- the engine loop (docs/integrating.md, "Writing an engine loop")
// --------------------------------------- Runs one request: prefill through every layer, then
// `decode` decode steps.
void serve(cache_type& cache, relokv::host_kv_storage<float>& storage,
           const relokv::rope_table& rope, const relokv::request_layout& layout,
           const relokv::recompute::any_strategy& strategy, int decode) {
  auto plan = cache.plan(layout, strategy);
  if (!plan.ok()) return;  // out of blocks: a real scheduler waits or preempts, then retries
  std::printf("  %d exact, %d relocated, %d missed blocks; %d of %d tokens computed\n",
              plan.exact_hits, plan.relocated_hits, plan.misses, plan.tokens_to_compute,
              layout.num_tokens());
  // Applies the plan's fetches and copies; the cache's placement is named nowhere else.
  relokv::request_kv req(cache, storage, rope, layout, std::move(plan));
  std::vector<relokv::token_t> toks = layout.tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));

  // One forward step over `slots`: every layer writes the slots' K/V, then attends.
  auto step = [&](std::span<const relokv::token_slot> slots) {
    const auto n = static_cast<std::int32_t>(slots.size());
    std::vector<float> q, out(static_cast<std::size_t>(n) * kQRow);
    std::vector<relokv::pos_t> pos;
    for (int l = 0; l < kLayers; ++l) {
      q.clear();
      pos.clear();
      for (const relokv::token_slot& s : slots) {  // (position, block, slot) of each token
        const relokv::token_t t = toks[static_cast<std::size_t>(s.pos())];
        // A reused last token (s.writes() == false) is computed for its output, not written.
        req.write(l, s, project(t, l, 1, kKvRow).data(), project(t, l, 2, kKvRow).data());
        const auto qt = project(t, l, 0, kQRow);
        q.insert(q.end(), qt.begin(), qt.end());
        pos.push_back(s.pos());
      }
      req.attend(l, q.data(), pos.data(), n, kQHeads, scale, out.data());
      for (std::int32_t i = 0; i < n; ++i)  // an engine feeds `out` to its output projection
        worst =
            std::max(worst, reference_error(rope, toks, l, pos[static_cast<std::size_t>(i)],
                                            q.data() + i * kQRow, out.data() + i * kQRow, scale));
    }
  };
  step(req.prefill_tokens());  // prefill: the plan's tokens, plus the last one if reused
  req.commit();                // the prompt's blocks are reusable from here on
  for (int i = 0; i < decode; ++i) {
    const auto slot = req.append_token();  // extends the request when its last block is full
    if (!slot) break;                      // out of blocks: preempt or stop
    toks.push_back(7000 + i);              // a real engine samples this from the logits
    const relokv::token_slot one[1] = {*slot};
    step(one);
  }
  std::printf("  decoded %d tokens; the request spans %zu blocks\n", decode, req.blocks().size());
}  // ~request_kv releases the request: its blocks stay cached, evictable

}  // namespace

int main() {
  // XXH3-128 keys, an LRU pool of 64 blocks, RoPE applied at attention (keys stored unrotated:
  // a block is valid at any position), the recompute strategy chosen per request.
  cache_type cache(relokv::lru_block_pool(64), kBlock, relokv::xxh3_128(/*deployment seed=*/42));
  relokv::host_kv_storage<float> storage(
      relokv::kv_shape{kLayers, /*num_blocks=*/64, kKvHeads, kBlock, kHeadDim});
  relokv::rope_config rc;  // Llama-style NeoX RoPE over the whole head
  rc.head_dim = rc.rotary_dim = kHeadDim;
  const relokv::rope_table rope(rc, /*max_position=*/4096);

  const auto system = tokens(1000, 24), question = tokens(5000, 12);
  const auto doc_a = tokens(2000, 40), doc_b = tokens(3000, 33), doc_c = tokens(4000, 50);
  auto layout = [&](const auto& d1, const auto& d2, const auto& d3) {
    return relokv::layout_builder(kBlock)
        .prefix(system)
        .span(d1)
        .span(d2)
        .span(d3)
        .question(question)
        .build();
  };
  std::printf("request 1 (A B C), full prefill:\n");
  serve(cache, storage, rope, layout(doc_a, doc_b, doc_c), relokv::recompute::full{}, 4);
  std::printf("request 2 (C A B), EPIC (first 16 tokens of each span recomputed):\n");
  serve(cache, storage, rope, layout(doc_c, doc_a, doc_b), relokv::recompute::first_k(16), 20);
  std::printf("request 3 (B C A), naive reuse:\n");
  serve(cache, storage, rope, layout(doc_b, doc_c, doc_a), relokv::recompute::none{}, 3);

  // A malformed request gets an error that names the offset and the rule.
  relokv::marker_config m;
  m.separator = -2;
  m.vocab_size = 49152;
  m.block_size = kBlock;
  try {
    (void)relokv::parse_markers(std::vector<relokv::token_t>{1, 2, m.separator}, m);
  } catch (const relokv::layout_error& e) {
    std::printf("malformed request rejected: %s\n", e.what());
  }

  const bool reused = cache.stats().relocated_hits > 0;
  const bool ok = reused && worst < 1e-4f;
  std::printf("largest difference from attention over freshly rotated keys: %.2e\n", worst);
  std::printf("quickstart: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
