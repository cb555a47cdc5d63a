// relokv._relokv: the module, its errors, layouts and recompute strategies.
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <relokv/layout/builder.hpp>
#include <relokv/layout/span_finder.hpp>
#include <relokv/types.hpp>

#include "bindings.hpp"
#include "gguf.hpp"
#include "llama_engine.hpp"
#include "model_path.hpp"

namespace relokv_py {

using namespace nb::literals;

namespace {

std::int64_t checked_id(std::int64_t v, std::size_t i, const char* what) {
  if (v < 0 || v > std::numeric_limits<relokv::token_t>::max())
    throw std::invalid_argument(std::string(what) + ": token " + std::to_string(v) + " at index " +
                                std::to_string(i) + " is not a token id (0 .. 2^31 - 1)");
  return v;
}

template <class T>
void append_ids(const nb::ndarray<nb::ro, nb::ndim<1>, nb::device::cpu>& a,
                std::vector<relokv::token_t>& out, const char* what) {
  const T* p = static_cast<const T*>(a.data());
  const std::int64_t stride = a.stride(0);
  for (std::size_t i = 0; i < a.shape(0); ++i) {
    const T v = p[static_cast<std::int64_t>(i) * stride];
    if constexpr (std::is_unsigned_v<T>) {
      if (v > static_cast<std::uint64_t>(std::numeric_limits<relokv::token_t>::max()))
        checked_id(-1, i, what);
    }
    out.push_back(static_cast<relokv::token_t>(checked_id(static_cast<std::int64_t>(v), i, what)));
  }
}

}  // namespace

std::vector<relokv::token_t> tokens_of(nb::handle h, const char* what) {
  std::vector<relokv::token_t> out;
  if (nb::isinstance<nb::str>(h) || nb::isinstance<nb::bytes>(h))
    throw nb::type_error((std::string(what) + ": token ids, not text (tokenize it first)").c_str());
  nb::ndarray<nb::ro, nb::ndim<1>, nb::device::cpu> a;
  if (nb::try_cast(h, a, /*convert=*/false)) {
    const auto dt = a.dtype();
    if (dt.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) &&
        dt.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt))
      throw nb::type_error((std::string(what) + ": an array of integer token ids").c_str());
    out.reserve(a.shape(0));
    const bool u = dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt);
    switch (dt.bits) {
      case 8:
        u ? append_ids<std::uint8_t>(a, out, what) : append_ids<std::int8_t>(a, out, what);
        break;
      case 16:
        u ? append_ids<std::uint16_t>(a, out, what) : append_ids<std::int16_t>(a, out, what);
        break;
      case 32:
        u ? append_ids<std::uint32_t>(a, out, what) : append_ids<std::int32_t>(a, out, what);
        break;
      case 64:
        u ? append_ids<std::uint64_t>(a, out, what) : append_ids<std::int64_t>(a, out, what);
        break;
      default:
        throw nb::type_error((std::string(what) + ": an array of integer token ids").c_str());
    }
    return out;
  }
  if (!nb::isinstance<nb::sequence>(h))
    throw nb::type_error((std::string(what) + ": a sequence or 1-D array of token ids").c_str());
  const nb::sequence seq = nb::borrow<nb::sequence>(h);
  std::size_t i = 0;
  for (nb::handle item : seq) {
    std::int64_t v = 0;
    if (nb::isinstance<nb::bool_>(item) || !nb::try_cast(item, v, false))
      throw nb::type_error(
          (std::string(what) + ": item " + std::to_string(i) + " is not an int token id").c_str());
    out.push_back(static_cast<relokv::token_t>(checked_id(v, i, what)));
    ++i;
  }
  return out;
}

