// relokv.Cache: relocatable_cache with its policies chosen by name, its plans, its stores.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <relokv/cache/relocatable_cache.hpp>
#include <relokv/hash/xxh3.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/memory/lru_block_pool.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>
#include <relokv/store/any_store.hpp>

#include "bindings.hpp"

namespace relokv_py {
namespace {

using namespace nb::literals;

const char* status_name(relokv::block_status s) {
  switch (s) {
    case relokv::block_status::kMiss:
      return "miss";
    case relokv::block_status::kExactHit:
      return "exact";
    case relokv::block_status::kRelocatedHit:
      return "relocated";
  }
  return "?";
}
const char* tier_name(relokv::block_tier t) {
  switch (t) {
    case relokv::block_tier::kComputed:
      return "computed";
    case relokv::block_tier::kPool:
      return "pool";
    case relokv::block_tier::kStore:
      return "store";
  }
  return "?";
}

/// A plan as Python holds it: the C++ plan and whether the cache still knows its request.
struct py_plan {
  relokv::reuse_plan plan;
  std::int32_t num_tokens = 0;
};

/// The cache behind relokv.Cache, its template arguments erased.
class any_cache {
 public:
  virtual ~any_cache() = default;
  virtual relokv::reuse_plan plan(const relokv::request_layout& l,
                                  const relokv::recompute::any_strategy* s,
                                  const relokv::extra_keys& x, std::uint64_t principal) = 0;
  virtual void commit(relokv::request_id id) = 0;
  virtual void release(relokv::request_id id) = 0;
  [[nodiscard]] virtual const relokv::cache_stats& stats() const = 0;
  virtual void set_provenance(relokv::provenance_policy p) = 0;
  [[nodiscard]] virtual relokv::provenance_policy provenance() const = 0;
  [[nodiscard]] virtual std::int32_t cached_blocks() const = 0;
  [[nodiscard]] virtual std::size_t live_requests() const = 0;
  [[nodiscard]] virtual std::int32_t capacity() const = 0;
  [[nodiscard]] virtual std::int32_t block_size() const = 0;
  /// The block's tokens and origin, for a cached block (else nullopt).
  [[nodiscard]] virtual bool cached(relokv::block_id b) const = 0;
  [[nodiscard]] virtual std::vector<relokv::token_t> tokens_of(relokv::block_id b) const = 0;
  [[nodiscard]] virtual relokv::block_origin origin_of(relokv::block_id b) const = 0;
  [[nodiscard]] virtual std::string store_description() const = 0;
  [[nodiscard]] virtual relokv::host_kv_storage<float>* storage() = 0;
};

template <class H, class P>
class cache_impl final : public any_cache {
  using cache_t = relokv::relocatable_cache<H, relokv::lru_block_pool, P,
                                            relokv::recompute::any_strategy, relokv::any_store>;

 public:
  cache_impl(std::int32_t num_blocks, std::int32_t block_size, std::uint64_t seed,
             relokv::recompute::any_strategy strategy, relokv::any_store store,
             std::optional<relokv::kv_shape> shape, std::uint64_t fingerprint)
      : storage_(shape ? std::make_unique<relokv::host_kv_storage<float>>(*shape) : nullptr),
        cache_(make(num_blocks, block_size, seed, std::move(strategy), std::move(store),
                    storage_.get(), fingerprint)) {}

