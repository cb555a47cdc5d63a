#include "llama_cpp_engine.hpp"

#include "llama_cpp_context.hpp"

#include <limits>
#include <stdexcept>
#include <string>

namespace relokv_llama_cpp {

template <class T>
engine<T>::engine(const std::string& gguf_path, engine_options opt)
    : p_(std::make_unique<impl>(gguf_path, std::move(opt))) {}

template <class T>
engine<T>::~engine() {
  if (p_ && p_->live) {
    try {
      close(p_->live_id, false);
    } catch (...) {  // a destructor does not throw
    }
  }
}

template <class T>
void engine<T>::impl::start(const relokv::request_layout& layout,
                            const relokv::recompute::any_strategy& strategy,
                            relokv_engine::prefill_stats* stats, const relokv::extra_keys& extras,
                            std::uint64_t principal) {
  if (layout.tokens.empty()) throw std::invalid_argument("llama.cpp engine: an empty request");
  check_tokens(layout.tokens, "llama.cpp engine: prefill");
  if (layout.tokens.size() >= static_cast<std::size_t>(opt.n_ctx))
    throw std::invalid_argument("llama.cpp engine: a request of " +
                                std::to_string(layout.tokens.size()) +
                                " tokens does not fit the context of " + std::to_string(opt.n_ctx) +
                                " cells (engine_options::n_ctx)");
  if (strategy.dynamic() || strategy.probes() || strategy.grouped() != nullptr)
    throw std::invalid_argument(
        "llama.cpp engine: this strategy chooses or weighs tokens between layers (CacheBlend's "
        "deviation, the question's attention, APE's groups); llama.cpp's public API computes a "
        "batch through every layer with no hook between them. Use none, first_k, seam_window "
        "or full");
  relokv::reuse_plan plan = cache->plan(layout, strategy, extras, principal);
  if (!plan.ok())
    throw relokv_engine::out_of_blocks("llama.cpp engine: out of KV blocks (" +
                                           std::to_string(plan.blocks_short) + " more needed)",
                                       plan.blocks_short);
  const relokv::request_id id = plan.id;
  clear();
  try {
    prompt_walk w = begin(layout, plan, stats);
    live.emplace(live_request{std::move(plan), static_cast<std::int32_t>(layout.tokens.size()),
                              std::move(w)});
  } catch (...) {
    cache->release(id);
    clear();
    throw;
  }
}

template <class T>
void engine<T>::impl::abandon() noexcept {
  if (!live) return;
  cache->release(live->plan.id);
  live.reset();
  clear();
}

template <class T>
auto engine<T>::open(const relokv::request_layout& layout,
                     const relokv::recompute::any_strategy& strategy,
                     relokv_engine::prefill_stats* stats, const relokv::extra_keys& extras,
                     std::uint64_t principal) -> seq_id {
  impl& m = *p_;
  if (m.live) throw relokv_engine::out_of_blocks("llama.cpp engine: one sequence at a time", 0);
  m.start(layout, strategy, stats, extras, principal);
  return m.live_id = m.next_seq++;
}

template <class T>
auto engine<T>::impl::sequence(seq_id s, const char* what) -> live_request& {
  if (!live || s != live_id)
    throw std::logic_error(std::string("llama.cpp engine: ") + what + ": no live sequence " +
                           std::to_string(s));
  return *live;
}

template <class T>
std::vector<float> engine<T>::prefill_step(seq_id s, std::int32_t max_rows,
                                           relokv_engine::prefill_stats* stats) {
  impl& m = *p_;
  auto& r = m.sequence(s, "prefill_step");
  if (!r.walk) throw std::logic_error("llama.cpp engine: prefill_step: the prompt is done");
  if (max_rows < 1) throw std::invalid_argument("llama.cpp engine: prefill_step: max_rows < 1");
  if (!m.advance(*r.walk, r.plan, max_rows, stats)) return {};
  r.walk.reset();
  return m.last_logits();
}

template <class T>
bool engine<T>::append(seq_id s, relokv::token_t token) {
  impl& m = *p_;
  auto& r = m.sequence(s, "append");
  if (r.walk) throw std::logic_error("llama.cpp engine: append before the prompt is done");
  m.check_tokens(std::span(&token, 1), "llama.cpp engine: append");
  if (r.n_tokens >= m.opt.n_ctx) return false;  // the context is full: no cell for it
  m.pending = token;
  return true;
}

template <class T>
std::vector<std::vector<float>> engine<T>::decode_step(std::span<const seq_id> seqs) {
  impl& m = *p_;
  std::vector<std::vector<float>> out;
  for (const seq_id s : seqs) {
    auto& r = m.sequence(s, "decode_step");
    if (m.pending < 0) throw std::logic_error("llama.cpp engine: decode_step without append");
    const relokv::token_t token = m.pending;
    m.pending = -1;
    m.decode_run(std::span(&token, 1), r.n_tokens, true);  // append() checked the cell
    ++r.n_tokens;
    out.push_back(m.last_logits());
  }
  return out;
}

template <class T>
void engine<T>::close(seq_id s, bool commit) {
  impl& m = *p_;
  if (!m.live || s != m.live_id) return;
  m.pending = -1;
  const relokv::request_id id = m.live->plan.id;
  try {
    if (commit && !m.live->walk) {  // a prompt not computed to its end has nothing to commit
      m.write_back(m.live->plan);
      m.cache->commit(id, *m.pool);  // and writes new blocks to the store, when there is one
    }
  } catch (...) {
    m.abandon();
    throw;
  }
  m.abandon();
}

template <class T>
std::int32_t engine<T>::live() const noexcept {
  return p_->live ? 1 : 0;
}

template <class T>
std::vector<float> engine<T>::plain_prefill(std::span<const relokv::token_t> tokens) {
  impl& m = *p_;
  if (m.live) throw std::logic_error("llama.cpp engine: end() the live request first");
  if (tokens.empty()) throw std::invalid_argument("llama.cpp engine: an empty request");
  m.check_tokens(tokens, "llama.cpp engine: plain_prefill");
  if (tokens.size() >= static_cast<std::size_t>(m.opt.n_ctx))
    throw std::invalid_argument("llama.cpp engine: " + std::to_string(tokens.size()) +
                                " tokens do not fit the context of " + std::to_string(m.opt.n_ctx) +
                                " cells");
  m.clear();
  try {
    m.decode_run(tokens, 0, true);
  } catch (...) {
    m.clear();
    throw;
  }
  auto logits = m.last_logits();
  m.clear();
  return logits;
}

template <class T>
typename engine<T>::cache_type& engine<T>::cache() noexcept {
  return *p_->cache;
}
template <class T>
std::int32_t engine<T>::n_vocab() const noexcept {
  return p_->vocab;
}
template <class T>
std::int32_t engine<T>::n_layers() const noexcept {
  return p_->layers;
}
template <class T>
std::uint64_t engine<T>::store_fingerprint() const noexcept {
  return p_->fingerprint;
}

template class engine<relokv::fp16>;
template class engine<float>;

}  // namespace relokv_llama_cpp