strategy make_strategy(const std::string& name, std::int64_t k, double ratio) {
  static const auto table = relokv_engine::strategy_table();
  strategy s;
  bool found = false;
  for (const auto& n : table) {
    if (n.key != name) continue;
    s.key = n.key;
    s.name = n.name;
    s.note = n.note;
    s.spec = n.spec;
    s.spans = n.spans;
    found = true;
  }
  if (!found) {
    static const char* kinds[] = {"none",  "full",           "first_k",  "seam_window", "kvboost",
                                  "union", "deviation_topk", "question", "ape"};
    for (const char* kind : kinds) found = found || name == kind;
    if (!found) {
      std::string known;
      for (const auto& n : table) known += n.key + ", ";
      for (const char* kind : kinds) known += std::string(kind) + ", ";
      known.resize(known.size() - 2);
      throw std::invalid_argument("unknown strategy '" + name + "' (" + known + ")");
    }
    s.key = name;
    s.spec.kind = name;
  }
  if (k >= 0) {
    if (k > std::numeric_limits<std::int32_t>::max())
      throw std::invalid_argument("strategy " + name + ": k = " + std::to_string(k) +
                                  " is too large");
    s.spec.k = static_cast<std::int32_t>(k);
  }
  if (ratio >= 0) s.spec.ratio = static_cast<float>(ratio);
  if (s.name.empty() || k >= 0 || ratio >= 0)
    s.name = s.spec.label();  // a kind, or a budget changed
  s.made = s.spec.make();     // checks the budget
  return s;
}

relokv::any_store open_store(const std::optional<std::string>& url,
                             const std::optional<std::string>& seal_key_env,
                             const std::optional<std::string>& seal_key_file, const char* who) {
  if (!url) {
    if (seal_key_env || seal_key_file)
      throw relokv::error(std::string(who) + ": a seal key needs a store");
    return {};
  }
  relokv::seal_options seal;
  seal.key_env = seal_key_env.value_or("");
  seal.key_file = seal_key_file.value_or("");
  return relokv::any_store::from_url(*url, seal);
}

std::string model_path_of(const std::string& model) {
  if (model.find('/') != std::string::npos || model.ends_with(".gguf")) return model;
  const std::string p = relokv_engine::default_model_path(model);  // throws for an unknown name
  if (p.empty())
    throw model_missing("model " + model + " is not fetched: run scripts/get-model " + model);
  return p;
}

strategy_ref::strategy_ref(nb::handle h) {
  if (nb::isinstance<strategy>(h)) {
    p_ = nb::inst_ptr<strategy>(h);
  } else if (nb::isinstance<nb::str>(h)) {
    own_ = make_strategy(nb::cast<std::string>(h), -1, -1);
    p_ = &*own_;
  } else {
    throw nb::type_error("strategy: a relokv.Strategy or a strategy's name");
  }
}

}  // namespace relokv_py

