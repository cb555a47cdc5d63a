#pragma once
// The store mode's writer and reader loops over any engine with llama_engine's request
// interface (relokv's engine, relokv inside llama.cpp). Internal to relokv_rag.
#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include <relokv/layout/builder.hpp>
#include <relokv/recompute/none.hpp>

#include "store_mode.hpp"

namespace relokv_rag::detail {

using clock_type = std::chrono::steady_clock;

inline relokv::request_layout span_layout(const workload& w, const qa_request& r) {
  relokv::layout_builder b(16);
  b.prefix(w.prefix);
  for (std::size_t p : r.passages) b.span(w.corpus[p].tokens);
  return b.question(r.question_tokens).build();
}

/// The same prompt as one prefix (the variants without spans: full recompute, prefix caching).
inline relokv::request_layout flat_layout(const workload& w, const qa_request& r) {
  std::vector<relokv::token_t> all(w.prefix);
  for (std::size_t p : r.passages)
    all.insert(all.end(), w.corpus[p].tokens.begin(), w.corpus[p].tokens.end());
  all.insert(all.end(), r.question_tokens.begin(), r.question_tokens.end());
  return relokv::layout_builder(16).prefix(all).build();
}

/// The store a URL names. `memory:` is one store for the whole process, so that the writer
/// and the reader of `--role both` share it (each URL opened anew would be a store of its own,
/// and the reader would find nothing).
relokv::any_store open_store(const store_mode_options& opt);

/// The writer's loop on any engine with llama_engine's request interface and a store.
template <class E>
writer_report writer_on(E& eng, const workload& w) {
  writer_report out;
  const auto t0 = clock_type::now();
  std::vector<bool> done(w.corpus.size(), false);
  for (const qa_request& r : w.requests)
    for (std::size_t p : r.passages) {
      if (done[p]) continue;
      done[p] = true;
      (void)eng.prefill(
          relokv::layout_builder(16).prefix(w.prefix).span(w.corpus[p].tokens).build(),
          relokv::recompute::none{});
      eng.end(true);  // commit: the new blocks are written to the store
      ++out.passages;
    }
  out.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  out.stats = eng.cache().stats();
  out.nodes = eng.cache().store().node_stats();
  return out;
}

/// The reader's loop: `full` (no store) gives the reference, `eng` (an empty pool over the
/// store) the other variants.
template <class E>
reader_report reader_on(E& full, E& eng, const workload& w, const text_codec& codec,
                        const std::vector<variant>& variants, const store_mode_options& opt) {
  const relokv::token_t stop = codec.tok ? codec.tok->end_of_turn() : -1;
  reader_report rep;
  rep.rows.resize(variants.size());
  for (std::size_t v = 0; v < variants.size(); ++v) rep.rows[v].name = variants[v].name;
  for (const qa_request& r : w.requests) {
    // Each variant on the layout its name says (run_engine.hpp does the same): spans, or the
    // whole prompt as one prefix (full recompute, prefix caching's exact keys).
    const auto spans = span_layout(w, r), flat = flat_layout(w, r);
    std::vector<float> ref_logits;
    std::vector<relokv::token_t> ref_answer;
    for (std::size_t v = 0; v < variants.size(); ++v) {
      auto& e = v == 0 ? full : eng;
      relokv_engine::prefill_stats st;
      const auto t0 = clock_type::now();
      auto logits = e.prefill(variants[v].spans ? spans : flat, variants[v].strategy, &st);
      relokv::token_t t = relokv_engine::argmax(logits);
      const auto t1 = clock_type::now();
      std::vector<relokv::token_t> answer;
      const auto first = logits;
      for (std::int32_t i = 0; i < opt.max_answer; ++i) {
        answer.push_back(t);
        if (t == stop || i + 1 == opt.max_answer) break;
        t = relokv_engine::argmax(e.decode(t));
      }
      e.end(false);  // nothing kept: the next question fetches its spans again
      reader_row& row = rep.rows[v];
      row.ttft_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      row.store += st.store_blocks;
      row.pool += st.pool_blocks;
      row.computed += st.computed_blocks;
      if (v == 0) {
        ref_logits = first;
        ref_answer = answer;
      }
      row.kl.push_back(kl_divergence(ref_logits, first));
      std::size_t same = 0;
      for (std::size_t i = 0; i < std::min(answer.size(), ref_answer.size()); ++i)
        same += answer[i] == ref_answer[i];
      row.agreement.push_back(double(same) /
                              double(std::max<std::size_t>({answer.size(), ref_answer.size(), 1})));
    }
  }
  rep.stats = eng.cache().stats();
  rep.counters = eng.cache().store().counters();
  rep.nodes = eng.cache().store().node_stats();
  return rep;
}

/// The store mode on relokv inside llama.cpp (rag_llama_cpp.cpp; without llama.cpp in the
/// build they throw std::invalid_argument saying how to build it).
writer_report run_writer_llama_cpp(const workload& w, const store_mode_options& opt);
reader_report run_reader_llama_cpp(const workload& w, const text_codec& codec,
                                   const std::vector<variant>& variants,
                                   const store_mode_options& opt);

}  // namespace relokv_rag::detail
