// The writer and reader of relokv_rag's store mode (see store_mode.hpp).
#include "store_mode.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <relokv/layout/builder.hpp>

namespace relokv_rag {
namespace {

using clock_type = std::chrono::steady_clock;

relokv::request_layout span_layout(const workload& w, const qa_request& r) {
  relokv::layout_builder b(16);
  b.prefix(w.prefix);
  for (std::size_t p : r.passages) b.span(w.corpus[p].tokens);
  return b.question(r.question_tokens).build();
}

/// The store a URL names. `memory:` is one store for the whole process, so that the writer
/// and the reader of `--role both` share it (each URL opened anew would be a store of its own,
/// and the reader would find nothing).
relokv::any_store open_store(const store_mode_options& opt) {
  if (opt.url != "memory:") return relokv::any_store::from_url(opt.url, opt.seal);
  static const relokv::memory_store shared;  // copies share its entries
  if (!opt.seal.enabled()) return relokv::any_store(shared, opt.url);
  return relokv::any_store(relokv::sealed_store<relokv::memory_store>(shared, opt.seal.load()),
                           opt.url + " (sealed)");
}

template <class P>
writer_report writer_with(std::shared_ptr<const relokv_engine::llama_model> model,
                          const workload& w, const store_mode_options& opt) {
  relokv_engine::llama_engine<P> eng(model, opt.num_blocks, 16, open_store(opt));
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
  return out;
}

template <class P>
reader_report reader_with(std::shared_ptr<const relokv_engine::llama_model> model,
                          const workload& w, const text_codec& codec,
                          const std::vector<variant>& variants, const store_mode_options& opt) {
  relokv_engine::llama_engine<P> full(model, opt.num_blocks);
  relokv_engine::llama_engine<P> eng(model, opt.num_blocks, 16, open_store(opt));
  const relokv::token_t stop = codec.tok ? codec.tok->id("<|im_end|>") : -1;
  reader_report rep;
  rep.rows.resize(variants.size());
  for (std::size_t v = 0; v < variants.size(); ++v) rep.rows[v].name = variants[v].name;
  for (const qa_request& r : w.requests) {
    const auto layout = span_layout(w, r);
    std::vector<float> ref_logits;
    std::vector<relokv::token_t> ref_answer;
    for (std::size_t v = 0; v < variants.size(); ++v) {
      auto& e = v == 0 ? full : eng;
      relokv_engine::prefill_stats st;
      const auto t0 = clock_type::now();
      auto logits = e.prefill(layout, variants[v].strategy, &st);
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
  return rep;
}

template <class F>
auto by_placement(const std::string& placement, F&& f) {
  if (placement == "pre_rotated") return f(relokv::pre_rotated{});
  if (placement == "at_attention") return f(relokv::at_attention{});
  if (placement == "block_relative") return f(relokv::block_relative{});
  throw std::invalid_argument("unknown placement '" + placement +
                              "' (pre_rotated, at_attention or block_relative)");
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

}  // namespace

writer_report run_writer(std::shared_ptr<const relokv_engine::llama_model> model, const workload& w,
                         const store_mode_options& opt) {
  return by_placement(opt.placement,
                      [&](auto p) { return writer_with<decltype(p)>(model, w, opt); });
}

reader_report run_reader(std::shared_ptr<const relokv_engine::llama_model> model, const workload& w,
                         const text_codec& codec, const std::vector<variant>& variants,
                         const store_mode_options& opt) {
  if (opt.max_answer < 1)
    throw std::invalid_argument("max_answer must be at least 1 (got " +
                                std::to_string(opt.max_answer) + ")");
  if (variants.empty()) throw std::invalid_argument("run_reader needs the reference variant");
  return by_placement(opt.placement, [&](auto p) {
    return reader_with<decltype(p)>(model, w, codec, variants, opt);
  });
}

void print_reader(const reader_report& r, const std::string& url) {
  std::printf(", empty pool, spans from %s:\n", url.c_str());
  std::printf("%-28s %9s %8s  %-24s %13s %7s\n", "variant", "TTFT p50", "speedup",
              "blocks pool/store/comp", "first-tok KL", "agree%");
  const double base = percentile(r.rows[0].ttft_ms, 50);
  for (const reader_row& row : r.rows) {
    const double p50 = percentile(row.ttft_ms, 50);
    char blocks[64];
    std::snprintf(blocks, sizeof blocks, "%lld/%lld/%lld", static_cast<long long>(row.pool),
                  static_cast<long long>(row.store), static_cast<long long>(row.computed));
    std::printf("%-28s %7.1fms %7.1fx  %-24s %13.3f %7.1f\n", row.name.c_str(), p50,
                base / std::max(p50, 1e-9), blocks, mean(row.kl), 100 * mean(row.agreement));
  }
  const auto& s = r.stats;
  std::printf(
      "store: %lld lookups, %lld hits, %lld misses, %lld rejected (checksum %lld, fingerprint "
      "%lld, identity %lld, malformed %lld, provenance %lld), %lld not opened, %lld unavailable "
      "calls, %lld reconnects; %.1f MiB fetched\n",
      static_cast<long long>(s.store_lookups), static_cast<long long>(s.store_hits),
      static_cast<long long>(s.store_misses), static_cast<long long>(s.store_rejected_total()),
      static_cast<long long>(s.store_rejected[static_cast<int>(relokv::block_check::kChecksum)]),
      static_cast<long long>(s.store_rejected[static_cast<int>(relokv::block_check::kFingerprint)]),
      static_cast<long long>(s.store_rejected[static_cast<int>(relokv::block_check::kIdentity)]),
      static_cast<long long>(s.store_rejected[static_cast<int>(relokv::block_check::kMalformed)]),
      static_cast<long long>(s.store_rejected[static_cast<int>(relokv::block_check::kProvenance)]),
      static_cast<long long>(r.counters.open_failures), static_cast<long long>(s.store_unavailable),
      static_cast<long long>(r.counters.reconnects), double(s.store_bytes_read) / (1 << 20));
}

}  // namespace relokv_rag