namespace {

using namespace relokv_py;
using namespace nb::literals;
namespace nb = nanobind;

const char* kind_name(relokv::segment_kind k) {
  switch (k) {
    case relokv::segment_kind::kPrefix:
      return "prefix";
    case relokv::segment_kind::kSpan:
      return "span";
    case relokv::segment_kind::kDependent:
      return "dependent";
  }
  return "?";
}

void bind_layout(nb::module_& m) {
  nb::class_<relokv::request_layout>(
      m, "Layout",
      "A request laid out for the cache: its tokens, segments (prefix, spans, dependent\n"
      "segments) and blocks. Made by LayoutBuilder.build() or Engine.layout().")
      .def_prop_ro("block_size", [](const relokv::request_layout& l) { return l.block_size; })
      .def_prop_ro("num_tokens", &relokv::request_layout::num_tokens, "Tokens of the request.")
      .def_prop_ro("num_blocks", &relokv::request_layout::num_blocks,
                   "Blocks of the request (each segment starts a block).")
      .def_prop_ro(
          "tokens", [](const relokv::request_layout& l) { return to_numpy(std::vector(l.tokens)); },
          nb::rv_policy::automatic, "The request's token ids in order (a copy, int32).")
      .def_prop_ro(
          "segments",
          [](const relokv::request_layout& l) {
            std::vector<
                std::tuple<std::string, std::int32_t, std::int32_t, std::int32_t, std::int32_t>>
                v;
            for (const auto& s : l.segments)
              v.emplace_back(kind_name(s.kind), s.first_token, s.num_tokens, s.first_block,
                             s.num_blocks);
            return v;
          },
          "Each segment as (kind, first_token, num_tokens, first_block, num_blocks).")
      .def_prop_ro(
          "blocks",
          [](const relokv::request_layout& l) {
            std::vector<std::tuple<std::int32_t, std::int32_t, std::int32_t, bool>> v;
            for (const auto& b : l.blocks) v.emplace_back(b.pos0, b.len, b.segment, b.sealed);
            return v;
          },
          "Each block as (first position, tokens, segment index, sealed).")
      .def_prop_ro(
          "adapter_id", [](const relokv::request_layout& l) { return l.adapter_id; },
          "The span-link adapter the layout reads (0: none).")
      .def("__len__", &relokv::request_layout::num_tokens)
      .def("__eq__",
           [](const relokv::request_layout& a, const relokv::request_layout& b) { return a == b; })
      .def("__repr__", [](const relokv::request_layout& l) {
        std::string s = "Layout(" + std::to_string(l.num_tokens()) + " tokens, " +
                        std::to_string(l.num_blocks()) + " blocks:";
        for (const auto& g : l.segments)
          s += std::string(" ") + kind_name(g.kind) + "[" + std::to_string(g.num_tokens) + "]";
        return s + ")";
      });

  nb::class_<relokv::layout_builder>(
      m, "LayoutBuilder",
      "Builds a Layout segment by segment, each call returning the builder:\n\n"
      "    LayoutBuilder(16).prefix(system).span(doc_a).span(doc_b).question(q).build()\n\n"
      "Token ids are a list of ints or a 1-D integer array. Errors (an empty segment, a call\n"
      "after question(), a token outside the vocabulary) raise LayoutError.")
      .def(
          "__init__",
          [](relokv::layout_builder* self, std::int32_t block_size,
             std::optional<std::int64_t> vocab, std::int32_t max_segment_tokens) {
            if (block_size <= 0 || block_size > relokv::kMaxBlockSize ||
                (block_size & (block_size - 1)) != 0)
              throw relokv::error("LayoutBuilder: block_size must be a power of two in [1, " +
                                  std::to_string(relokv::kMaxBlockSize) + "], got " +
                                  std::to_string(block_size));
            if (vocab && *vocab <= 0)
              throw relokv::error("LayoutBuilder: vocab must be positive, got " +
                                  std::to_string(*vocab));
            if (max_segment_tokens <= 0)
              throw relokv::error("LayoutBuilder: max_segment_tokens must be positive");
            new (self) relokv::layout_builder(
                block_size, vocab.value_or(std::numeric_limits<relokv::token_t>::max()),
                max_segment_tokens);
          },
          "block_size"_a = 16, "vocab"_a = nb::none(), "max_segment_tokens"_a = 1 << 20,
          "block_size: tokens per block (a power of two; the cache's). vocab: ids must be below\n"
          "it (default: any int32).")
      .def(
          "prefix",
          [](relokv::layout_builder& b, nb::handle t) -> relokv::layout_builder& {
            return b.prefix(tokens_of(t, "prefix"));
          },
          "tokens"_a, nb::rv_policy::reference,
          nb::sig("def prefix(self, tokens: collections.abc.Sequence[int] | "
                  "numpy.typing.ArrayLike) -> LayoutBuilder"),
          "The shared prefix (first, at most once): reused by exact key, the spans' context.")
      .def(
          "span",
          [](relokv::layout_builder& b, nb::handle t) -> relokv::layout_builder& {
            return b.span(tokens_of(t, "span"));
          },
          "tokens"_a, nb::rv_policy::reference,
          nb::sig("def span(self, tokens: collections.abc.Sequence[int] | numpy.typing.ArrayLike) "
                  "-> LayoutBuilder"),
          "A relocatable span: cached once, reused at any position behind the same context.")
      .def(
          "span_context",
          [](relokv::layout_builder& b, nb::handle t) -> relokv::layout_builder& {
            return b.span_context(tokens_of(t, "span_context"));
          },
          "tokens"_a, nb::rv_policy::reference,
          nb::sig("def span_context(self, tokens: collections.abc.Sequence[int] | "
                  "numpy.typing.ArrayLike) -> LayoutBuilder"),
          "What the spans were computed behind, instead of the prefix (a sink absorber).")
      .def(
          "dependent",
          [](relokv::layout_builder& b, nb::handle t,
             std::int32_t last_n) -> relokv::layout_builder& {
            if (last_n < 0 || last_n > relokv::kMaxDepWindow)
              throw relokv::error("dependent: last_n must be in [0, " +
                                  std::to_string(relokv::kMaxDepWindow) + "], got " +
                                  std::to_string(last_n));
            return b.dependent(tokens_of(t, "dependent"), last_n);
          },
          "tokens"_a, "last_n"_a = 0, nb::rv_policy::reference,
          nb::sig("def dependent(self, tokens: collections.abc.Sequence[int] | "
                  "numpy.typing.ArrayLike, last_n: int = 0) -> LayoutBuilder"),
          "A segment bound to every token before it (last_n = 0) or to the last last_n.")
      .def(
          "question",
          [](relokv::layout_builder& b, nb::handle t) -> relokv::layout_builder& {
            return b.question(tokens_of(t, "question"));
          },
          "tokens"_a, nb::rv_policy::reference,
          nb::sig("def question(self, tokens: collections.abc.Sequence[int] | "
                  "numpy.typing.ArrayLike) -> LayoutBuilder"),
          "The question: bound to everything before it; it ends the request.")
      .def("build", &relokv::layout_builder::build,
           "The Layout (raises LayoutError when invalid).");
}

void bind_strategy(nb::module_& m) {
  nb::class_<strategy>(m, "Strategy",
                       "A recompute strategy: which reused tokens a request computes again.")
      .def(
          "__init__",
          [](strategy* self, const std::string& name, std::optional<std::int64_t> k,
             std::optional<double> ratio) {
            if (k && *k < 0) throw relokv::error("Strategy: k must be >= 0");
            if (ratio && !(*ratio >= 0.0 && *ratio <= 1.0))
              throw relokv::error("Strategy: ratio must be in [0, 1]");
            new (self) strategy(make_strategy(name, k.value_or(-1), ratio.value_or(-1.0)));
          },
          "name"_a, "k"_a = nb::none(), "ratio"_a = nb::none(),
          "name: a named strategy (relokv.strategies(): full, prefix, naive, epic, kvboost,\n"
          "cacheblend, ...) or a kind (none, full, first_k, seam_window, kvboost, union,\n"
          "deviation_topk, question, ape); k and ratio override its budget (first tokens of\n"
          "a span, share of reused tokens).")
      .def_ro("key", &strategy::key, "The name it was made from.")
      .def_ro("name", &strategy::name, "What the tables print.")
      .def_ro("note", &strategy::note)
      .def_ro("spans", &strategy::spans,
              "False for 'prefix': the prompt is one prefix, reused by exact key only.")
      .def_prop_ro("kind", [](const strategy& s) { return s.spec.kind; })
      .def_prop_ro("k", [](const strategy& s) { return s.spec.k; })
      .def_prop_ro("ratio", [](const strategy& s) { return s.spec.ratio; })
      .def_prop_ro(
          "dynamic", [](const strategy& s) { return s.made.dynamic(); },
          "Whether it measures deviation between layers (CacheBlend, KVBoost).")
      .def("__repr__",
           [](const strategy& s) { return "Strategy('" + s.key + "': " + s.name + ")"; });

  // Spans found in a plain prompt's tokens (relokv::find_spans; docs/span-finding.md).
  nb::class_<relokv::span_index>(
      m, "SpanIndex",
      "The spans find_spans has cut, remembered by hash (per namespace: a tenant's) so that\n"
      "they are found again wherever they recur. Thread-safe, bounded (capacity spans).")
      .def(
          "__init__",
          [](relokv::span_index* self, std::int64_t capacity) {
            if (capacity < 1) throw relokv::error("SpanIndex: capacity must be at least 1");
            new (self) relokv::span_index(static_cast<std::size_t>(capacity));
          },
          "capacity"_a = 65536)
      .def("__len__", &relokv::span_index::size);
  m.def(
      "find_spans",
      [](nb::handle ids_h, const std::vector<std::string>& pieces, std::int32_t min_span,
         const std::vector<std::int32_t>& forced, relokv::span_index* known, std::uint64_t tenant) {
        const auto ids = tokens_of(ids_h, "find_spans: ids");
        if (ids.size() != pieces.size())
          throw relokv::error("find_spans: " + std::to_string(ids.size()) + " ids but " +
                              std::to_string(pieces.size()) + " pieces");
        if (min_span < 1) throw relokv::error("find_spans: min_span must be at least 1");
        relokv::span_finder_options o;
        o.min_span = min_span;
        std::vector<std::tuple<std::string, std::int32_t, std::int32_t, bool>> out;
        nb::gil_scoped_release unlocked;
        for (const auto& g : relokv::find_spans(ids, pieces, o, forced, known, tenant)) {
          const char* kind = g.kind == relokv::found_kind::kPrefix     ? "prefix"
                             : g.kind == relokv::found_kind::kSpan     ? "span"
                             : g.kind == relokv::found_kind::kQuestion ? "question"
                                                                       : "dependent";
          out.emplace_back(kind, g.begin, g.end, g.remembered);
        }
        return out;
      },
      "ids"_a, "pieces"_a, "min_span"_a = 16, "forced"_a = std::vector<std::int32_t>{},
      "known"_a = nb::none(), "tenant"_a = 0,
      "Cuts a plain prompt's tokens into segments, whatever format joins its passages:\n"
      "(kind, begin, end, remembered) tiling the prompt, kind one of prefix, span, dependent,\n"
      "question. pieces[i]: the text token i stands for. forced: cuts that must be made\n"
      "(where each message's text starts). known: a SpanIndex, matched and filled (in the\n"
      "tenant's namespace). The same function relokv_server --spans auto calls.");
  m.def(
      "strategies",
      []() {
        std::vector<std::tuple<std::string, std::string, std::string>> v;
        for (const auto& n : relokv_engine::strategy_table()) v.emplace_back(n.key, n.name, n.note);
        return v;
      },
      "The named strategies as (key, name, note), full recompute first.");
}

}  // namespace

