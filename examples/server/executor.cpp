// relokv_server's executor (executor.hpp).
#include "executor.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>

#include <relokv/recompute/none.hpp>

namespace relokv_server {

executor::executor(serving_engine& eng, metrics& m, std::int32_t prefill_chunk, bool compile_alone)
    : eng_(eng),
      seqs_(eng.sequences()),
      metrics_(m),
      prefill_chunk_(prefill_chunk),
      compile_alone_(compile_alone) {}

executor::open_result executor::open(request_state& r, const std::function<void()>& wake) {
  job& j = *r.j;
  relokv_engine::prefill_stats st;
  std::int64_t compiled_layers = 0;
  try {
    const built_prompt& p = r.full ? j.full_prompt : j.prompt;
    const auto layout = r.generated.empty() ? p.layout : p.with(r.generated);
    const relokv::recompute::any_strategy& strategy = r.full ? full_ : j.strategy;
    // What its plan would read from the store is fetched off this thread; it waits for it,
    // those behind it go on (a store's deadline bounds the wait).
    if (!r.fetch) r.fetch = eng_.prefetch(layout, strategy, j.keys, j.principal, wake);
    if (r.fetch && !r.fetch->ready()) {
      if (!r.fetch_waited) metrics_.prefetch_wait();
      r.fetch_waited = true;
      return {open_result::kind::fetching, 0, {}};
    }
    if (compile_alone_ && !r.prompt_counted && !r.full)
      compiled_layers = compile_alone(j.prompt, j);
    r.seq = seqs_.open(layout, strategy, &st, j.keys, j.principal);
    r.fetch.reset();  // its entries were read
  } catch (const relokv_engine::out_of_blocks& e) {
    // What its fetch staged stays for that plan.
    return {open_result::kind::no_room, 503,
            std::string("the KV pool cannot hold this request: ") + e.what()};
  } catch (const std::invalid_argument& e) {  // what the engine refuses to serve
    return {open_result::kind::failed, 400, e.what()};
  } catch (const std::exception& e) {
    return {open_result::kind::failed, 500, std::string("engine error: ") + e.what()};
  }
  r.rows_left = st.computed;
  r.passed = 0;
  r.starved = false;
  if (!r.prompt_counted) {
    // The first attempt's plan is what the request cost; a recompute after preemption is
    // counted as preemption, not as the request's prompt.
    r.prompt_counted = true;
    const std::lock_guard lock(j.mu);
    j.prompt_tokens = st.tokens;
    j.computed_tokens = st.computed;
    j.cached_tokens = st.tokens - st.computed;
    // Spans compiled alone for this request are its work too.
    j.compiled_tokens = static_cast<std::int32_t>(compiled_layers / std::max(1, seqs_.n_layers()));
    if (st.tokens > 0)
      j.work += double(compiled_layers) / (double(seqs_.n_layers()) * double(st.tokens));
    metrics_.prompt_tokens(st.computed, st.tokens - st.computed);
  }
  return {open_result::kind::opened, 0, {}};
}

std::int64_t executor::compile_alone(const built_prompt& p, const job& j) {
  std::int64_t layers = 0;
  for (const relokv::request_layout& l : p.compile_layouts()) {
    relokv_engine::prefill_stats st;
    std::int32_t id = -1;
    try {
      id = seqs_.open(l, relokv::recompute::none{}, &st, j.keys, j.principal);
      layers += st.token_layers;  // an engine that computes at open (llama.cpp) counts it here
      for (bool done = false; !done;) {
        relokv_engine::prefill_stats step;
        done = !seqs_.prefill_step(id, prefill_chunk_, &step).empty();
        layers += step.token_layers;
      }
      seqs_.close(id, /*commit=*/true);
      metrics_.span_compiled();
    } catch (const std::exception&) {
      // No room (or a refusal the request meets itself): the request computes the
      // document in its own context instead.
      if (id >= 0) seqs_.close(id, /*commit=*/false);
      break;
    }
  }
  return layers;
}

std::vector<float> executor::prefill(request_state& r, std::int32_t rows) {
  relokv_engine::prefill_stats st;
  auto logits = seqs_.prefill_step(r.seq, rows, &st);
  const std::lock_guard lock(r.j->mu);
  if (r.j->prompt_tokens > 0 && r.generated.empty())
    r.j->work += double(st.token_layers) / (double(seqs_.n_layers()) * double(r.j->prompt_tokens));
  return logits;
}

std::vector<std::vector<float>> executor::decode(std::span<request_state* const> rows) {
  std::vector<std::int32_t> ids;
  ids.reserve(rows.size());
  for (const request_state* r : rows) ids.push_back(r->seq);
  return seqs_.decode_step(ids);
}

void executor::close(request_state& r, bool commit) {
  if (r.seq >= 0) seqs_.close(r.seq, commit);
  r.seq = -1;
}

}  // namespace relokv_server
