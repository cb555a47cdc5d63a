#pragma once
// relokv's Python extension (relokv._relokv): what its units share. Each unit binds one part:
// module.cpp the layouts, strategies and errors; cache.cpp the cache and its stores;
// engine.cpp the example engine and its tokenizer; rag.cpp the QA job.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <relokv/layout/request_layout.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/store/any_store.hpp>

#include "strategy_profile.hpp"

namespace relokv_py {

namespace nb = nanobind;

/// Token ids as the extension takes them: a 1-D array of int32 (any integer array converts).
using token_array = nb::ndarray<const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

/// A recompute strategy as Python names it: one of the named strategies (relokv_rag's and
/// relokv_server's table) or a kind with its budget.
struct strategy {
  std::string key;   ///< the named strategy's key, or the kind
  std::string name;  ///< what tables print
  std::string note;
  relokv_engine::strategy_spec spec;
  bool spans = true;  ///< false: the whole prompt is one prefix (exact prefix reuse only)
  relokv::recompute::any_strategy made;
};
/// The strategy `name` (a named one or a kind), with `k` / `ratio` overriding its budget.
/// @throws std::invalid_argument for an unknown name; relokv::error for a bad budget
strategy make_strategy(const std::string& name, std::int64_t k, double ratio);
/// A Python argument that is a Strategy (read in place, no copy) or a name (made here).
class strategy_ref {
 public:
  explicit strategy_ref(nb::handle h);
  const strategy& operator*() const noexcept { return *p_; }
  const strategy* operator->() const noexcept { return p_; }

 private:
  std::optional<strategy> own_;
  const strategy* p_ = nullptr;
};

/// A model named by scripts/get-model's name that is not fetched (relokv.ModelError).
struct model_missing : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Values moved into a numpy array that owns them (no copy).
template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), {heap->size()}, owner);
}

/// The store a Cache or an Engine was given (empty without a URL), sealed with the key a
/// variable or a file names. @throws relokv::error naming `who` for a seal key without a store,
/// and as relokv::any_store::from_url
relokv::any_store open_store(const std::optional<std::string>& url,
                             const std::optional<std::string>& seal_key_env,
                             const std::optional<std::string>& seal_key_file, const char* who);

/// A model argument: a GGUF path (it has a '/' or ends in .gguf) as it is, else the file
/// scripts/get-model fetched under that name. @throws model_missing when it is not fetched,
/// std::invalid_argument for an unknown name
std::string model_path_of(const std::string& model);

/// The KV pool's shape as the arrays show it: [layer, block, k|v, kv_head, slot, dim].
inline std::array<std::size_t, 6> pool_shape(const relokv::kv_shape& s) {
  return {static_cast<std::size_t>(s.num_layers),
          static_cast<std::size_t>(s.num_blocks),
          2,
          static_cast<std::size_t>(s.num_kv_heads),
          static_cast<std::size_t>(s.block_size),
          static_cast<std::size_t>(s.head_dim)};
}

/// Ids from a Python argument: a token_array or any sequence of ints.
std::vector<relokv::token_t> tokens_of(nb::handle h, const char* what);

void bind_cache(nb::module_& m);
void bind_engine(nb::module_& m);
void bind_rag(nb::module_& m);

}  // namespace relokv_py