  relokv::reuse_plan plan(const relokv::request_layout& l, const relokv::recompute::any_strategy* s,
                          const relokv::extra_keys& x, std::uint64_t principal) override {
    relokv::reuse_plan p = s ? cache_.plan(l, *s, x, principal) : cache_.plan(l, x, principal);
    if (p.ok() && storage_) {
      // What an engine does first: the fetched blocks into the storage, then the copies.
      try {
        relokv::apply_fetches(*storage_, p.fetches);
        for (const relokv::block_copy& c : p.copies) storage_->copy_block(c.src, c.dst);
      } catch (...) {
        cache_.release(p.id);
        throw;
      }
    }
    return p;
  }
  void commit(relokv::request_id id) override {
    if (storage_)
      cache_.commit(id, *storage_);
    else
      cache_.commit(id);
  }
  void release(relokv::request_id id) override { cache_.release(id); }
  const relokv::cache_stats& stats() const override { return cache_.stats(); }
  void set_provenance(relokv::provenance_policy p) override { cache_.set_provenance_policy(p); }
  relokv::provenance_policy provenance() const override { return cache_.provenance(); }
  std::int32_t cached_blocks() const override { return cache_.cached_blocks(); }
  std::size_t live_requests() const override { return cache_.live_requests(); }
  std::int32_t capacity() const override { return cache_.allocator().capacity(); }
  std::int32_t block_size() const override { return cache_.block_size(); }
  bool cached(relokv::block_id b) const override {
    if (b < 0 || b >= capacity()) return false;
    // A block is cached when its tokens are indexed: tokens_of's length is then its length.
    return !cache_.tokens_of(b).empty();
  }
  std::vector<relokv::token_t> tokens_of(relokv::block_id b) const override {
    const auto t = cache_.tokens_of(b);
    return {t.begin(), t.end()};
  }
  relokv::block_origin origin_of(relokv::block_id b) const override { return cache_.origin_of(b); }
  std::string store_description() const override { return cache_.store().description(); }
  relokv::host_kv_storage<float>* storage() override { return storage_.get(); }

 private:
  static cache_t make(std::int32_t num_blocks, std::int32_t block_size, std::uint64_t seed,
                      relokv::recompute::any_strategy strategy, relokv::any_store store,
                      const relokv::host_kv_storage<float>* storage, std::uint64_t fingerprint) {
    if (!store)
      return cache_t(relokv::lru_block_pool(num_blocks), block_size, H(seed), std::move(strategy));
    const relokv::store_options so{fingerprint, storage->block_layout()};
    return cache_t(relokv::lru_block_pool(num_blocks), block_size, H(seed), std::move(strategy),
                   std::move(store), so);
  }

