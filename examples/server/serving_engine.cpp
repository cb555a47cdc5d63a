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
/// relokv inside llama.cpp: its engine is its own sequence_engine (one sequence at a time, its
/// prompt in steps); here what the server asks besides.
class llama_cpp_serving final : public serving_engine {
 public:
  llama_cpp_serving(const std::string& path, std::int32_t blocks, std::int32_t ctx,
                    relokv::any_store store,
                    std::shared_ptr<const relokv_engine::link_adapter> links)
      : eng_(path, options(blocks, ctx, std::move(store), std::move(links))) {}
  relokv_engine::sequence_engine& sequences() override { return eng_; }
  std::int32_t max_live() const override { return 1; }
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
  relokv_llama_cpp::engine<relokv::fp16> eng_;
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
