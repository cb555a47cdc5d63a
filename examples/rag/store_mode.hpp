#pragma once
// relokv_rag's store mode: two engine instances share spans through a store (Redis, a
// directory). The writer caches every question's passages and writes them; the reader, with an
// empty pool, answers the questions reusing them from the store at new positions.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/store/sealed_store.hpp>

#include "rag.hpp"

namespace relokv_rag {

struct store_mode_options {
  std::string url;            ///< memory:, file:DIR or redis://HOST[:PORT]
  relokv::seal_options seal;  ///< a key file or variable: blocks are sealed (sealed_store)
  std::string placement = "block_relative";
  std::int32_t num_blocks = 1024;
  std::int32_t max_answer = 16;
  std::string engine = "relokv";  ///< or "llama.cpp" (run_options::engine)
  std::string model_path;         ///< the GGUF llama.cpp loads
};

struct writer_report {
  std::size_t passages = 0;
  relokv::cache_stats stats;
  double seconds = 0;
  std::vector<relokv::store_node_stats> nodes;  ///< per server, for a Redis Cluster
};
/// Caches each request's passages (each on its own after the system prompt, as the QA run
/// does) and writes the blocks through to the store.
writer_report run_writer(std::shared_ptr<const relokv_engine::llama_model> model, const workload& w,
                         const store_mode_options& opt);

struct reader_row {
  std::string name;
  std::vector<double> ttft_ms, kl, agreement;
  std::int64_t pool = 0, store = 0, computed = 0;  ///< blocks by where their KV came from
};
struct reader_report {
  std::vector<reader_row> rows;  ///< rows[0]: full prefill (no cache, no store)
  relokv::cache_stats stats;     ///< the reuse engine's cache
  relokv::store_counters counters;
  std::vector<relokv::store_node_stats> nodes;  ///< per server, for a Redis Cluster
};
/// Answers every request with each variant: full prefill on an engine without store (the
/// reference), the others on one engine whose pool starts empty and keeps nothing between
/// questions (requests end uncommitted), so every span comes from the store.
reader_report run_reader(std::shared_ptr<const relokv_engine::llama_model> model, const workload& w,
                         const text_codec& codec, const std::vector<variant>& variants,
                         const store_mode_options& opt);

void print_reader(const reader_report& r, const std::string& url);
/// "blocks <what> per node: HOST:PORT N (master), ..." for a store spread over servers.
void print_nodes(const char* what, const std::vector<relokv::store_node_stats>& nodes);

}  // namespace relokv_rag
