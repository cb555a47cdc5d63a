// The writer and reader of relokv_rag's store mode (see store_mode.hpp).
#include "store_mode.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <relokv/layout/builder.hpp>

#include "store_loop.hpp"

namespace relokv_rag {
namespace detail {

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

#ifndef RELOKV_RAG_LLAMA_CPP
writer_report run_writer_llama_cpp(const workload&, const store_mode_options&) {
  throw std::invalid_argument("engine llama.cpp: this build has no llama.cpp");
}
reader_report run_reader_llama_cpp(const workload&, const text_codec&, const std::vector<variant>&,
                                   const store_mode_options&) {
  throw std::invalid_argument("engine llama.cpp: this build has no llama.cpp");
}
#endif

}  // namespace detail

namespace {

template <class P>
writer_report writer_with(std::shared_ptr<const relokv_engine::llama_model> model,
                          const workload& w, const store_mode_options& opt) {
  relokv_engine::llama_engine<P> eng(model, opt.num_blocks, 16, detail::open_store(opt));
  return detail::writer_on(eng, w);
}

template <class P>
reader_report reader_with(std::shared_ptr<const relokv_engine::llama_model> model,
                          const workload& w, const text_codec& codec,
                          const std::vector<variant>& variants, const store_mode_options& opt) {
  relokv_engine::llama_engine<P> full(model, opt.num_blocks);
  relokv_engine::llama_engine<P> eng(model, opt.num_blocks, 16, detail::open_store(opt));
  return detail::reader_on(full, eng, w, codec, variants, opt);
}

template <class F>
auto by_placement(const std::string& placement, F&& f) {
  if (placement == "pre_rotated") return f(relokv::pre_rotated{});
  if (placement == "at_attention") return f(relokv::at_attention{});
  if (placement == "block_relative") return f(relokv::block_relative{});
  throw std::invalid_argument("unknown placement '" + placement +
                              "' (pre_rotated, at_attention or block_relative)");
}

}  // namespace

writer_report run_writer(std::shared_ptr<const relokv_engine::llama_model> model, const workload& w,
                         const store_mode_options& opt) {
  if (opt.engine == "llama.cpp") return detail::run_writer_llama_cpp(w, opt);
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
  if (opt.engine == "llama.cpp") return detail::run_reader_llama_cpp(w, codec, variants, opt);
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
  print_nodes("read", r.nodes);
}

void print_nodes(const char* what, const std::vector<relokv::store_node_stats>& nodes) {
  if (nodes.empty()) return;
  std::printf("blocks %s per node:", what);
  const bool read = std::string(what) == "read";
  for (const relokv::store_node_stats& n : nodes) {
    const std::int64_t count = read ? n.keys_read : n.keys_written;
    if (!n.master && count == 0 && n.failures == 0) continue;  // an idle replica
    std::printf(
        " %s %lld (%s%s)", n.name.c_str(), static_cast<long long>(count),
        n.master ? "master" : "replica",
        n.failures > 0 ? (", " + std::to_string(n.failures) + " failed calls").c_str() : "");
  }
  std::printf("\n");
}

}  // namespace relokv_rag
