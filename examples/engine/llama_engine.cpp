// The example engine's requests (llama_engine.hpp): plan, prefill in chunks, batched decode,
// commit.
#include "llama_engine.hpp"
#include "forward.hpp"
#include "layer_attention.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <relokv/attention/kv_append.hpp>
#include <relokv/engine/request_kv.hpp>

namespace relokv_engine {
using detail::grouped_reader;
using detail::head;
using detail::mass_probe;
using detail::run_layers;

namespace {
/// The layer loop's K/V of a live request: relokv::request_kv, the integration API the README
/// teaches (its slots, writes and attention calls), by position.
template <class Cache, class T>
class request_pass_kv final : public detail::pass_kv<T> {
 public:
  explicit request_pass_kv(relokv::request_kv<Cache, T>& req) : req_(&req) {}
  void write(std::int32_t l, std::int32_t pos, const float* k, const float* v) override {
    req_->write(l, req_->slot_at(pos), k, v);  // a reused token's slot writes nothing
  }
  relokv::attention_params<T> attention(std::int32_t l) const override {
    return req_->attention(l);
  }
  std::pair<relokv::block_id, std::int32_t> where(std::int32_t pos) const override {
    const relokv::token_slot t = req_->slot_at(pos);
    return {t.block(), t.slot()};
  }