NB_MODULE(_relokv, m) {
  m.doc() =
      "relokv: relocatable KV-cache management (the C++ library, the example engine and\n"
      "the QA job). See docs/python.md.";
  // Errors: the C++ message, as a Python exception of its kind.
  static nb::exception<relokv::error> err(m, "Error", PyExc_ValueError);
  static nb::exception<relokv::layout_error> layout_err(m, "LayoutError", err);
  static nb::exception<relokv_engine::gguf_error> model_err(m, "ModelError", PyExc_RuntimeError);
  static nb::exception<relokv_engine::out_of_blocks> oob(m, "OutOfBlocks", PyExc_RuntimeError);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {
        try {
          std::rethrow_exception(p);
        } catch (const model_missing& e) {
          PyErr_SetString(static_cast<PyObject*>(type), e.what());
        }
      },
      model_err.ptr());
  err.attr("__doc__") = "A value relokv refuses (a bad layout, budget, block id, store URL...).";
  layout_err.attr("__doc__") = "A layout that breaks a rule (names the builder call).";
  model_err.attr("__doc__") = "A missing, corrupt or unsupported model file.";
  oob.attr("__doc__") = "The KV pool cannot hold the request now (nothing was kept).";
  m.attr("__version__") = "0.1.0";
  bind_layout(m);
  bind_strategy(m);
  bind_cache(m);
  bind_engine(m);
  bind_rag(m);
}