  std::unique_ptr<relokv::host_kv_storage<float>> storage_;
  cache_t cache_;
};

/// relokv.Cache: the erased cache, a lock (a released GIL lets two threads in), and the
/// kv_shape of its storage when it has one.
struct py_cache {
  std::unique_ptr<any_cache> c;
  std::string hash, placement;
  std::mutex m;
};

template <class H>
std::unique_ptr<any_cache> with_placement(const std::string& placement, std::int32_t n,
                                          std::int32_t bs, std::uint64_t seed,
                                          relokv::recompute::any_strategy s,
                                          relokv::any_store store,
                                          std::optional<relokv::kv_shape> shape, std::uint64_t fp) {
  if (placement == "at_attention")
    return std::make_unique<cache_impl<H, relokv::at_attention>>(n, bs, seed, std::move(s),
                                                                 std::move(store), shape, fp);
  if (placement == "pre_rotated")
    return std::make_unique<cache_impl<H, relokv::pre_rotated>>(n, bs, seed, std::move(s),
                                                                std::move(store), shape, fp);
  if (placement == "block_relative")
    return std::make_unique<cache_impl<H, relokv::block_relative>>(n, bs, seed, std::move(s),
                                                                   std::move(store), shape, fp);
  throw relokv::error("Cache: placement '" + placement +
                      "' is not one of at_attention, pre_rotated, block_relative");
}

relokv::request_id id_of(nb::handle h) {
  if (nb::isinstance<py_plan>(h)) return nb::cast<const py_plan&>(h).plan.id;
  std::uint64_t id = 0;
  if (nb::isinstance<nb::bool_>(h) || !nb::try_cast(h, id, false))
    throw nb::type_error("a Plan or a request id (int)");
  return id;
}

nb::dict stats_dict(const relokv::cache_stats& s) {
  nb::dict d;
  d["requests"] = s.requests;
  d["blocks_looked_up"] = s.blocks_looked_up;
  d["exact_hits"] = s.exact_hits;
  d["relocated_hits"] = s.relocated_hits;
  d["misses"] = s.misses;
  d["evictions"] = s.evictions;
  d["out_of_blocks"] = s.out_of_blocks;
  d["provenance_denied"] = s.provenance_denied;
  d["store_lookups"] = s.store_lookups;
  d["store_hits"] = s.store_hits;
  d["store_misses"] = s.store_misses;
  d["store_unavailable"] = s.store_unavailable;
  d["store_rejected"] = s.store_rejected_total();
  d["store_writes"] = s.store_writes;
  d["store_write_failures"] = s.store_write_failures;
  d["store_bytes_read"] = s.store_bytes_read;
  d["store_bytes_written"] = s.store_bytes_written;
  return d;
}

}  // namespace

nb::dict cache_stats_dict(const relokv::cache_stats& s) { return stats_dict(s); }

void bind_cache(nb::module_& m) {
  // The C++ side of bench/python_plan_overhead.py: the same plan and release as Cache.plan and
  // Cache.release, `iterations` times in C++; nanoseconds per plan and release.
  m.def(
      "_bench_plan",
      [](py_cache& c, const relokv::request_layout& l, nb::handle strategy_h,
         std::int64_t iterations) {
        if (iterations <= 0) throw relokv::error("_bench_plan: iterations must be positive");
        const strategy_ref s(strategy_h);
        nb::gil_scoped_release unlock;
        const std::lock_guard lock(c.m);
        const auto t0 = std::chrono::steady_clock::now();
        for (std::int64_t i = 0; i < iterations; ++i) {
          const relokv::reuse_plan p = c.c->plan(l, &s->made, {}, 0);
          if (p.ok()) c.c->release(p.id);
        }
        const auto ns =
            std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0);
        return ns.count() / static_cast<double>(iterations);
      },
      "cache"_a, "layout"_a, "strategy"_a, "iterations"_a,
      "Benchmark support: ns per plan and release of `layout`, looped in C++.");