 private:
  relokv::request_kv<Cache, T>* req_;
};
}  // namespace

template <class P, class T>
struct llama_engine<P, T>::live_request {
  // The request's KV in the library's words: fetches, copies, (position, block, slot) of each
  // computed token, the last-token rule, decode's blocks, commit and release.
  std::optional<relokv::request_kv<cache_type, T>> req;
  std::optional<request_pass_kv<cache_type, T>> kv;  // the layer loop's view of req
  std::vector<relokv::token_t> tokens;
  std::optional<grouped_reader> reader;  // APE requests: prefill's and decode's reader rows
  relokv::request_layout layout;
  relokv::recompute::any_strategy strategy;
  std::vector<std::uint8_t> mask, reused;  // the plan's, per position
  std::vector<std::uint8_t> span_rows;     // per position: a span's own token (a correction's)
  std::vector<std::int32_t> pending;       // positions still to compute, ascending
  bool chunks = true;                      // a static strategy: the prompt may come in chunks
  bool prefilled = false;                  // the prompt's logits were returned
  bool appended = false;                   // a token waits for decode_step
  bool committed = false;                  // commit() registered the prompt's blocks
};

namespace {
template <class P, class T>
typename llama_engine<P, T>::cache_type make_cache(const llama_model& m,
                                                   const relokv::host_kv_storage<T>& kv,
                                                   std::int32_t num_blocks, std::int32_t block_size,
                                                   relokv::any_store store) {
  using cache_t = typename llama_engine<P, T>::cache_type;
  if (!store) return cache_t(relokv::lru_block_pool(num_blocks), block_size);
  const relokv::store_options so{
      relokv::store_fingerprint(m.cfg.weights_id, relokv::layer_rope(m.cfg.geometry(), 1), P::kind),
      kv.block_layout()};
  return cache_t(relokv::lru_block_pool(num_blocks), block_size, relokv::xxh3_128(),
                 relokv::recompute::any_strategy(), std::move(store), so);
}
}  // namespace

template <class P, class T>
llama_engine<P, T>::llama_engine(std::shared_ptr<const llama_model> model, std::int32_t num_blocks,
                                 std::int32_t block_size, relokv::any_store store)
    : model_(std::move(model)),
      rope_(model_->cfg.geometry(), 8192),
      kv_(relokv::kv_shape{model_->cfg.n_layers, num_blocks, model_->cfg.n_kv_heads, block_size,
                           model_->cfg.head_dim}),
      cache_(make_cache<P, T>(*model_, kv_, num_blocks, block_size, std::move(store))) {}

template <class P, class T>
std::uint64_t llama_engine<P, T>::store_fingerprint() const noexcept {
  return relokv::store_fingerprint(model_->cfg.weights_id, rope_, P::kind);
}

template <class P, class T>
llama_engine<P, T>::~llama_engine() = default;

template <class P, class T>
typename llama_engine<P, T>::live_request& llama_engine<P, T>::seq(seq_id s,
                                                                   const char* what) const {
  const auto it = seqs_.find(s);
  if (it == seqs_.end())
    throw std::logic_error(std::string("llama_engine::") + what + ": no live sequence " +
                           std::to_string(s));
  return *it->second;
}

template <class P, class T>
std::vector<relokv::block_entry> llama_engine<P, T>::block_table(seq_id s) const {
  const live_request& r = seq(s, "block_table");
  if (!r.req) return {};
  const auto b = r.req->blocks();
  return {b.begin(), b.end()};
}

template <class P, class T>
typename llama_engine<P, T>::seq_id llama_engine<P, T>::open(
    const relokv::request_layout& layout, const relokv::recompute::any_strategy& strategy,
    prefill_stats* stats, const relokv::extra_keys& extras, std::uint64_t principal) {
  check_tokens(*model_, layout.tokens, "llama_engine::prefill");
  auto r = std::make_unique<live_request>();
  auto plan = cache_.plan(layout, strategy, extras, principal);
  if (!plan.ok())
    throw out_of_blocks(
        "llama_engine: out of KV blocks (" + std::to_string(plan.blocks_short) + " more needed)",
        plan.blocks_short);
  // Writes the store's blocks, then performs the copies (which may read them).
  r->req.emplace(cache_, kv_, rope_, layout, std::move(plan));
  const relokv::reuse_plan& pl = r->req->plan();
  r->kv.emplace(*r->req);
  r->tokens = layout.tokens;
  r->layout = layout;
  r->strategy = strategy;
  r->mask = pl.compute;
  r->reused = pl.reused_mask();
  if (model_->links && model_->links->lowrank > 0) {
    // What the adapter's low-rank correction changes: the spans' own tokens (not their link
    // rows), wherever a pass computes them, in a request read under the adapter only (its
    // identity keys the blocks; a request without it is the model's own, its spans too).
    r->span_rows.assign(layout.tokens.size(), 0);
    for (const relokv::segment& sg : layout.segments) {
      if (layout.adapter_id != model_->links->id) break;
      if (sg.kind != relokv::segment_kind::kSpan) continue;
      for (std::int32_t p = sg.first_token; p < sg.first_token + sg.num_tokens; ++p)
        r->span_rows[static_cast<std::size_t>(p)] =
            layout.tokens[static_cast<std::size_t>(p)] < model_->cfg.vocab ? 1 : 0;
    }
  }
  // The tokens to compute, by position. The library adds the last token when the plan reuses
  // it (its hidden state gives the logits) with write == false: its K/V are cached already,
  // in a block that may be shared, and request_kv::write through its slot writes nothing.
  for (const relokv::token_slot& t : r->req->prefill_tokens()) r->pending.push_back(t.pos());
  r->chunks = !strategy.dynamic() && !strategy.probes() && strategy.grouped() == nullptr;
  if (stats) {
    stats->tokens = layout.num_tokens();
    stats->computed = static_cast<std::int32_t>(r->pending.size());
    stats->exact_hits = pl.exact_hits;
    stats->relocated_hits = pl.relocated_hits;
    stats->misses = pl.misses;
    stats->store_hits = pl.store_hits;
    stats->pool_blocks = stats->store_blocks = stats->computed_blocks = 0;
    for (const auto& pb : pl.blocks) {
      stats->pool_blocks += pb.tier == relokv::block_tier::kPool;
      stats->store_blocks += pb.tier == relokv::block_tier::kStore;
      stats->computed_blocks += pb.tier == relokv::block_tier::kComputed;
    }
    stats->token_layers = 0;
    stats->check_deviation.clear();
    stats->check_kept.clear();
  }
  const seq_id id = next_++;
  seqs_.emplace(id, std::move(r));
  return id;
}

template <class P, class T>
std::int32_t llama_engine<P, T>::prefill_remaining(seq_id s) const {
  const live_request& r = seq(s, "prefill_remaining");
  return r.prefilled ? 0 : std::max<std::int32_t>(static_cast<std::int32_t>(r.pending.size()), 1);
}

template <class P, class T>
std::vector<float> llama_engine<P, T>::prefill_step(seq_id s, std::int32_t max_rows,
                                                    prefill_stats* stats) {
  live_request& r = seq(s, "prefill_step");
  if (r.prefilled) throw std::logic_error("llama_engine::prefill_step: the prompt is done");
  if (max_rows < 1) throw std::invalid_argument("llama_engine::prefill_step: max_rows < 1");
  const relokv::recompute::any_strategy& strategy = r.strategy;
  std::vector<float> hidden;
  // A pass over this request's layers at `positions`; a dynamic strategy adds its state.
  const auto pass = [&](std::vector<std::int32_t> positions) {
    detail::layer_pass<T> p;
    p.model = model_.get();
    p.kv = &*r.kv;
    p.tokens = &r.tokens;
    p.positions = std::move(positions);
    p.trace = stats;
    p.span_rows = &r.span_rows;
    return p;
  };
  if (r.chunks) {
    // In position order: each chunk's queries read the keys the earlier chunks wrote.
    const auto n = std::min<std::size_t>(static_cast<std::size_t>(max_rows), r.pending.size());
    std::vector<std::int32_t> chunk(r.pending.begin(),
                                    r.pending.begin() + static_cast<std::ptrdiff_t>(n));
    r.pending.erase(r.pending.begin(), r.pending.begin() + static_cast<std::ptrdiff_t>(n));
    run_layers<P, T>(pass(std::move(chunk)), hidden);
    if (!r.pending.empty()) return {};
  } else {
    auto positions = std::move(r.pending);
    r.pending.clear();
    auto& mask = r.mask;
    const auto& reused = r.reused;
    // Tokens a combined strategy computes at every layer (EPIC's first k of first_k_and_topk).
    std::vector<std::uint8_t> pinned(mask.size(), 0);
    std::vector<relokv::block_status> status;
    for (const auto& pb : r.req->plan().blocks) status.push_back(pb.status);
    strategy.pin(r.layout, status, pinned);
    if (strategy.probes()) {
      // question_topk: the question first, over the spans as cached (the probe), then the
      // tokens its attention chose with everything computed anyway, as a static mask. The
      // probe's work counts: its tokens are computed twice.
      const auto keep = [&](const std::vector<std::uint8_t>& m) {
        std::vector<std::int32_t> out;
        for (std::size_t i = 0; i < positions.size(); ++i)
          if (m[static_cast<std::size_t>(positions[i])] || i + 1 == positions.size())
            out.push_back(positions[i]);
        return out;
      };
      std::vector<std::uint8_t> base(mask.size()), rows(mask.size(), 0);
      for (std::size_t t = 0; t < mask.size(); ++t)
        base[t] = mask[t] && (!reused[t] || pinned[t]) ? 1 : 0;
      strategy.query_rows(r.layout, rows);
      std::vector<float> mass(mask.size(), 0.0f);
      const mass_probe probe{&rows, &mass, &strategy};
      auto probing = pass(keep(base));
      probing.probe = &probe;
      run_layers<P, T>(std::move(probing), hidden);
      strategy.choose(mass, reused, mask, pinned);
      positions = keep(mask);
      if (stats) {
        stats->computed = static_cast<std::int32_t>(positions.size());
        stats->check_deviation = mass;
        stats->check_kept = mask;
      }
      run_layers<P, T>(pass(std::move(positions)), hidden);
    } else {
      if (const auto* a = strategy.grouped()) r.reader.emplace(grouped_reader{*a, r.layout});
      auto dynamic = pass(std::move(positions));
      dynamic.strategy = &strategy;
      dynamic.mask = &mask;
      dynamic.reused = &reused;
      dynamic.pinned = &pinned;
      dynamic.reader = r.reader ? &*r.reader : nullptr;
      run_layers<P, T>(std::move(dynamic), hidden);
    }
  }
  r.prefilled = true;
  return head(*model_, hidden, /*decode=*/false);
}

template <class P, class T>
bool llama_engine<P, T>::append(seq_id s, relokv::token_t token) {
  live_request& r = seq(s, "append");
  if (!r.prefilled) throw std::logic_error("llama_engine::append: the prompt is not done");
  if (r.appended) throw std::logic_error("llama_engine::append: the last token is not decoded");
  check_tokens(*model_, {&token, 1}, "llama_engine::decode");
  const auto slot = r.req->append_token();  // the open block, or a new one (cache.extend)
  if (!slot) return false;
  r.tokens.push_back(token);
  r.appended = true;
  return true;
}

template <class P, class T>
std::vector<std::vector<float>> llama_engine<P, T>::decode_step(std::span<const seq_id> ids) {
  std::vector<detail::decode_row<T>> rows;
  rows.reserve(ids.size());
  std::vector<live_request*> live;
  for (const seq_id s : ids) {
    live_request& r = seq(s, "decode_step");
    if (!r.appended) throw std::logic_error("llama_engine::decode_step: append() a token first");
    for (const live_request* o : live)
      if (o == &r) throw std::logic_error("llama_engine::decode_step: a sequence named twice");
    live.push_back(&r);
    rows.push_back({&*r.kv, r.tokens.back(), static_cast<std::int32_t>(r.tokens.size()) - 1,
                    r.reader ? &*r.reader : nullptr});
  }
  std::vector<std::vector<float>> out(ids.size());
  if (ids.empty()) return out;
  std::vector<float> hidden;
  detail::run_decode_rows<P, T>(*model_, std::span<const detail::decode_row<T>>(rows), hidden);
  const auto all = head(*model_, hidden, /*decode=*/true, static_cast<int>(ids.size()));
  const auto V = static_cast<std::size_t>(model_->cfg.vocab);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    out[i].assign(all.begin() + static_cast<std::ptrdiff_t>(i * V),
                  all.begin() + static_cast<std::ptrdiff_t>((i + 1) * V));
    live[i]->appended = false;
  }
  return out;
}

