// relokv_server's two engines behind serving_engine.hpp.
#include "serving_engine.hpp"

#include <stdexcept>
#include <utility>

#include <relokv/rope/block_relative.hpp>

#if RELOKV_SERVER_LLAMA_CPP
#include "llama_cpp_engine.hpp"  // relokv_llama_cpp::engine
#endif

namespace relokv_server {

namespace {

template <class Cache>
cache_snapshot snapshot_of(const Cache& cache) {
  cache_snapshot c;
  c.blocks_capacity = cache.allocator().capacity();
  c.blocks_in_use = cache.allocator().capacity() - cache.allocator().num_free();
  c.blocks_cached = cache.cached_blocks();
  c.stats = cache.stats();
  return c;
}

class relokv_serving final : public serving_engine {
 public:
  relokv_serving(std::shared_ptr<const relokv_engine::llama_model> m, std::int32_t blocks,
                 relokv::any_store store, std::int32_t bs, relokv::store_prefetcher pre)
      : eng_(std::move(m), blocks, bs, std::move(store)), block_size_(bs), pre_(std::move(pre)) {}
  std::unique_ptr<relokv::prefetch_ticket> prefetch(const relokv::request_layout& layout,
                                                    const relokv::recompute::any_strategy& strategy,
                                                    const relokv::extra_keys& extras,
                                                    std::uint64_t principal,
                                                    std::function<void()> on_ready) override {
    if (!pre_) return nullptr;
    eng_.cache().store_keys(layout, strategy, extras, keys_, principal);
    if (keys_.empty()) return nullptr;
    return pre_.prefetch(keys_, std::move(on_ready));
  }
  relokv_engine::sequence_engine& sequences() override { return eng_; }
  std::int32_t max_live() const override { return 1 << 20; }
  std::int32_t n_layers() const override { return eng_.model().cfg.n_layers; }
  cache_snapshot snapshot() const override {
    return snapshot_of(const_cast<relokv_serving*>(this)->eng_.cache());
  }
  std::int32_t block_size() const override { return block_size_; }
  std::string name() const override { return "relokv"; }

 private:
  relokv_engine::llama_engine<relokv::block_relative, relokv::bf16> eng_;
  std::int32_t block_size_;
  relokv::store_prefetcher pre_;
  std::vector<relokv::store_key> keys_;
};

#if RELOKV_SERVER_LLAMA_CPP
/// The adapter keeps one live request (a llama.cpp context's sequence 0 plus its load waves):
/// one sequence at a time, its prompt at once, decode one token a step. relokv inside llama.cpp
/// computes a whole prompt in one call, so its sequence calls are this adapter's.
class llama_cpp_serving final : public serving_engine, public relokv_engine::sequence_engine {
 public:
  llama_cpp_serving(const std::string& path, std::int32_t blocks, std::int32_t ctx,
                    relokv::any_store store,
                    std::shared_ptr<const relokv_engine::link_adapter> links)
      : eng_(path, options(blocks, ctx, std::move(store), std::move(links))) {}
  std::int32_t open(const relokv::request_layout& layout,
                    const relokv::recompute::any_strategy& strategy,
                    relokv_engine::prefill_stats* stats, const relokv::extra_keys& extras,
                    std::uint64_t principal) override {
    if (live_) throw relokv_engine::out_of_blocks("llama.cpp engine: one sequence at a time", 0);
    // The adapter plans and computes in one call: it runs here, and prefill_step hands over
    // the logits. Its own refusals (a strategy with a per-layer hook, too long) propagate.
    logits_ = eng_.prefill(layout, strategy, stats, extras, principal);
    live_ = true;
    pending_ = -1;
    return ++id_;
  }
  relokv_engine::sequence_engine& sequences() override { return *this; }
  void commit(seq_id) override {}  // one sequence at a time: nobody to share it with yet
  std::vector<float> prefill_step(std::int32_t s, std::int32_t,
                                  relokv_engine::prefill_stats*) override {
    check(s);
    return std::move(logits_);
  }
  bool append(std::int32_t s, relokv::token_t token) override {
    check(s);
    pending_ = token;
    return true;
  }
  std::vector<std::vector<float>> decode_step(std::span<const std::int32_t> seqs) override {
    std::vector<std::vector<float>> out;
    for (const std::int32_t s : seqs) {
      check(s);
      out.push_back(eng_.decode(pending_));
    }
    return out;
  }
  void close(std::int32_t s, bool commit) override {
    if (!live_ || s != id_) return;
    eng_.end(commit);
    live_ = false;
  }
  std::int32_t live() const noexcept override { return live_ ? 1 : 0; }
  std::int32_t max_live() const override { return 1; }
  std::int32_t n_layers() const override { return eng_.n_layers(); }
  cache_snapshot snapshot() const override {
    return snapshot_of(const_cast<llama_cpp_serving*>(this)->eng_.cache());
  }
  std::int32_t block_size() const override { return relokv_llama_cpp::engine_options{}.block_size; }
  std::string name() const override { return "llama.cpp"; }

 private:
  static relokv_llama_cpp::engine_options options(
      std::int32_t blocks, std::int32_t ctx, relokv::any_store store,
      std::shared_ptr<const relokv_engine::link_adapter> links) {
    relokv_llama_cpp::engine_options o;
    o.links = std::move(links);
    o.num_blocks = blocks;
    o.n_ctx = ctx;
    o.n_threads = 2;
    o.store = std::move(store);
    return o;
  }
  void check(std::int32_t s) const {
    if (!live_ || s != id_)
      throw std::logic_error("llama.cpp engine: no live sequence " + std::to_string(s));
  }
  relokv_llama_cpp::engine<relokv::fp16> eng_;
  std::vector<float> logits_;
  relokv::token_t pending_ = -1;
  std::int32_t id_ = 0;
  bool live_ = false;
};
#endif

}  // namespace

std::unique_ptr<serving_engine> make_relokv_engine(
    std::shared_ptr<const relokv_engine::llama_model> model, std::int32_t kv_blocks,
    relokv::any_store store, std::int32_t block_size, relokv::store_prefetcher prefetcher) {
  return std::make_unique<relokv_serving>(std::move(model), kv_blocks, std::move(store), block_size,
                                          std::move(prefetcher));
}

std::unique_ptr<serving_engine> make_llama_cpp_engine(
    const std::string& path, std::int32_t kv_blocks, std::int32_t ctx, relokv::any_store store,
    std::shared_ptr<const relokv_engine::link_adapter> links) {
#if RELOKV_SERVER_LLAMA_CPP
  return std::make_unique<llama_cpp_serving>(path, kv_blocks, ctx, std::move(store),
                                             std::move(links));
#else
  (void)path;
  (void)links;
  (void)kv_blocks;
  (void)ctx;
  (void)store;
  throw std::runtime_error(
      "this relokv_server was built without llama.cpp (./scripts/test --long builds it, or "
      "configure with -DRELOKV_WITH_LLAMA_CPP=ON)");
#endif
}

}  // namespace relokv_server