  nb::class_<py_plan>(
      m, "Plan",
      "What Cache.plan decided for one request: each block's source, the tokens to\n"
      "compute, the copies and fetches an engine applies first.")
      .def_prop_ro(
          "ok", [](const py_plan& p) { return p.plan.ok(); },
          "False when the pool could not hold the request (nothing was taken).")
      .def_prop_ro(
          "id", [](const py_plan& p) { return p.plan.id; }, "The request's id.")
      .def_prop_ro("blocks_short", [](const py_plan& p) { return p.plan.blocks_short; })
      .def_prop_ro("exact_hits", [](const py_plan& p) { return p.plan.exact_hits; })
      .def_prop_ro("relocated_hits", [](const py_plan& p) { return p.plan.relocated_hits; })
      .def_prop_ro("misses", [](const py_plan& p) { return p.plan.misses; })
      .def_prop_ro("store_hits", [](const py_plan& p) { return p.plan.store_hits; })
      .def_prop_ro("tokens_to_compute", [](const py_plan& p) { return p.plan.tokens_to_compute; })
      .def_prop_ro(
          "blocks",
          [](const py_plan& p) {
            std::vector<nb::dict> v;
            for (const auto& b : p.plan.blocks) {
              nb::dict d;
              d["physical"] = b.physical;
              d["source"] = b.source;
              d["pos0"] = b.pos0;
              d["len"] = b.len;
              d["status"] = status_name(b.status);
              d["tier"] = tier_name(b.tier);
              d["fresh"] = b.fresh;
              d["copy_on_write"] = b.copy_on_write;
              v.push_back(std::move(d));
            }
            return v;
          },
          "Each block as a dict: physical (the pool block it reads), source (the cached block\n"
          "found, -1 for a miss), pos0, len, status (miss, exact, relocated), tier (computed,\n"
          "pool, store), fresh (the request writes it whole), copy_on_write.")
      .def_prop_ro(
          "compute",
          [](nb::handle self) {
            const py_plan& p = nb::cast<const py_plan&>(self);
            return nb::ndarray<nb::numpy, const std::uint8_t, nb::ndim<1>>(
                p.plan.compute.data(), {p.plan.compute.size()}, self);
          },
          nb::rv_policy::automatic,
          "Per token, 1 where the engine computes it (a view into the plan, uint8).")
      .def_prop_ro(
          "recompute_rows",
          [](const py_plan& p) {
            std::vector<std::int32_t> rows;
            for (std::size_t i = 0; i < p.plan.compute.size(); ++i)
              if (p.plan.compute[i] != 0) rows.push_back(static_cast<std::int32_t>(i));
            return to_numpy(std::move(rows));
          },
          nb::rv_policy::automatic, "The positions the engine computes, ascending (int32).")
      .def_prop_ro(
          "reused", [](const py_plan& p) { return to_numpy(p.plan.reused_mask()); },
          nb::rv_policy::automatic, "Per token, 1 where its K/V come from a cached block (uint8).")
      .def_prop_ro(
          "block_table",
          [](const py_plan& p) {
            std::vector<std::tuple<std::int32_t, std::int32_t, std::int32_t>> v;
            for (const auto& e : p.plan.block_table()) v.emplace_back(e.block, e.pos0, e.len);
            return v;
          },
          "What attention reads: (pool block, first position, tokens) per block.")
      .def_prop_ro(
          "copies",
          [](const py_plan& p) {
            std::vector<std::tuple<std::int32_t, std::int32_t, std::int32_t, std::int32_t>> v;
            for (const auto& c : p.plan.copies)
              v.emplace_back(c.src, c.dst, c.src_pos0, c.dst_pos0);
            return v;
          },
          "Copies on write as (src, dst, src_pos0, dst_pos0); a cache with kv_shape applied them.")
      .def("__repr__", [](const py_plan& p) {
        if (!p.plan.ok())
          return "Plan(out of blocks: " + std::to_string(p.plan.blocks_short) + " short)";
        return "Plan(id " + std::to_string(p.plan.id) + ": " + std::to_string(p.plan.exact_hits) +
               " exact, " + std::to_string(p.plan.relocated_hits) + " relocated, " +
               std::to_string(p.plan.misses) + " missed blocks; " +
               std::to_string(p.plan.tokens_to_compute) + " of " + std::to_string(p.num_tokens) +
               " tokens computed)";
      });