template <class P, class T>
void llama_engine<P, T>::commit(seq_id s) {
  live_request& r = seq(s, "commit");
  if (!r.prefilled)
    throw std::logic_error("llama_engine::commit: sequence " + std::to_string(s) +
                           " has not computed its prompt");
  if (r.committed) return;
  r.req->commit();
  r.committed = true;
}

template <class P, class T>
void llama_engine<P, T>::close(seq_id s, bool commit) {
  const auto it = seqs_.find(s);
  if (it == seqs_.end()) return;
  std::unique_ptr<live_request> r = std::move(it->second);
  seqs_.erase(it);
  // A prompt not computed to its end has blocks without their K/V: never committed.
  if (commit && r->prefilled && !r->committed)
    r->req->commit();  // and writes new blocks to the store
  // ~request_kv releases the request.
}

template class llama_engine<relokv::pre_rotated, relokv::bf16>;
template class llama_engine<relokv::at_attention, relokv::bf16>;
template class llama_engine<relokv::block_relative, relokv::bf16>;
template class llama_engine<relokv::pre_rotated, float>;
template class llama_engine<relokv::at_attention, float>;
template class llama_engine<relokv::block_relative, float>;

template <class T>
struct contiguous_prefill<T>::state final : detail::pass_kv<T> {
  std::shared_ptr<const llama_model> model;
  std::int32_t max_tokens;
  relokv::layer_rope rope;
  relokv::host_kv_storage<T> kv;
  // One block as long as this prompt: position p is its slot p.
  relokv::block_entry table{0, 0, 0};
  std::int32_t indptr[2] = {0, 1};
  std::vector<std::int32_t> positions;
  std::vector<float> hidden;
  state(std::shared_ptr<const llama_model> m, std::int32_t n)
      : model(std::move(m)),
        max_tokens(n),
        rope(model->cfg.geometry(), n),
        kv(relokv::kv_shape{model->cfg.n_layers, 1, model->cfg.n_kv_heads, n,
                            model->cfg.head_dim}) {}
  // The pass's K/V: keys rotated as they are written (pre_rotated), as an engine without
  // relocation stores them.
  void write(std::int32_t l, std::int32_t pos, const float* k, const float* v) override {
    relokv::append_kv<relokv::pre_rotated>(rope.table(l), kv.layer(l), 0, pos, pos, k, v);
  }
  relokv::attention_params<T> attention(std::int32_t l) const override {
    relokv::attention_params<T> p;
    p.rope = &rope.table(l);
    p.window = rope.window(l);
    p.kv = kv.layer(l);
    p.table = {&table, indptr, 1};
    return p;
  }
  std::pair<relokv::block_id, std::int32_t> where(std::int32_t pos) const override {
    return {0, pos};
  }
};

