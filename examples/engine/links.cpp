// Reading a span-link adapter (see links.hpp).
#include "links.hpp"

#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <relokv/hash/xxh3.hpp>

#include "gguf.hpp"
#include "llama_engine.hpp"

namespace relokv_engine {

std::shared_ptr<const link_adapter> load_links(const std::string& path, const llama_model& m) {
  const gguf_file f = gguf_file::open(path);
  const auto bad = [&](const std::string& what) { throw gguf_error(path, 0, what); };
  if (!f.has("general.architecture") || f.get_string("general.architecture") != "relokv-links")
    bad("not a span-link adapter (general.architecture is not \"relokv-links\")");
  auto a = std::make_shared<link_adapter>();
  a->path = path;
  a->n = static_cast<std::int32_t>(f.get_int("relokv.links.rows"));
  a->header = static_cast<std::int32_t>(f.get_int("relokv.links.header_rows", 0));
  a->trailer = static_cast<std::int32_t>(f.get_int("relokv.links.trailer_rows", 0));
  a->placement = f.get_string("relokv.links.placement");
  const bool corrects = f.has("relokv.links.lowrank_rank");
  if (a->n < (corrects ? 0 : 1) || a->n > 4096 || a->header < 0 || a->trailer < 0 ||
      std::int64_t{a->header} + a->trailer > a->n)
    bad("relokv.links.rows must be in [1, 4096] (0 with a low-rank correction) and "
        "header_rows + trailer_rows in [0, rows]");
  a->before_question = a->n - a->header - a->trailer;
  // The placement names where the rows go; the counts must say the same.
  const bool wraps = a->header + a->trailer > 0, before = a->before_question > 0;
  const std::string want = wraps && before ? "wrappers+before_question"
                           : wraps         ? "wrappers"
                           : before        ? "before_question"
                                           : "none";
  if (a->placement != want)
    bad("relokv.links.placement \"" + a->placement + "\" does not match its counts (" +
        std::to_string(a->header) + " header, " + std::to_string(a->trailer) + " trailer, " +
        std::to_string(a->before_question) + " before the question: \"" + want + "\")");
  const std::string depth =
      f.has("relokv.links.depth") ? f.get_string("relokv.links.depth") : "embedding";
  if (depth != "embedding" && depth != "kv")
    bad("relokv.links.depth \"" + depth + "\" (embedding or kv)");
  a->deep = depth == "kv";
  const auto dim = f.get_int("relokv.links.model_dim");
  const auto vocab = f.get_int("relokv.links.model_vocab");
  const std::string arch = f.get_string("relokv.links.model_arch");
  if (dim != m.cfg.dim || vocab != m.cfg.vocab || arch != m.cfg.arch)
    throw std::invalid_argument(
        path + ": an adapter for a " + arch + " model of dim " + std::to_string(dim) +
        " and vocabulary " + std::to_string(vocab) + ", not this " + m.cfg.arch + " of dim " +
        std::to_string(m.cfg.dim) + " and vocabulary " + std::to_string(m.cfg.vocab));
  a->model_sha256 = f.has("relokv.links.model_sha256") ? f.get_string("relokv.links.model_sha256")
                                                       : std::string();
  a->dim = m.cfg.dim;
  a->layers = m.cfg.n_layers;
  a->kv_dim = m.cfg.n_kv_heads * m.cfg.head_dim;
  if (corrects) {
    // The low-rank correction of span tokens' K/V: rank r, from layer `from` to the last.
    const auto r = f.get_int("relokv.links.lowrank_rank");
    const auto from = f.get_int("relokv.links.lowrank_first_layer", -1);
    if (r < 1 || r > 1024 || from < 0 || from >= a->layers)
      bad("relokv.links.lowrank_rank must be in [1, 1024] and relokv.links.lowrank_first_layer "
          "in [0, " +
          std::to_string(a->layers) + ")");
    a->lowrank = static_cast<std::int32_t>(r);
    a->lowrank_from = static_cast<std::int32_t>(from);
    const auto nl = static_cast<std::uint64_t>(a->layers - a->lowrank_from);
    const auto ur = static_cast<std::uint64_t>(r);
    const auto read = [&](const char* name, std::vector<std::uint64_t> dims, const char* what) {
      if (!f.has_tensor(name)) bad(std::string("a low-rank correction without the tensor ") + name);
      const gguf_tensor& t = f.tensor(name);
      if (t.type != ggml_type::kF32 || t.dims != dims)
        bad(std::string(name) + " must be F32 [" + std::to_string(dims[0]) + ", " +
            std::to_string(dims[1]) + ", " + std::to_string(dims[2]) + "] (" + what + ")");
      auto out = f.dequantize(t);
      for (const float x : out)
        if (!std::isfinite(x)) bad(std::string(name) + " holds a value that is not finite");
      return out;
    };
    a->lowrank_a = read("links.lowrank_a", {ur, static_cast<std::uint64_t>(a->dim), nl},
                        "rank, model dim, corrected layers");
    a->lowrank_b = read("links.lowrank_b", {2 * static_cast<std::uint64_t>(a->kv_dim), ur, nl},
                        "K|V of kv heads x head size, rank, corrected layers");
  }
  if (a->n == 0) {
    // A correction alone: no rows to read.
  } else if (a->deep) {
    // Every layer's K and V of each row: [rows][layers][2][kv_heads * head_dim].
    if (!f.has_tensor("links.kv")) bad("a deep adapter (depth kv) without the tensor links.kv");
    const gguf_tensor& t = f.tensor("links.kv");
    const std::vector<std::uint64_t> shape{static_cast<std::uint64_t>(a->kv_dim), 2,
                                           static_cast<std::uint64_t>(a->layers),
                                           static_cast<std::uint64_t>(a->n)};
    if (t.type != ggml_type::kF32 || t.dims != shape)
      bad("links.kv must be F32 [" + std::to_string(a->kv_dim) + ", 2, " +
          std::to_string(a->layers) + ", " + std::to_string(a->n) +
          "] (kv heads x head size, K|V, layers, rows)");
    a->kv = f.dequantize(t);
    for (const float x : a->kv)
      if (!std::isfinite(x)) bad("links.kv holds a value that is not finite");
    a->rows.assign(static_cast<std::size_t>(a->n) * static_cast<std::size_t>(a->dim), 0.0f);
  } else {
    if (!f.has_tensor("links.rows")) bad("no tensor links.rows");
    const gguf_tensor& t = f.tensor("links.rows");
    if (t.type != ggml_type::kF32 || t.dims.size() != 2 ||
        t.dims[0] != static_cast<std::uint64_t>(m.cfg.dim) ||
        t.dims[1] != static_cast<std::uint64_t>(a->n))
      bad("links.rows must be F32 [" + std::to_string(m.cfg.dim) + ", " + std::to_string(a->n) +
          "]");
    a->rows = f.dequantize(t);
    for (const float x : a->rows)
      if (!std::isfinite(x)) bad("links.rows holds a value that is not finite");
  }
  // The identity: the file's bytes, so that two adapters differ unless their files are equal.
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  const auto h = relokv::xxh3_128{}.digest(std::as_bytes(std::span<const char>(bytes)),
                                           relokv::hash_domain::kRoot);
  a->id = h.lo != 0 ? h.lo : 1;
  return a;
}

std::shared_ptr<const llama_model> with_links(std::shared_ptr<const llama_model> m,
                                              std::shared_ptr<const link_adapter> a) {
  auto out = std::make_shared<llama_model>(*m);
  out->links = std::move(a);
  return out;
}

}  // namespace relokv_engine
