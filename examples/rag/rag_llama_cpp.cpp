// The QA job on relokv inside llama.cpp (built where the llama.cpp component is).
#include <optional>
#include <stdexcept>
#include <string>

#include "llama_cpp_engine.hpp"
#include "run_engine.hpp"
#include "store_loop.hpp"

namespace relokv_rag::detail {

namespace {
template <class T, class F>
std::vector<variant_result> run_on(const relokv_engine::llama_model& m, const workload& w,
                                   const text_codec& codec, const std::vector<variant>& variants,
                                   const run_options& opt, bool with_floor) {
  // The longest prompt and its answer, in whole blocks, and a block to spare.
  const auto n_ctx = std::max<std::int32_t>(
      64, static_cast<std::int32_t>(
              ((longest_prompt(w) + static_cast<std::size_t>(opt.max_answer)) / 16 + 2) * 16));
  relokv_llama_cpp::engine_options eo;
  eo.num_blocks = opt.num_blocks;
  eo.n_ctx = n_ctx;
  eo.links = m.links;
  relokv_llama_cpp::engine<T> eng(opt.model_path, std::move(eo));
  std::optional<relokv::link_rows> adapter;
  if (m.links) {
    if (eng.n_vocab() != m.cfg.vocab)
      throw std::invalid_argument("engine llama.cpp: llama.cpp reads a vocabulary of " +
                                  std::to_string(eng.n_vocab()) + " tokens, relokv's reader " +
                                  std::to_string(m.cfg.vocab) +
                                  ": the adapter's ids would not be past it");
    adapter = m.links->layout_rows(m.cfg.vocab);
  }
  std::unique_ptr<relokv_llama_cpp::engine<F>> floor;
  if (with_floor) {
    relokv_llama_cpp::engine_options fo;
    fo.num_blocks = n_ctx / 16 + 4;  // one prompt
    fo.n_ctx = n_ctx;
    floor = std::make_unique<relokv_llama_cpp::engine<F>>(opt.model_path, std::move(fo));
  }
  const auto block_bytes = static_cast<std::int64_t>(m.cfg.n_layers) * 2 * m.cfg.n_kv_heads * 16 *
                           m.cfg.head_dim * static_cast<std::int64_t>(sizeof(T));
  engine_under_test e;
  e.eng = &eng;
  e.floor = floor.get();
  e.blocks_in_use = [&eng] {
    return std::int64_t{eng.cache().allocator().capacity() - eng.cache().allocator().num_free()};
  };
  e.n_layers = eng.n_layers();
  e.block_bytes = block_bytes;
  return run_engine(e, w, codec, variants, opt, adapter);
}
}  // namespace

std::vector<variant_result> run_llama_cpp(std::shared_ptr<const relokv_engine::llama_model> model,
                                          const workload& w, const text_codec& codec,
                                          const std::vector<variant>& variants,
                                          const run_options& opt) {
  if (opt.model_path.empty())
    throw std::invalid_argument(
        "engine llama.cpp: needs a GGUF model (--model), not the "
        "synthetic one");
  for (const variant& v : variants) {
    const auto& s = v.strategy;
    if (s.dynamic() || s.probes() || s.grouped() != nullptr)
      throw std::invalid_argument(
          "engine llama.cpp: variant '" + v.key +
          "' chooses or weighs tokens between layers, and llama.cpp's public API has no hook "
          "there; with llama.cpp use full, prefix, naive, block, epic or seam");
  }
  if (opt.kv_dtype == "fp32") return run_on<float, float>(*model, w, codec, variants, opt, false);
  return run_on<relokv::fp16, float>(*model, w, codec, variants, opt, opt.noise_floor);
}

namespace {
/// The store mode's engines: the requests' longest prompt and answer fit their context.
relokv_llama_cpp::engine_options store_engine(const workload& w, const store_mode_options& opt,
                                              bool with_store) {
  if (opt.model_path.empty())
    throw std::invalid_argument("engine llama.cpp: needs a GGUF model (--model)");
  relokv_llama_cpp::engine_options eo;
  eo.num_blocks = opt.num_blocks;
  eo.n_ctx = std::max<std::int32_t>(
      64, static_cast<std::int32_t>(
              ((longest_prompt(w) + static_cast<std::size_t>(opt.max_answer)) / 16 + 2) * 16));
  if (with_store) eo.store = open_store(opt);
  return eo;
}
}  // namespace

writer_report run_writer_llama_cpp(const workload& w, const store_mode_options& opt) {
  relokv_llama_cpp::engine<relokv::fp16> eng(opt.model_path, store_engine(w, opt, true));
  return writer_on(eng, w);
}

reader_report run_reader_llama_cpp(const workload& w, const text_codec& codec,
                                   const std::vector<variant>& variants,
                                   const store_mode_options& opt) {
  for (const variant& v : variants)
    if (v.strategy.dynamic() || v.strategy.probes() || v.strategy.grouped() != nullptr)
      throw std::invalid_argument("engine llama.cpp: variant '" + v.key +
                                  "' needs a hook between layers that llama.cpp's API lacks");
  relokv_llama_cpp::engine<relokv::fp16> full(opt.model_path, store_engine(w, opt, false));
  relokv_llama_cpp::engine<relokv::fp16> eng(opt.model_path, store_engine(w, opt, true));
  return reader_on(full, eng, w, codec, variants, opt);
}

}  // namespace relokv_rag::detail