  nb::class_<py_cache>(
      m, "Cache",
      "relocatable_cache with its policies chosen by name: it plans requests (which blocks\n"
      "are reused exactly, which relocated, which computed), and commits and releases them.\n"
      "An engine computes what a plan says; relokv.Engine is one.")
      .def(
          "__init__",
          [](py_cache* self, std::int32_t num_blocks, std::int32_t block_size,
             const std::string& hash, const std::string& pool, const std::string& placement,
             nb::handle strategy_h, std::optional<std::string> store,
             std::optional<std::tuple<int, int, int>> kv_shape,
             std::optional<std::string> seal_key_env, std::optional<std::string> seal_key_file,
             std::uint64_t seed, std::uint64_t fingerprint) {
            if (num_blocks <= 0) throw relokv::error("Cache: num_blocks must be positive");
            if (pool != "lru") throw relokv::error("Cache: pool '" + pool + "' is not one of lru");
            if (hash != "xxh3_128" && hash != "xxh3_64")
              throw relokv::error("Cache: hash '" + hash + "' is not one of xxh3_128, xxh3_64");
            const strategy_ref s(strategy_h);
            relokv::any_store st = open_store(store, seal_key_env, seal_key_file, "Cache");
            std::optional<relokv::kv_shape> shape;
            if (kv_shape) {
              const auto [layers, heads, dim] = *kv_shape;
              shape = relokv::kv_shape{layers, num_blocks, heads, block_size, dim};
              relokv::host_kv_storage<float>::check_shape(*shape);
            } else if (st) {
              throw relokv::error(
                  "Cache: a store needs kv_shape=(layers, kv_heads, head_dim): the blocks it reads "
                  "and writes live in the cache's storage (Cache.kv)");
            }
            auto c =
                hash == "xxh3_128"
                    ? with_placement<relokv::xxh3_128>(placement, num_blocks, block_size, seed,
                                                       s->made, std::move(st), shape, fingerprint)
                    : with_placement<relokv::xxh3_64>(placement, num_blocks, block_size, seed,
                                                      s->made, std::move(st), shape, fingerprint);
            new (self) py_cache{std::move(c), hash, placement, {}};
          },
          "num_blocks"_a, "block_size"_a = 16, "hash"_a = "xxh3_128", "pool"_a = "lru",
          "placement"_a = "at_attention", "strategy"_a = "naive", "store"_a = nb::none(),
          "kv_shape"_a = nb::none(), "seal_key_env"_a = nb::none(), "seal_key_file"_a = nb::none(),
          "seed"_a = 0, "fingerprint"_a = 1,
          nb::sig(
              "def __init__(self, num_blocks: int, block_size: int = 16, hash: str = 'xxh3_128', "
              "pool: str = 'lru', placement: str = 'at_attention', strategy: Strategy | str = "
              "'naive', "
              "store: str | None = None, kv_shape: tuple[int, int, int] | None = None, "
              "seal_key_env: str | None = None, seal_key_file: str | None = None, seed: int = 0, "
              "fingerprint: int = 1) -> None"),
          "num_blocks: the pool's blocks. block_size: tokens per block (a power of two).\n"
          "hash: xxh3_128 or xxh3_64 (keys; seed salts them per deployment). pool: lru.\n"
          "placement: at_attention (keys stored unrotated), pre_rotated, block_relative.\n"
          "strategy: the default recompute strategy (a Strategy or a name).\n"
          "store: a URL (memory:, file:DIR, redis://HOST:PORT, redis-cluster://H:P,...) where\n"
          "blocks outlive the process; it needs kv_shape=(layers, kv_heads, head_dim), the\n"
          "float32 storage (Cache.kv) the blocks are read into and written from.\n"
          "seal_key_env / seal_key_file: seal the stored blocks (authenticated encryption).\n"
          "fingerprint: the model's identity in the store's keys.")
      .def(
          "plan",
          [](py_cache& c, const relokv::request_layout& l, nb::handle strategy_h,
             std::uint64_t tenant, std::uint64_t principal, std::uint64_t model) {
            std::optional<strategy_ref> s;
            if (!strategy_h.is_none()) s.emplace(strategy_h);
            relokv::extra_keys x;
            x.tenant_salt = tenant;
            x.model_fingerprint = model;
            x.adapter_id = l.adapter_id;
            py_plan out;
            out.num_tokens = l.num_tokens();
            {
              nb::gil_scoped_release unlock;
              const std::lock_guard lock(c.m);
              out.plan = c.c->plan(l, s ? &(*s)->made : nullptr, x, principal);
            }
            return out;
          },
          "layout"_a, "strategy"_a = nb::none(), "tenant"_a = 0, "principal"_a = 0, "model"_a = 0,
          nb::sig("def plan(self, layout: Layout, strategy: Strategy | str | None = None, tenant: "
                  "int = 0, "
                  "principal: int = 0, model: int = 0) -> Plan"),
          "Plans a request: looks every block up (context key, then content key), lets the\n"
          "strategy (default: the cache's) pick reused tokens to recompute, and takes the blocks.\n"
          "tenant salts the keys (tenants share nothing); principal names the sender for the\n"
          "provenance policy. A plan that is not ok took nothing. With a store and kv_shape the\n"
          "fetched blocks and the copies are applied to Cache.kv before it returns.")
      .def(
          "commit",
          [](py_cache& c, nb::handle plan) {
            const relokv::request_id id = id_of(plan);
            nb::gil_scoped_release unlock;
            const std::lock_guard lock(c.m);
            c.c->commit(id);
          },
          "plan"_a, nb::sig("def commit(self, plan: Plan | int) -> None"),
          "Registers the request's new blocks for reuse (and writes them to the store) once the\n"
          "engine has written them. Raises Error for an unknown or already committed request.")
      .def(
          "release",
          [](py_cache& c, nb::handle plan) {
            const relokv::request_id id = id_of(plan);
            const std::lock_guard lock(c.m);
            c.c->release(id);
          },
          "plan"_a, nb::sig("def release(self, plan: Plan | int) -> None"),
          "Ends a request: its blocks stay cached, evictable.")
      .def_prop_ro(
          "stats",
          [](py_cache& c) {
            const std::lock_guard lock(c.m);
            return stats_dict(c.c->stats());
          },
          "Counters: requests, hits by kind, misses, evictions, store traffic.")
      .def_prop_rw(
          "provenance",
          [](py_cache& c) {
            const std::lock_guard lock(c.m);
            return c.c->provenance() == relokv::provenance_policy::kPermissive
                       ? std::string("permissive")
                       : std::string("canonical_or_same_principal");
          },
          [](py_cache& c, const std::string& p) {
            const std::lock_guard lock(c.m);
            if (p == "permissive")
              c.c->set_provenance(relokv::provenance_policy::kPermissive);
            else if (p == "canonical_or_same_principal")
              c.c->set_provenance(relokv::provenance_policy::kCanonicalOrSamePrincipal);
            else
              throw relokv::error("provenance: '" + p +
                                  "' is not one of canonical_or_same_principal, permissive");
          },
          "Which relocated hits are served: canonical_or_same_principal (default) or permissive.")
      .def(
          "origin",
          [](py_cache& c, std::int32_t b) {
            const std::lock_guard lock(c.m);
            if (!c.c->cached(b))
              throw relokv::error("origin: block " + std::to_string(b) + " is not cached");
            const auto o = c.c->origin_of(b);
            return std::make_tuple(o.canonical, o.principal);
          },
          "block"_a, "A cached block's provenance: (canonical, principal that computed it).")
      .def(
          "tokens_of",
          [](py_cache& c, std::int32_t b) {
            const std::lock_guard lock(c.m);
            if (!c.c->cached(b))
              throw relokv::error("tokens_of: block " + std::to_string(b) + " is not cached");
            return to_numpy(c.c->tokens_of(b));
          },
          "block"_a, "The tokens a cached block holds.")
      .def_prop_ro("cached_blocks",
                   [](py_cache& c) {
                     const std::lock_guard lock(c.m);
                     return c.c->cached_blocks();
                   })
      .def_prop_ro("live_requests",
                   [](py_cache& c) {
                     const std::lock_guard lock(c.m);
                     return c.c->live_requests();
                   })
      .def_prop_ro("num_blocks", [](py_cache& c) { return c.c->capacity(); })
      .def_prop_ro("block_size", [](py_cache& c) { return c.c->block_size(); })
      .def_ro("hash", &py_cache::hash)
      .def_ro("placement", &py_cache::placement)
      .def_prop_ro(
          "store", [](py_cache& c) { return c.c->store_description(); },
          "The store's URL, its password redacted ('' without a store).")
      .def_prop_ro(
          "kv",
          [](nb::handle self) -> nb::object {
            py_cache& c = nb::cast<py_cache&>(self);
            relokv::host_kv_storage<float>* s = c.c->storage();
            if (!s) return nb::none();
            const relokv::kv_shape& sh = s->shape();
            const auto shape = pool_shape(sh);
            return nb::cast(nb::ndarray<nb::numpy, float>(s->data(), 6, shape.data(), self));
          },
          nb::sig("def kv(self) -> numpy.typing.NDArray[numpy.float32] | None"),
          "The storage of a cache made with kv_shape, without a copy: float32\n"
          "[layer, block, k|v, kv_head, slot, dim]. None otherwise.");
}

}  // namespace relokv_py
