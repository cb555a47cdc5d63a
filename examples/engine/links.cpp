// Reading a span-link adapter (see links.hpp).
#include "links.hpp"

#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <relokv/hash/xxh3.hpp>

#include "gguf.hpp"
#include "llama.hpp"

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
  a->placement = f.get_string("relokv.links.placement");
  if (a->placement != "before_question")
    bad("relokv.links.placement \"" + a->placement + "\" (this engine reads before_question)");
  if (a->n < 1 || a->n > 4096 || a->header < 0 || a->header > a->n)
    bad("relokv.links.rows must be in [1, 4096] and header_rows in [0, rows]");
  a->before_question = a->n - a->header;
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
  if (!f.has_tensor("links.rows")) bad("no tensor links.rows");
  const gguf_tensor& t = f.tensor("links.rows");
  if (t.type != ggml_type::kF32 || t.dims.size() != 2 ||
      t.dims[0] != static_cast<std::uint64_t>(m.cfg.dim) ||
      t.dims[1] != static_cast<std::uint64_t>(a->n))
    bad("links.rows must be F32 [" + std::to_string(m.cfg.dim) + ", " + std::to_string(a->n) + "]");
  a->dim = m.cfg.dim;
  a->rows = f.dequantize(t);
  for (const float x : a->rows)
    if (!std::isfinite(x)) bad("links.rows holds a value that is not finite");
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
