// The layer-deviation study of relokv_rag (window_study.hpp).
#include "window_study.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/recompute/deviation_topk.hpp>

namespace relokv_rag {
namespace {

/// Every layer's deviations for one request laid out as prefix + spans + question, the spans
/// warmed alone behind the prefix first.
void measure(relokv_engine::llama_engine<relokv::block_relative>& eng,
             const std::vector<relokv::token_t>& prefix,
             const std::vector<std::vector<relokv::token_t>>& spans,
             const std::vector<relokv::token_t>& question, std::int32_t window,
             std::vector<layer_deviation>& rows) {
  for (const auto& s : spans) {
    (void)eng.prefill(relokv::layout_builder(16).prefix(prefix).span(s).build(),
                      relokv::recompute::none{});
    eng.end(true);
  }
  relokv::layout_builder b(16);
  b.prefix(prefix);
  for (const auto& s : spans) b.span(s);
  const auto layout = b.question(question).build();
  const auto& cfg = eng.model().cfg;
  for (std::int32_t l = 0; l < cfg.n_layers; ++l) {
    // Every reused token computed through layer l, its deviation measured there, all kept.
    const relokv::recompute::deviation_check check{l, 1.0f};
    const relokv::recompute::deviation_topk probe(std::span(&check, 1),
                                                  relokv::deviation_metric::kCosine);
    relokv_engine::prefill_stats st;
    (void)eng.prefill(layout, probe, &st);
    eng.end(false);
    layer_deviation& row = rows[static_cast<std::size_t>(l)];
    row.layer = l;
    row.windowed = cfg.windowed(l);
    // The spans after the first: relocated (the first sits where it was cached: exact hits).
    int span_index = 0;
    for (const relokv::segment& seg : layout.segments) {
      if (seg.kind != relokv::segment_kind::kSpan) continue;
      if (span_index++ == 0) continue;
      for (std::int32_t j = 0; j < seg.num_tokens; ++j) {
        const auto pos = static_cast<std::size_t>(seg.first_token + j);
        if (pos >= st.check_deviation.size()) continue;
        const double d = st.check_deviation[pos];
        if (j < window - 1) {
          row.seam += d;
          ++row.n_seam;
        } else {
          row.beyond += d;
          ++row.n_beyond;
        }
      }
    }
  }
}

void finish(std::vector<layer_deviation>& rows) {
  for (auto& r : rows) {
    if (r.n_seam > 0) r.seam /= static_cast<double>(r.n_seam);
    if (r.n_beyond > 0) r.beyond /= static_cast<double>(r.n_beyond);
  }
}

}  // namespace

deviation_study run_deviation_study(std::shared_ptr<const relokv_engine::llama_model> model,
                                    const workload& w, std::size_t requests,
                                    const std::string& model_name) {
  deviation_study s;
  s.model = model_name;
  s.window = model->cfg.sliding_window;
  const std::int32_t window = s.window > 0 ? s.window : 512;
  const auto L = static_cast<std::size_t>(model->cfg.n_layers);
  s.short_spans.resize(L);
  s.long_spans.resize(L);
  s.requests = std::min(requests, w.requests.size());
  for (std::size_t i = 0; i < s.requests; ++i) {
    const qa_request& r = w.requests[i];
    // Short: one span per passage. Long: the first passage, then every other passage joined
    // into one span read after it (relocated, over 1,000 tokens on the 2Wiki sample).
    std::vector<std::vector<relokv::token_t>> short_spans, long_spans(2);
    for (std::size_t k = 0; k < r.passages.size(); ++k) {
      const auto& t = w.corpus[r.passages[k]].tokens;
      short_spans.push_back(t);
      auto& joined = long_spans[k == 0 ? 0 : 1];
      joined.insert(joined.end(), t.begin(), t.end());
    }
    // A fresh engine per layout: nothing cached but what the layout's warm-up computes.
    {
      relokv_engine::llama_engine<relokv::block_relative> eng(model, 1024);
      measure(eng, w.prefix, short_spans, r.question_tokens, window, s.short_spans);
    }
    {
      relokv_engine::llama_engine<relokv::block_relative> eng(model, 1024);
      measure(eng, w.prefix, long_spans, r.question_tokens, window, s.long_spans);
    }
    std::fprintf(stderr, "\rlayer deviation: %zu/%zu questions", i + 1, s.requests);
  }
  std::fprintf(stderr, "\n");
  finish(s.short_spans);
  finish(s.long_spans);
  return s;
}

void write_deviation_study(const std::string& prefix, const deviation_study& s) {
  nlohmann::json j;
  j["model"] = s.model;
  j["window"] = s.window;
  j["requests"] = s.requests;
  const auto rows_json = [](const std::vector<layer_deviation>& rows) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& r : rows)
      a.push_back({{"layer", r.layer},
                   {"windowed", r.windowed},
                   {"seam", r.seam},
                   {"beyond", r.beyond},
                   {"n_seam", r.n_seam},
                   {"n_beyond", r.n_beyond}});
    return a;
  };
  j["short_spans"] = rows_json(s.short_spans);
  j["long_spans"] = rows_json(s.long_spans);
  std::ofstream(prefix + ".json") << j.dump(2) << "\n";
  std::ofstream md(prefix + ".md");
  if (!md) throw std::runtime_error(prefix + ".md: cannot write");
  const std::int32_t w = s.window > 0 ? s.window : 512;
  md << "# Reused spans' K/V against full recompute, layer by layer: " << s.model << "\n\n"
     << s.requests << " questions. Mean cosine distance of a relocated span token's K and V "
     << "(summed over KV heads) from full recompute's, measured at each layer with every "
     << "earlier layer recomputed. \"seam\": tokens at offsets below " << w - 1
     << " in their span (a window of " << w << " reaches before the span); \"beyond\": the rest. "
     << (s.window > 0 ? "Windowed layers marked W." : "The model has no windowed layer.")
     << "\n\n| layer | kind | short spans: seam | long spans: seam | long spans: beyond |\n"
     << "|---:|---|---:|---:|---:|\n";
  char buf[256];
  for (std::size_t l = 0; l < s.long_spans.size(); ++l) {
    const auto& a = s.short_spans[l];
    const auto& b = s.long_spans[l];
    std::snprintf(buf, sizeof buf, "| %d | %s | %.4f | %.4f | %.4f |\n", b.layer,
                  b.windowed ? "W" : "global", a.seam, b.seam, b.beyond);
    md << buf;
  }
  md << "\nTokens: short spans " << (s.short_spans.empty() ? 0 : s.short_spans[0].n_seam)
     << " (seam) + " << (s.short_spans.empty() ? 0 : s.short_spans[0].n_beyond)
     << " (beyond); long spans " << (s.long_spans.empty() ? 0 : s.long_spans[0].n_seam)
     << " (seam) + " << (s.long_spans.empty() ? 0 : s.long_spans[0].n_beyond) << " (beyond).\n";
}

}  // namespace relokv_rag
