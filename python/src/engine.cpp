// relokv.Engine: the example CPU engine (a GGUF model, its tokenizer, a paged KV pool and a
// relocatable_cache), its logits and its KV as arrays without copies.
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
#include <nanobind/stl/vector.h>

#include <relokv/layout/builder.hpp>
#include <relokv/layout/span_finder.hpp>
#include <relokv/store/any_store.hpp>

#include "bindings.hpp"
#include "links.hpp"
#include "llama_engine.hpp"
#include "load_model.hpp"
#include "marked_text.hpp"
#include "model_path.hpp"

namespace relokv_py {

nb::dict cache_stats_dict(const relokv::cache_stats& s);

namespace {

using namespace nb::literals;

/// The engine behind relokv.Engine, its placement and KV type erased.
class any_engine {
 public:
  virtual ~any_engine() = default;
  /// The engine's sequence calls and their one-request loop (prefill, decode, end).
  [[nodiscard]] virtual relokv_engine::sequence_engine& sequences() = 0;
  [[nodiscard]] bool live() { return sequences().current() >= 0; }
  [[nodiscard]] virtual std::vector<relokv::block_entry> block_table() const = 0;
  [[nodiscard]] virtual const relokv::cache_stats& cache_stats() const = 0;
  [[nodiscard]] virtual std::uint64_t fingerprint() const = 0;
  [[nodiscard]] virtual void* kv_data() = 0;
  [[nodiscard]] virtual const relokv::kv_shape& kv_shape() const = 0;
  [[nodiscard]] virtual bool bf16() const = 0;
};

template <class P, class T>
class engine_impl final : public any_engine {
 public:
  engine_impl(std::shared_ptr<const relokv_engine::llama_model> m, std::int32_t num_blocks,
              std::int32_t block_size, relokv::any_store store)
      : e_(std::move(m), num_blocks, block_size, std::move(store)) {}
  relokv_engine::sequence_engine& sequences() override { return e_; }
  std::vector<relokv::block_entry> block_table() const override {
    return e_.block_table(e_.current());
  }
  const relokv::cache_stats& cache_stats() const override {
    return const_cast<relokv_engine::llama_engine<P, T>&>(e_).cache().stats();
  }
  std::uint64_t fingerprint() const override { return e_.store_fingerprint(); }
  void* kv_data() override { return const_cast<T*>(e_.kv().data()); }
  const relokv::kv_shape& kv_shape() const override { return e_.kv().shape(); }
  bool bf16() const override { return std::is_same_v<T, relokv::bf16>; }

