#pragma once
// relokv_rag --layer-deviation PREFIX: where a reused span's keys and values differ from full
// recompute, layer by layer, by the layer's kind (windowed or global) and by the token's
// offset in its span. A sliding window changes what relocation means: in a windowed layer a
// span token at offset >= W - 1 sees only its own span, so its K/V there can differ from a
// fresh computation only through the global layers below it. This measures it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llama_engine.hpp"
#include "rag.hpp"

namespace relokv_rag {

/// One layer's deviations of reused span tokens from full recompute (cosine distance of K and
/// V, summed over the KV heads, as KVBoost's check measures it).
struct layer_deviation {
  std::int32_t layer = 0;
  bool windowed = false;
  /// Mean deviation of tokens whose offset in their span is below window - 1 (their window
  /// reaches before the span: the span's seam in a windowed layer) and at or above it.
  double seam = 0, beyond = 0;
  std::int64_t n_seam = 0, n_beyond = 0;
};

struct deviation_study {
  std::string model;
  std::int32_t window = 0;  ///< the model's sliding window (512 used for the offsets if none)
  /// Short spans (one per passage) and long ones (the first passage, then the others joined).
  std::vector<layer_deviation> short_spans, long_spans;
  std::size_t requests = 0;
};

/// Runs the study on the first `requests` questions of `w`: each question's spans are cached
/// behind the system prompt, then read after the other spans (relocated), with a dynamic
/// strategy that measures every reused token at one layer, for each layer in turn.
deviation_study run_deviation_study(std::shared_ptr<const relokv_engine::llama_model> model,
                                    const workload& w, std::size_t requests,
                                    const std::string& model_name);

/// PREFIX.md and PREFIX.json.
void write_deviation_study(const std::string& prefix, const deviation_study& s);

}  // namespace relokv_rag