template <class T>
contiguous_prefill<T>::contiguous_prefill(std::shared_ptr<const llama_model> m,
                                          std::int32_t max_tokens) {
  if (!m) throw std::invalid_argument("contiguous_prefill: no model");
  if (max_tokens < 1)
    throw std::invalid_argument("contiguous_prefill: max_tokens must be at least 1");
  s_ = std::make_unique<state>(std::move(m), max_tokens);
}
template <class T>
contiguous_prefill<T>::~contiguous_prefill() = default;
template <class T>
contiguous_prefill<T>::contiguous_prefill(contiguous_prefill&&) noexcept = default;
template <class T>
contiguous_prefill<T>& contiguous_prefill<T>::operator=(contiguous_prefill&&) noexcept = default;

template <class T>
std::vector<float> contiguous_prefill<T>::operator()(const std::vector<relokv::token_t>& tokens) {
  if (!s_) throw std::logic_error("contiguous_prefill: used after move");
  state& s = *s_;
  check_tokens(*s.model, tokens, "contiguous_prefill");
  const auto n = static_cast<std::int32_t>(tokens.size());
  if (n < 1 || n > s.max_tokens)
    throw std::invalid_argument("contiguous_prefill: " + std::to_string(n) + " tokens, not 1 to " +
                                std::to_string(s.max_tokens));
  // One block, as long as this prompt, in the buffer allocated for the longest.
  s.table = {0, 0, n};
  s.positions.resize(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) s.positions[static_cast<std::size_t>(i)] = i;
  detail::layer_pass<T> pass;
  pass.model = s.model.get();
  pass.kv = &s;
  pass.tokens = &tokens;
  pass.positions = s.positions;
  const std::vector<std::uint8_t> no_spans(tokens.size(), 0);  // one prompt, no span
  pass.span_rows = &no_spans;
  run_layers<relokv::pre_rotated, T>(std::move(pass), s.hidden);
  return head(*s.model, s.hidden, /*decode=*/false);
}

template class contiguous_prefill<relokv::bf16>;
template class contiguous_prefill<float>;

std::vector<float> plain_prefill(const llama_model& m, const std::vector<relokv::token_t>& tokens) {
  // The model is borrowed for the call: an aliasing pointer that owns nothing.
  const std::shared_ptr<const llama_model> borrowed(std::shared_ptr<const llama_model>{}, &m);
  contiguous_prefill<float> run(
      borrowed, std::max<std::int32_t>(static_cast<std::int32_t>(tokens.size()), 1));
  return run(tokens);
}

}  // namespace relokv_engine
