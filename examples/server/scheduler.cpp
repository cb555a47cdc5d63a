// relokv_server's scheduler (scheduler.hpp).
#include "scheduler.hpp"
#include "scheduler_seq.hpp"

#include "detok.hpp"

#include <relokv/recompute/full.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

namespace relokv_server {

namespace {
/// A prompt's spans as the cache keys them: each span's tokens with what the spans were computed
/// behind, the tenant and the adapter. Two prompts that share one, admitted together, would
/// both compute it; equal identities are equal spans but for a hash collision (which costs a
/// step's wait, never a wrong block: the cache verifies every hit by its tokens).
std::vector<std::uint64_t> span_ids(const relokv::request_layout& l, const relokv::extra_keys& k) {
  const auto bytes = [](std::span<const relokv::token_t> t) {
    return std::string_view(reinterpret_cast<const char*>(t.data()), t.size_bytes());
  };
  const std::hash<std::string_view> h;
  const std::uint64_t context = h(bytes(l.span_context_tokens())) ^
                                (k.tenant_salt * 0x9e3779b97f4a7c15ull) ^
                                ((k.adapter_id ^ l.adapter_id) * 0xc2b2ae3d27d4eb4full);
  std::vector<std::uint64_t> out;
  for (const relokv::segment& g : l.segments)
    if (g.kind == relokv::segment_kind::kSpan)
      out.push_back(
          h(bytes(std::span<const relokv::token_t>(l.tokens).subspan(
              static_cast<std::size_t>(g.first_token), static_cast<std::size_t>(g.num_tokens)))) ^
          context);
  return out;
}
}  // namespace

scheduler::scheduler(serving_engine& eng, const relokv_engine::tokenizer& tok, metrics& m,
                     options o)
    : eng_(eng), tok_(tok), metrics_(m), opt_(o) {
  for (const std::string& s : tok_.stop_texts())
    if (const auto id = tok_.id(s); id >= 0) stops_.push_back(id);
  thread_ = std::thread([this] { loop(); });
}

scheduler::~scheduler() { stop(); }

bool scheduler::submit(std::shared_ptr<job> j) {
  {
    const std::lock_guard lock(mu_);
    // in_flight_ counts every job not finished: the live batch and the queue behind it.
    if (stopping_ || cancel_status_ != 0 || in_flight_ >= opt_.max_running + opt_.max_queue)
      return false;
    intake_.push_back(std::move(j));
    ++in_flight_;
  }
  cv_.notify_one();
  return true;
}

std::int32_t scheduler::in_flight() const {
  const std::lock_guard lock(mu_);
  return in_flight_;
}

void scheduler::wake() {
  {
    const std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_one();
}

void scheduler::cancel_all(int status, const std::string& message) {
  {
    const std::lock_guard lock(mu_);
    cancel_status_ = status;
    cancel_message_ = message;
  }
  cv_.notify_one();
}

void scheduler::stop() {
  {
    const std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void scheduler::loop() {
  std::vector<std::shared_ptr<job>> incoming;
  int cancel_status = 0;
  std::string cancel_message;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      // Idle: nothing to compute, and whoever waits, waits for a store fetch (whose end
      // wakes this thread) or for nothing.
      const bool idle = prefilling_.empty() && running_.empty() &&
                        std::all_of(waiting_.begin(), waiting_.end(),
                                    [](const auto& s) { return s->fetch && !s->fetch->ready(); });
      if (idle)
        cv_.wait(lock, [&] {
          return woken_ || !intake_.empty() ||
                 (!waiting_.empty() ? cancel_status_ != 0 : stopping_);
        });
      woken_ = false;
      if (stopping_ && idle && waiting_.empty() && intake_.empty()) break;
      incoming.swap(intake_);
      cancel_status = cancel_status_;
      cancel_message = cancel_message_;
    }
    if (cancel_status != 0) {
      // A drain out of time: every job ends now, with the error its client is told.
      for (auto& j : incoming) {
        auto s = std::make_unique<seq_state>();
        s->j = std::move(j);
        fail(*s, cancel_status, cancel_message);
      }
      incoming.clear();
      for (auto* list : {&waiting_, &prefilling_})
        for (auto& s : *list) fail(*s, cancel_status, cancel_message);
      for (auto& s : running_) fail(*s, cancel_status, cancel_message);
      waiting_.clear();
      prefilling_.clear();
      running_.clear();
      snapshot();
      continue;
    }
    step(incoming);
    incoming.clear();
  }
}

void scheduler::step(std::vector<std::shared_ptr<job>>& incoming) {
  for (auto& j : incoming) {
    auto s = std::make_unique<seq_state>();
    s->j = std::move(j);
    s->rng.seed(s->j->req.seed ? *s->j->req.seed : std::random_device{}());
    waiting_.push_back(std::move(s));
  }
  try {
    drop_cancelled();
    admit();
    prefill_some();
    decode_all();
  } catch (const std::exception& e) {
    // An engine failure is not the requests' fault, and what it left is unknown: every live
    // sequence fails with it (500), the server goes on with an empty batch.
    auto fail_all = [&](auto& list) {
      // A sequence that finished earlier in this step is already counted out (fail() skips it).
      for (auto& s : list) fail(*s, 500, std::string("engine error: ") + e.what());
      list.clear();
    };
    fail_all(prefilling_);
    fail_all(running_);
  }
  snapshot();
}

void scheduler::drop_cancelled() {
  const auto gone = [&](std::unique_ptr<seq_state>& s) {
    if (!s->j->cancelled.load()) return false;
    fail(*s, 499, "the client closed the connection");
    return true;
  };
  std::erase_if(waiting_, gone);
  std::erase_if(prefilling_, gone);
  std::erase_if(running_, gone);
}

void scheduler::admit() {
  const std::int32_t most = std::min(opt_.max_running, eng_.max_live());
  // The spans being computed: those of the prompts now prefilling. A waiting request that
  // shares one is held back (those behind it go on) until that prompt is done and committed
  // (prefill_one commits a prompt when its first token comes), then reuses the span instead of
  // computing it a second time. The holder always moves (prefill_some), so the wait ends.
  const auto spans_of = [](seq_state& s) -> const std::vector<std::uint64_t>& {
    if (!s.spans) s.spans = span_ids(s.j->prompt.layout, s.j->keys);
    return *s.spans;
  };
  const auto fresh = [](const seq_state& s) { return !s.full && s.generated.empty(); };
  std::unordered_set<std::uint64_t> computing;
  for (auto& p : prefilling_)
    if (fresh(*p)) computing.insert(spans_of(*p).begin(), spans_of(*p).end());
  for (std::size_t i = 0; i < waiting_.size() &&
                          static_cast<std::int32_t>(prefilling_.size() + running_.size()) < most;) {
    seq_state& s = *waiting_[i];
    job& j = *s.j;
    if (fresh(s) && std::any_of(spans_of(s).begin(), spans_of(s).end(),
                                [&](std::uint64_t id) { return computing.contains(id); })) {
      if (!s.span_waited) metrics_.span_wait();
      s.span_waited = true;
      ++i;
      continue;
    }
    const auto at = waiting_.begin() + static_cast<std::ptrdiff_t>(i);
    relokv_engine::prefill_stats st;
    std::int64_t compiled_layers = 0;
    try {
      const built_prompt& p = s.full ? j.full_prompt : j.prompt;
      const auto layout = s.generated.empty() ? p.layout : p.with(s.generated);
      const relokv::recompute::any_strategy& strategy = s.full ? full_ : j.strategy;
      if (!s.fetch) {
        // What its plan would read from the store is fetched off this thread; it waits for it
        // here, those behind it go on (a store's deadline bounds the wait).
        s.fetch = eng_.prefetch(layout, strategy, j.keys, j.principal, [this] { wake(); });
      }
      if (s.fetch && !s.fetch->ready()) {
        if (!s.fetch_waited) metrics_.prefetch_wait();
        s.fetch_waited = true;
        ++i;
        continue;
      }
      if (opt_.compile_alone && !s.prompt_counted && !s.full)
        compiled_layers = compile_alone(j.prompt, j);
      s.id = eng_.open(layout, strategy, &st, j.keys, j.principal);
      s.fetch.reset();  // its entries were read
    } catch (const relokv_engine::out_of_blocks& e) {
      // Blocks come back as sequences end: wait. What its fetch staged stays for that plan.
      if (eng_.live() > 0) return;
      fail(s, 503, std::string("the KV pool cannot hold this request: ") + e.what());
      waiting_.erase(at);
      continue;
    } catch (const std::invalid_argument& e) {  // what the engine refuses to serve
      fail(s, 400, e.what());
      waiting_.erase(at);
      continue;
    } catch (const std::exception& e) {
      fail(s, 500, std::string("engine error: ") + e.what());
      waiting_.erase(at);
      continue;
    }
    s.rows_left = st.computed;
    s.passed = 0;
    s.starved = false;
    if (!s.prompt_counted) {
      // The first attempt's plan is what the request cost; a recompute after preemption is
      // counted as preemption, not as the request's prompt.
      s.prompt_counted = true;
      const std::lock_guard lock(j.mu);
      j.prompt_tokens = st.tokens;
      j.computed_tokens = st.computed;
      j.cached_tokens = st.tokens - st.computed;
      // Spans compiled alone for this request are its work too.
      j.compiled_tokens = static_cast<std::int32_t>(compiled_layers / std::max(1, eng_.n_layers()));
      if (st.tokens > 0)
        j.work += double(compiled_layers) / (double(eng_.n_layers()) * double(st.tokens));
      metrics_.prompt_tokens(st.computed, st.tokens - st.computed);
    }
    if (fresh(s)) computing.insert(spans_of(s).begin(), spans_of(s).end());
    prefilling_.push_back(std::move(*at));
    waiting_.erase(at);
  }
}

std::int64_t scheduler::compile_alone(const built_prompt& p, const job& j) {
  std::int64_t layers = 0;
  for (const relokv::request_layout& l : p.compile_layouts()) {
    relokv_engine::prefill_stats st;
    std::int32_t id = -1;
    try {
      id = eng_.open(l, relokv::recompute::none{}, &st, j.keys, j.principal);
      layers += st.token_layers;  // an engine that computes at open (llama.cpp) counts it here
      for (bool done = false; !done;) {
        relokv_engine::prefill_stats step;
        done = !eng_.prefill_step(id, opt_.prefill_chunk, &step).empty();
        layers += step.token_layers;
      }
      eng_.close(id, /*commit=*/true);
      metrics_.span_compiled();
    } catch (const std::exception&) {
      // No room (or a refusal the request meets itself): the request computes the
      // document in its own context instead.
      if (id >= 0) eng_.close(id, /*commit=*/false);
      break;
    }
  }
  return layers;
}

void scheduler::prefill_some() {
  // One budget of rows a step: a row for each running sequence's next token, the rest for
  // prompt chunks of the prefilling sequences, the first of the order always moving. The
  // order: admission (fcfs), or the fewest rows left first with the starved ahead of all.
  std::int32_t budget =
      std::max<std::int32_t>(0, opt_.step_tokens - static_cast<std::int32_t>(running_.size()));
  std::vector<seq_state*> order;
  order.reserve(prefilling_.size());
  for (auto& p : prefilling_) order.push_back(p.get());
  if (opt_.least_work_first)
    std::stable_sort(order.begin(), order.end(), [](const seq_state* a, const seq_state* b) {
      if (a->starved != b->starved) return a->starved;
      return !a->starved && a->rows_left < b->rows_left;
    });
  bool first = true;
  for (seq_state* s : order) {
    const std::int32_t rows = std::min(opt_.prefill_chunk, budget);
    if (rows <= 0 && !first) {
      s->starved = s->starved || ++s->passed >= kStarveSteps;
      continue;
    }
    first = false;
    budget -= std::max(rows, 1);
    s->passed = 0;
    s->rows_left = std::max<std::int64_t>(0, s->rows_left - std::max(rows, 1));
    const auto at = std::find_if(prefilling_.begin(), prefilling_.end(),
                                 [&](const std::unique_ptr<seq_state>& p) { return p.get() == s; });
    prefill_one(static_cast<std::size_t>(at - prefilling_.begin()), std::max(rows, 1));
  }
}

bool scheduler::prefill_one(std::size_t i, std::int32_t rows) {
  seq_state& s = *prefilling_[i];
  const auto at = prefilling_.begin() + static_cast<std::ptrdiff_t>(i);
  relokv_engine::prefill_stats st;
  const auto logits = eng_.prefill_step(s.id, rows, &st);
  {
    const std::lock_guard lock(s.j->mu);
    const double layers = eng_.n_layers();
    if (s.j->prompt_tokens > 0 && s.generated.empty())
      s.j->work += double(st.token_layers) / (layers * double(s.j->prompt_tokens));
  }
  if (logits.empty()) return false;
  job& j = *s.j;
  if (j.escalation.enabled && !s.full && s.generated.empty() &&
      j.escalation.escalate(relokv::recompute::summarize_logits(logits), 0)) {
    // Unsure before its first token: nothing was sent; the request is admitted again, first
    // in line, for full recompute (its first attempt's work stays counted).
    eng_.close(s.id, /*commit=*/false);
    s.id = -1;
    s.full = true;
    {
      const std::lock_guard lock(j.mu);
      j.escalated = true;
    }
    metrics_.escalated();
    waiting_.push_front(std::move(*at));
    prefilling_.erase(at);
    return true;
  }
  // The prompt is reusable from here on, while the answer is decoded: requests held back for
  // its spans (admit) and any later one reuse them now, not when this one ends.
  eng_.commit_prompt(s.id);
  running_.push_back(std::move(*at));
  prefilling_.erase(at);
  seq_state& r = *running_.back();
  on_token(r, sample(r, logits));
  return true;
}

void scheduler::decode_all() {
  std::vector<std::int32_t> ids;
  std::vector<seq_state*> who;
  for (std::size_t i = 0; i < running_.size();) {
    seq_state& s = *running_[i];
    if (s.next < 0) {  // finished this step (on_token ended it): removed below
      ++i;
      continue;
    }
    if (eng_.append(s.id, s.next)) {
      ids.push_back(s.id);
      who.push_back(&s);
      ++i;
      continue;
    }
    // No block for this token: the youngest running sequence makes room (it may be this one).
    // Never one that finished this step (next < 0): it holds no blocks and is counted out.
    seq_state* victim = &s;
    for (std::size_t k = running_.size(); k-- > i;)
      if (running_[k]->next >= 0) {
        victim = running_[k].get();
        break;
      }
    const bool self = victim == &s;
    preempt(*victim);
    if (self) continue;  // s left running_; running_[i] is now the one after it
  }
  if (!ids.empty()) {
    const auto logits = eng_.decode_step(ids);
    for (std::size_t i = 0; i < who.size(); ++i) on_token(*who[i], sample(*who[i], logits[i]));
  }
  std::erase_if(running_, [](const std::unique_ptr<seq_state>& s) { return s->next < 0; });
}

void scheduler::preempt(seq_state& s) {
  // Its blocks are committed (the recompute may meet them as exact hits) and released; the
  // answer so far continues its question when it is admitted again.
  eng_.close(s.id, /*commit=*/true);
  s.id = -1;
  s.next = -1;
  metrics_.preempted();
  {
    const std::lock_guard lock(s.j->mu);
    ++s.j->preemptions;
  }
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it->get() == &s) {
      waiting_.push_front(std::move(*it));
      running_.erase(it);
      return;
    }
}
void scheduler::snapshot() {
  cache_snapshot c = eng_.snapshot();
  c.running = static_cast<std::int64_t>(running_.size());
  c.prefilling = static_cast<std::int64_t>(prefilling_.size());
  c.waiting = static_cast<std::int64_t>(waiting_.size());
  metrics_.snapshot(c);
}

}  // namespace relokv_server
