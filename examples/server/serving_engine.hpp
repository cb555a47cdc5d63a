#pragma once
// What relokv_server's serving loop drives (its executor calls it): an engine with live
// sequences. Two are served: relokv's example engine (every strategy, many sequences batched)
// and relokv inside llama.cpp (--engine llama.cpp: static strategies, one sequence at a time;
// see docs/server.md).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <relokv/cache/cache_stats.hpp>
#include <relokv/layout/request_layout.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/store/any_store.hpp>
#include <relokv/store/prefetching_store.hpp>

#include "llama_engine.hpp"
#include "metrics.hpp"
#include "sequence.hpp"

namespace relokv_server {

/// What the serving loop needs of an engine beyond its sequence calls: those are the engine's
/// own (sequences(): relokv's engine and relokv inside llama.cpp are each their own
/// sequence_engine, both prefilling a prompt in steps), and here what a server asks besides.
class serving_engine {
 public:
  virtual ~serving_engine() = default;
  /// The engine's sequence calls (examples/engine/sequence.hpp); open() throws
  /// relokv_engine::out_of_blocks when the pool cannot hold the request now.
  [[nodiscard]] virtual relokv_engine::sequence_engine& sequences() = 0;
  /// Fetches, off the caller's thread, the store entries open(layout, strategy, ...) would read
  /// now; open() then finds them staged and never waits for the store. nullptr: nothing to
  /// fetch (no such store, or every block pooled). `on_ready` runs on the fetching thread once
  /// the ticket is ready (not when it is ready at return, nor after it is dropped).
  virtual std::unique_ptr<relokv::prefetch_ticket> prefetch(
      const relokv::request_layout& /*layout*/, const relokv::recompute::any_strategy& /*strategy*/,
      const relokv::extra_keys& /*extras*/, std::uint64_t /*principal*/,
      std::function<void()> /*on_ready*/) {
    return nullptr;
  }
  /// Sequences it can hold at once (the scheduler admits no more).
  [[nodiscard]] virtual std::int32_t max_live() const = 0;
  /// Tokens per KV block: the layouts the server builds break documents at its multiples.
  [[nodiscard]] virtual std::int32_t block_size() const = 0;
  /// The pool and cache counters for /metrics (running/prefilling/waiting left at 0).
  [[nodiscard]] virtual cache_snapshot snapshot() const = 0;
  [[nodiscard]] virtual std::string name() const = 0;
};

/// relokv's example engine: block_relative keys in bf16, every strategy. With `prefetcher`
/// (the handle of the prefetching_store `store` holds), prefetch() fetches a request's store
/// entries off the serving loop's thread.
std::unique_ptr<serving_engine> make_relokv_engine(
    std::shared_ptr<const relokv_engine::llama_model> model, std::int32_t kv_blocks,
    relokv::any_store store, std::int32_t block_size = 16,
    relokv::store_prefetcher prefetcher = {});

/// relokv inside llama.cpp on the GGUF at `path` (fp16 KV, placement pre_rotated), reading a
/// span-link adapter's rows when `links` is set, or a std::runtime_error saying this build has
/// no llama.cpp (scripts/test --long builds it).
std::unique_ptr<serving_engine> make_llama_cpp_engine(
    const std::string& path, std::int32_t kv_blocks, std::int32_t ctx, relokv::any_store store,
    std::shared_ptr<const relokv_engine::link_adapter> links = nullptr);

}  // namespace relokv_server