 private:
  relokv_engine::llama_engine<P, T> e_;
};

template <class T>
std::unique_ptr<any_engine> make_engine(const std::string& placement,
                                        std::shared_ptr<const relokv_engine::llama_model> m,
                                        std::int32_t n, std::int32_t bs, relokv::any_store store) {
  if (placement == "block_relative")
    return std::make_unique<engine_impl<relokv::block_relative, T>>(std::move(m), n, bs,
                                                                    std::move(store));
  if (placement == "at_attention")
    return std::make_unique<engine_impl<relokv::at_attention, T>>(std::move(m), n, bs,
                                                                  std::move(store));
  if (placement == "pre_rotated")
    return std::make_unique<engine_impl<relokv::pre_rotated, T>>(std::move(m), n, bs,
                                                                 std::move(store));
  throw relokv::error("Engine: placement '" + placement +
                      "' is not one of block_relative, at_attention, pre_rotated");
}

/// relokv.Engine's state: the model, its tokenizer, the engine, the last prefill's figures,
/// and a lock (the GIL is released during the forward passes).
struct py_engine {
  std::shared_ptr<const relokv_engine::llama_model> model;
  std::unique_ptr<relokv_engine::tokenizer> tok;
  std::unique_ptr<any_engine> e;
  std::string path, placement, kv_dtype;
  std::int32_t block_size = 16, num_blocks = 0;
  relokv_engine::prefill_stats last;
  bool have_last = false;
  std::mutex m;
  /// The spans plain_layout has cut, found again wherever they recur (as relokv_server's
  /// --spans auto: one span finder, relokv::find_spans).
  relokv::span_index known;
};

std::vector<relokv::token_t> encode(const py_engine& e, const std::string& text, bool special) {
  if (!e.tok) {  // the synthetic model: bytes folded into the vocabulary, as relokv_rag does
    std::vector<relokv::token_t> out;
    for (unsigned char c : text)
      out.push_back(static_cast<relokv::token_t>(c % e.model->cfg.vocab));
    return out;
  }
  if (special) return e.tok->encode(text);
  return e.tok->encode(relokv_engine::marked_text().plain(text));
}

nb::dict prefill_stats_dict(const relokv_engine::prefill_stats& s, std::int32_t layers) {
  nb::dict d;
  d["tokens"] = s.tokens;
  d["computed"] = s.computed;
  d["token_layers"] = s.token_layers;
  d["work"] = s.tokens > 0 ? static_cast<double>(s.token_layers) /
                                 (static_cast<double>(s.tokens) * static_cast<double>(layers))
                           : 0.0;
  d["exact_hits"] = s.exact_hits;
  d["relocated_hits"] = s.relocated_hits;
  d["misses"] = s.misses;
  d["store_hits"] = s.store_hits;
  d["pool_blocks"] = s.pool_blocks;
  d["store_blocks"] = s.store_blocks;
  d["computed_blocks"] = s.computed_blocks;
  return d;
}

/// A view of `count` elements' worth of the pool as an array owned by `owner` (no copy).
nb::object pool_view(any_engine& e, nb::handle owner, std::size_t offset, std::size_t ndim,
                     const std::size_t* shape, const std::int64_t* strides) {
  if (e.bf16()) {
    auto* p = static_cast<relokv::bf16*>(e.kv_data()) + offset;
    const nb::dlpack::dtype bf16{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    return nb::cast(nb::ndarray<nb::array_api>(p, ndim, shape, owner, strides, bf16));
  }
  float* p = static_cast<float*>(e.kv_data()) + offset;
  return nb::cast(nb::ndarray<nb::numpy, float>(p, ndim, shape, owner, strides));
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<py_engine>(
      m, "Engine",
      "The example CPU engine on relokv: a GGUF model (Llama, Qwen2, Gemma 3) or the synthetic\n"
      "one, its tokenizer, a paged KV pool and a relocatable cache. One request at a time:\n"
      "prefill(layout, strategy) -> logits, decode(token) -> logits, end(). The forward passes\n"
      "release the GIL; each engine takes one call at a time (two threads: two engines).")
      .def(
          "__init__",
          [](py_engine* self, std::optional<std::string> model, std::int32_t num_blocks,
             std::int32_t block_size, const std::string& placement, const std::string& kv_dtype,
             std::optional<std::string> store, std::optional<std::string> seal_key_env,
             std::optional<std::string> seal_key_file, std::optional<std::string> links) {
            if (kv_dtype != "bf16" && kv_dtype != "fp32")
              throw relokv::error("Engine: kv_dtype '" + kv_dtype + "' is not one of bf16, fp32");
            if (placement != "block_relative" && placement != "at_attention" &&
                placement != "pre_rotated")
              throw relokv::error("Engine: placement '" + placement +
                                  "' is not one of block_relative, at_attention, pre_rotated");
            const std::string path = model ? model_path_of(*model) : std::string();
            relokv::any_store st = open_store(store, seal_key_env, seal_key_file, "Engine");
            std::shared_ptr<const relokv_engine::llama_model> mdl;
            std::unique_ptr<relokv_engine::tokenizer> tok;
            std::unique_ptr<any_engine> e;
            {
              nb::gil_scoped_release unlock;
              auto loaded = relokv_engine::load_model(path);
              mdl = loaded.model;
              tok = std::move(loaded.tokenizer);
              if (links)
                mdl = relokv_engine::with_links(mdl, relokv_engine::load_links(*links, *mdl));
              e = kv_dtype == "bf16"
                      ? make_engine<relokv::bf16>(placement, mdl, num_blocks, block_size,
                                                  std::move(st))
                      : make_engine<float>(placement, mdl, num_blocks, block_size, std::move(st));
            }
            auto* p = new (self) py_engine();
            p->model = std::move(mdl);
            p->tok = std::move(tok);
            p->e = std::move(e);
            p->path = path;
            p->placement = placement;
            p->kv_dtype = kv_dtype;
            p->block_size = block_size;
            p->num_blocks = num_blocks;
          },
          "model"_a = nb::none(), "num_blocks"_a = 4096, "block_size"_a = 16,
          "placement"_a = "block_relative", "kv_dtype"_a = "bf16", "store"_a = nb::none(),
          "seal_key_env"_a = nb::none(), "seal_key_file"_a = nb::none(), "links"_a = nb::none(),
          "model: a GGUF path, a name scripts/get-model fetched (smollm2, qwen2.5-0.5b,\n"
          "qwen2.5-1.5b, gemma3-270m), or None for the synthetic model (random weights).\n"
          "num_blocks, block_size: the KV pool. placement: how keys are stored (block_relative,\n"
          "at_attention, pre_rotated). kv_dtype: bf16 or fp32 (numpy reads fp32 pools; DLPack\n"
          "hands bf16 ones to torch). store: a URL where spans outlive the process (memory:,\n"
          "file:DIR, redis://..., redis-cluster://...), sealed with seal_key_env/_file.\n"
          "links: a span-link adapter (tools/links).")
      .def(
          "tokenize",
          [](py_engine& e, const std::string& text, bool special) {
            return to_numpy(encode(e, text, special));
          },
          "text"_a, "special"_a = false,
          "Text to token ids (int32). special=False reads a special token's literal\n"
          "(<|im_end|>) as text; True makes it the control token (trusted text only).")
      .def(
          "detokenize",
          [](py_engine& e, nb::handle ids) {
            const auto t = tokens_of(ids, "detokenize");
            relokv_engine::check_tokens(*e.model, t, "detokenize");
            if (!e.tok) {
              std::string s;
              for (relokv::token_t x : t) s.push_back(static_cast<char>(x & 0x7f));
              return s;
            }
            return e.tok->decode(t);
          },
          "ids"_a,
          nb::sig("def detokenize(self, ids: collections.abc.Sequence[int] | "
                  "numpy.typing.ArrayLike) -> str"),
          "Token ids to text.")
      .def(
          "layout",
          [](py_engine& e, const std::vector<std::string>& documents, const std::string& question,
             std::optional<std::string> system) {
            const std::string sys =
                system.value_or(e.tok ? e.tok->default_system() : std::string("You are helpful."));
            std::vector<relokv::token_t> prefix, q;
            if (e.tok) {
              prefix = e.tok->encode(e.tok->open_marked(sys));
              q = encode(e, question, false);
              const auto close = e.tok->encode(e.tok->close_marked());
              q.insert(q.end(), close.begin(), close.end());
            } else {
              prefix =
                  encode(e, "<|im_start|>system\n" + sys + "<|im_end|>\n<|im_start|>user\n", false);
              q = encode(e, question + "<|im_end|>\n<|im_start|>assistant\n", false);
            }
            relokv::layout_builder b(e.block_size, e.model->input_ids());
            b.prefix(prefix);
            for (const auto& d : documents) {
              if (d.empty()) throw relokv::error("layout: an empty document");
              b.span(encode(e, d, false));
            }
            if (q.empty()) throw relokv::error("layout: an empty question");
            b.question(q);
            return b.build();
          },
          "documents"_a, "question"_a, "system"_a = nb::none(),
          "A chat prompt as a Layout: the system turn as the prefix, each document a relocatable\n"
          "span (its text never makes control tokens), the question and the assistant's opening\n"
          "as the question segment.")
      .def(
          "plain_layout",
          [](py_engine& e, const std::string& text, std::optional<std::string> system,
             std::int32_t min_span) {
            if (!e.tok) throw relokv::error("plain_layout: the model has no tokenizer");
            if (text.empty()) throw relokv::error("plain_layout: an empty message");
            if (min_span < 1) throw relokv::error("plain_layout: min_span must be at least 1");
            const std::string sys = system.value_or(e.tok->default_system());
            std::vector<relokv::token_t> all = e.tok->encode(e.tok->open_marked(sys));
            const auto start = static_cast<std::int32_t>(all.size());
            relokv_engine::marked_text q;
            const auto rest = e.tok->encode(q.plain(text).append(e.tok->close_marked()));
            all.insert(all.end(), rest.begin(), rest.end());
            std::vector<std::string> pieces;
            pieces.reserve(all.size());
            for (const relokv::token_t t : all) pieces.push_back(e.tok->decode({t}));
            relokv::span_finder_options o;
            o.min_span = min_span;
            const std::vector<std::int32_t> forced{start};
            const auto segs = relokv::find_spans(all, pieces, o, forced, &e.known);
            relokv::layout_builder b(e.block_size, e.model->input_ids());
            if (segs.size() < 2) return b.prefix(all).build();
            return relokv::add_found(b, all, segs).build();
          },
          "text"_a, "system"_a = nb::none(), "min_span"_a = 16,
          "A chat prompt whose user message holds its passages in any format (no documents\n"
          "field): its spans found by relokv::find_spans, as relokv_server --spans auto finds\n"
          "them (every line after its label, and spans this engine cut before, wherever they\n"
          "recur). The tokens are the message's own: full recompute stays exact.")
      .def(
          "prefill",
          [](py_engine& e, const relokv::request_layout& layout, nb::handle strategy_h,
             std::uint64_t tenant, std::uint64_t principal) {
            const strategy_ref s(strategy_h);
            relokv::extra_keys x;
            x.tenant_salt = tenant;
            x.adapter_id = layout.adapter_id;
            std::vector<float> logits;
            {
              nb::gil_scoped_release unlock;
              const std::lock_guard lock(e.m);
              if (layout.block_size != e.block_size)
                throw relokv::error("prefill: the layout's block_size " +
                                    std::to_string(layout.block_size) + " is not the engine's " +
                                    std::to_string(e.block_size));
              if (e.e->live()) throw relokv::error("prefill: a request is live; end() it first");
              relokv_engine::prefill_stats st;
              if (s->spans) {
                logits = e.e->sequences().prefill(layout, s->made, &st, x, principal);
              } else {  // 'prefix': the whole prompt one prefix, reused by exact key only
                const auto one = relokv::layout_builder(e.block_size, e.model->input_ids())
                                     .prefix(layout.tokens)
                                     .build();
                logits = e.e->sequences().prefill(one, s->made, &st, x, principal);
              }
              e.last = std::move(st);
              e.have_last = true;
            }
            return to_numpy(std::move(logits));
          },
          "layout"_a, "strategy"_a = "full", "tenant"_a = 0, "principal"_a = 0,
          nb::sig("def prefill(self, layout: Layout, strategy: Strategy | str = 'full', tenant: "
                  "int = 0, "
                  "principal: int = 0) -> numpy.typing.NDArray[numpy.float32]"),
          "Prefills a request, reusing cached blocks as the strategy says, and returns the last\n"
          "token's logits (float32). The request stays live for decode() until end().")
      .def(
          "decode",
          [](py_engine& e, std::int64_t token) {
            if (token < 0 || token >= e.model->cfg.vocab)
              throw std::out_of_range("decode: token " + std::to_string(token) +
                                      " outside the vocabulary [0, " +
                                      std::to_string(e.model->cfg.vocab) + ")");
            std::vector<float> logits;
            {
              nb::gil_scoped_release unlock;
              const std::lock_guard lock(e.m);
              if (!e.e->live()) throw relokv::error("decode: no live request (prefill first)");
              logits = e.e->sequences().decode(static_cast<relokv::token_t>(token));
            }
            return to_numpy(std::move(logits));
          },
          "token"_a, "Appends a token to the live request and returns the next logits.")
      .def(
          "generate",
          [](py_engine& e,
             nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> logits,
             std::int32_t max_tokens, std::optional<std::int64_t> stop) {
            if (static_cast<std::int64_t>(logits.shape(0)) != e.model->cfg.vocab)
              throw relokv::error("generate: logits of " + std::to_string(logits.shape(0)) +
                                  " values, the vocabulary has " +
                                  std::to_string(e.model->cfg.vocab));
            if (max_tokens < 0) throw relokv::error("generate: max_tokens must be >= 0");
            const relokv::token_t eot =
                stop ? static_cast<relokv::token_t>(*stop) : (e.tok ? e.tok->end_of_turn() : -1);
            std::vector<float> first(logits.data(), logits.data() + logits.shape(0));
            std::vector<relokv::token_t> out;
            // Greedy, one decode a token (the engine's generate, with the lock and no GIL).
            nb::gil_scoped_release unlock;
            const std::lock_guard lock(e.m);
            if (!e.e->live()) throw relokv::error("generate: no live request (prefill first)");
            std::vector<float> cur = std::move(first);
            for (std::int32_t i = 0; i < max_tokens; ++i) {
              const relokv::token_t t = relokv_engine::argmax(cur);
              if (t == eot) break;
              out.push_back(t);
              if (i + 1 == max_tokens) break;
              cur = e.e->sequences().decode(t);
            }
            return out;
          },
          "logits"_a, "max_tokens"_a = 32, "stop"_a = nb::none(),
          "Greedy answer from prefill's logits: up to max_tokens ids, ending before the stop id\n"
          "(default: the end of turn; not returned). Each returned token but the last is decoded.")
      .def(
          "end",
          [](py_engine& e, bool commit) {
            nb::gil_scoped_release unlock;
            const std::lock_guard lock(e.m);
            e.e->sequences().end(commit);
          },
          "commit"_a = true,
          "Ends the live request; commit=True makes its new blocks reusable (and stores them).")
      .def_prop_ro(
          "stats",
          [](py_engine& e) -> nb::object {
            const std::lock_guard lock(e.m);
            if (!e.have_last) return nb::none();
            return prefill_stats_dict(e.last, e.model->cfg.n_layers);
          },
          "The last prefill's figures: tokens, computed, work (share of token-layers computed),\n"
          "exact_hits, relocated_hits, misses, store_hits, blocks by tier.")
      .def_prop_ro(
          "cache_stats",
          [](py_engine& e) {
            const std::lock_guard lock(e.m);
            return cache_stats_dict(e.e->cache_stats());
          },
          "The cache's counters since the engine was made.")
      .def(
          "block_table",
          [](py_engine& e) {
            const std::lock_guard lock(e.m);
            std::vector<std::tuple<std::int32_t, std::int32_t, std::int32_t>> v;
            if (!e.e->live()) throw relokv::error("block_table: no live request");
            for (const auto& b : e.e->block_table()) v.emplace_back(b.block, b.pos0, b.len);
            return v;
          },
          "The live request's blocks: (pool block, first position, valid slots) each.")
      .def_prop_ro(
          "kv",
          [](nb::handle self) {
            py_engine& e = nb::cast<py_engine&>(self);
            const relokv::kv_shape& s = e.e->kv_shape();
            const auto shape = pool_shape(s);
            return pool_view(*e.e, self, 0, 6, shape.data(), nullptr);
          },
          "The KV pool without a copy: [layer, block, k|v, kv_head, slot, dim], float32 for\n"
          "kv_dtype='fp32' (numpy.asarray, torch.from_dlpack) or bfloat16 (torch.from_dlpack).\n"
          "Keys are as the placement stores them. Later requests overwrite freed blocks.")
      .def_prop_ro(
          "kv_bits",
          [](nb::handle self) -> nb::object {
            py_engine& e = nb::cast<py_engine&>(self);
            if (!e.e->bf16()) return nb::none();
            const relokv::kv_shape& s = e.e->kv_shape();
            const auto shape = pool_shape(s);
            return nb::cast(nb::ndarray<nb::numpy, std::uint16_t>(
                static_cast<std::uint16_t*>(e.e->kv_data()), 6, shape.data(), self));
          },
          "A bf16 pool's bits as uint16, for numpy (which has no bfloat16), without a copy;\n"
          "None for an fp32 pool. float32 values: (bits.astype(uint32) << 16).view(float32).")
      .def(
          "request_kv",
          [](nb::handle self) {
            py_engine& e = nb::cast<py_engine&>(self);
            std::vector<nb::object> out;
            const std::lock_guard lock(e.m);
            if (!e.e->live()) throw relokv::error("request_kv: no live request");
            const relokv::kv_shape& s = e.e->kv_shape();
            const std::int64_t strides[5] = {
                static_cast<std::int64_t>(s.layer_elems()),
                static_cast<std::int64_t>(s.num_kv_heads) * s.block_size * s.head_dim,
                static_cast<std::int64_t>(s.block_size) * s.head_dim, s.head_dim, 1};
            for (const auto& b : e.e->block_table()) {
              const std::size_t shape[5] = {static_cast<std::size_t>(s.num_layers), 2,
                                            static_cast<std::size_t>(s.num_kv_heads),
                                            static_cast<std::size_t>(b.len),
                                            static_cast<std::size_t>(s.head_dim)};
              const std::size_t offset = static_cast<std::size_t>(b.block) * s.block_elems();
              out.push_back(pool_view(*e.e, self, offset, 5, shape, strides));
            }
            return out;
          },
          "The live request's KV, one array per block without a copy: [layer, k|v, kv_head,\n"
          "slot, dim] over its valid slots (views into Engine.kv).")
      .def_prop_ro("vocab", [](py_engine& e) { return e.model->cfg.vocab; })
      .def_prop_ro("n_layers", [](py_engine& e) { return e.model->cfg.n_layers; })
      .def_prop_ro("n_kv_heads", [](py_engine& e) { return e.model->cfg.n_kv_heads; })
      .def_prop_ro("head_dim", [](py_engine& e) { return e.model->cfg.head_dim; })
      .def_prop_ro("name", [](py_engine& e) { return e.model->cfg.name; })
      .def_prop_ro("arch", [](py_engine& e) { return e.model->cfg.arch; })
      .def_ro("path", &py_engine::path, "The GGUF file ('' for the synthetic model).")
      .def_ro("placement", &py_engine::placement)
      .def_ro("kv_dtype", &py_engine::kv_dtype)
      .def_ro("block_size", &py_engine::block_size)
      .def_ro("num_blocks", &py_engine::num_blocks)
      .def_prop_ro(
          "end_of_turn",
          [](py_engine& e) { return e.tok ? e.tok->end_of_turn() : relokv::token_t{-1}; },
          "The id that ends an answer (-1: none, the synthetic model).")
      .def_prop_ro(
          "fingerprint", [](py_engine& e) { return e.e->fingerprint(); },
          "The identity its stored blocks carry (model, RoPE, placement).")
      .def("__repr__", [](py_engine& e) {
        return "Engine(" + (e.path.empty() ? std::string("synthetic") : e.model->cfg.name) + ", " +
               e.placement + ", KV " + e.kv_dtype + ", " + std::to_string(e.num_blocks) +
               " blocks of " + std::to_string(e.block_size) + ")";
      });
}

}  // namespace relokv_py
