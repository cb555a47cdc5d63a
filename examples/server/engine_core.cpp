// relokv_server's serving loop (engine_core.hpp).
#include "engine_core.hpp"

#include <algorithm>
#include <exception>
#include <random>
#include <utility>

namespace relokv_server {

namespace {
/// Moves `r` out of `from` (found by address) to the back, or the front, of `to`.
template <class From, class To>
void move_to(From& from, request_state& r, To& to, bool front = false) {
  const auto it =
      std::find_if(from.begin(), from.end(),
                   [&](const std::unique_ptr<request_state>& p) { return p.get() == &r; });
  if (it == from.end()) return;
  if constexpr (requires { to.push_front(std::move(*it)); }) {
    if (front) {
      to.push_front(std::move(*it));
      from.erase(it);
      return;
    }
  }
  to.push_back(std::move(*it));
  from.erase(it);
}

template <class Queue>
void erase(Queue& from, request_state& r) {
  std::erase_if(from, [&](const std::unique_ptr<request_state>& p) { return p.get() == &r; });
}
}  // namespace

engine_core::engine_core(serving_engine& eng, const relokv_engine::tokenizer& tok, metrics& m,
                         scheduler::options o)
    : sched_(o), exec_(eng, m, o.prefill_chunk, o.compile_alone), out_(tok, m), metrics_(m) {
  thread_ = std::thread([this] { loop(); });
}

engine_core::~engine_core() { stop(); }

bool engine_core::submit(std::shared_ptr<job> j) {
  {
    const std::lock_guard lock(mu_);
    // in_flight_ counts every job not finished: the live batch and the queue behind it.
    const scheduler::options& o = sched_.opts();
    if (stopping_ || cancel_status_ != 0 || in_flight_ >= o.max_running + o.max_queue) return false;
    intake_.push_back(std::move(j));
    ++in_flight_;
  }
  cv_.notify_one();
  return true;
}

std::int32_t engine_core::in_flight() const {
  const std::lock_guard lock(mu_);
  return in_flight_;
}

void engine_core::wake() {
  {
    const std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_one();
}

void engine_core::cancel_all(int status, const std::string& message) {
  {
    const std::lock_guard lock(mu_);
    cancel_status_ = status;
    cancel_message_ = message;
  }
  cv_.notify_one();
}

void engine_core::stop() {
  {
    const std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void engine_core::loop() {
  std::vector<std::shared_ptr<job>> incoming;
  int cancel_status = 0;
  std::string cancel_message;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      // Idle: nothing to compute, and whoever waits, waits for a store fetch (whose end
      // wakes this thread) or for nothing.
      const bool idle = q_.prefilling.empty() && q_.running.empty() &&
                        std::all_of(q_.waiting.begin(), q_.waiting.end(),
                                    [](const auto& r) { return r->fetch && !r->fetch->ready(); });
      if (idle)
        cv_.wait(lock, [&] {
          return woken_ || !intake_.empty() ||
                 (!q_.waiting.empty() ? cancel_status_ != 0 : stopping_);
        });
      woken_ = false;
      if (stopping_ && idle && q_.waiting.empty() && intake_.empty()) break;
      incoming.swap(intake_);
      cancel_status = cancel_status_;
      cancel_message = cancel_message_;
    }
    if (cancel_status != 0) {
      // A drain out of time: every job ends now, with the error its client is told.
      for (auto& j : incoming) {
        request_state r;
        r.j = std::move(j);
        fail(r, cancel_status, cancel_message);
      }
      incoming.clear();
      for (auto& r : q_.waiting) fail(*r, cancel_status, cancel_message);
      for (auto& r : q_.prefilling) fail(*r, cancel_status, cancel_message);
      for (auto& r : q_.running) fail(*r, cancel_status, cancel_message);
      q_.waiting.clear();
      q_.prefilling.clear();
      q_.running.clear();
      snapshot();
      continue;
    }
    step(incoming);
    incoming.clear();
  }
}

void engine_core::step(std::vector<std::shared_ptr<job>>& incoming) {
  for (auto& j : incoming) {
    auto r = std::make_unique<request_state>();
    r->j = std::move(j);
    r->rng.seed(r->j->req.seed ? *r->j->req.seed : std::random_device{}());
    q_.waiting.push_back(std::move(r));
  }
  try {
    drop_cancelled();
    admit();
    prefill();
    decode();
  } catch (const std::exception& e) {
    // An engine failure is not the requests' fault, and what it left is unknown: every live
    // sequence fails with it (500), the server goes on with an empty batch. A sequence that
    // finished earlier in this step is already counted out (fail() skips it).
    const std::string why = std::string("engine error: ") + e.what();
    for (auto& r : q_.prefilling) fail(*r, 500, why);
    for (auto& r : q_.running) fail(*r, 500, why);
    q_.prefilling.clear();
    q_.running.clear();
  }
  snapshot();
}

void engine_core::drop_cancelled() {
  const auto gone = [&](std::unique_ptr<request_state>& r) {
    if (!r->j->cancelled.load()) return false;
    fail(*r, 499, "the client closed the connection");
    return true;
  };
  std::erase_if(q_.waiting, gone);
  std::erase_if(q_.prefilling, gone);
  std::erase_if(q_.running, gone);
}

void engine_core::admit() {
  const admission_plan plan = sched_.admit(q_, exec_.max_live());
  for (request_state* r : plan.held) {
    if (!r->span_waited) metrics_.span_wait();
    r->span_waited = true;
  }
  for (request_state* r : plan.open) {
    const executor::open_result res = exec_.open(*r, [this] { wake(); });
    switch (res.k) {
      case executor::open_result::kind::opened:
        r->status = request_status::prefilling;
        move_to(q_.waiting, *r, q_.prefilling);
        break;
      case executor::open_result::kind::fetching:
        r->status = request_status::waiting_for_store;
        break;
      case executor::open_result::kind::no_room:
        // Blocks come back as sequences end: wait, and those behind it too.
        if (scheduler::wait_for_blocks(exec_.live())) return;
        [[fallthrough]];
      case executor::open_result::kind::failed:
        fail(*r, res.status, res.message);
        erase(q_.waiting, *r);
        break;
    }
  }
}

void engine_core::prefill() {
  for (const prefill_chunk& c : sched_.prefill(q_)) {
    request_state& r = *c.r;
    const auto logits = exec_.prefill(r, c.rows);
    if (logits.empty()) continue;
    if (scheduler::escalate(r, logits)) {
      // Unsure before its first token: nothing was sent; the request is admitted again, first
      // in line, for full recompute (its first attempt's work stays counted).
      exec_.close(r, /*commit=*/false);
      r.full = true;
      {
        const std::lock_guard lock(r.j->mu);
        r.j->escalated = true;
      }
      metrics_.escalated();
      r.status = request_status::waiting;
      move_to(q_.prefilling, r, q_.waiting, /*front=*/true);
      continue;
    }
    // The prompt is reusable from here on, while the answer is decoded: requests held back for
    // its spans (admit) and any later one reuse them now, not when this one ends.
    exec_.commit_prompt(r);
    r.status = request_status::decoding;
    move_to(q_.prefilling, r, q_.running);
    take(r, logits);
  }
}

void engine_core::decode() {
  std::vector<request_state*> fed;
  for (request_state* r : sched_.decode(q_)) {
    if (r->status != request_status::decoding) continue;  // preempted for one before it
    // No block for its token: the scheduler names whom to preempt (it may be this one).
    bool in = true;
    while (in && !exec_.append(*r)) {
      request_state* v = sched_.victim(q_, *r);
      in = v != r;
      preempt(*v);
    }
    if (in) fed.push_back(r);
  }
  if (!fed.empty()) {
    const auto logits = exec_.decode(fed);
    for (std::size_t i = 0; i < fed.size(); ++i) take(*fed[i], logits[i]);
  }
  std::erase_if(q_.running, [](const std::unique_ptr<request_state>& r) { return r->ended(); });
}

void engine_core::take(request_state& r, const std::vector<float>& logits) {
  if (const auto reason = out_.accept(r, logits)) finish(r, *reason);
}

void engine_core::preempt(request_state& r) {
  // Its blocks are committed (the recompute may meet them as exact hits) and released; the
  // answer so far continues its question when it is admitted again.
  exec_.close(r, /*commit=*/true);
  r.next = -1;
  r.status = request_status::preempted;
  metrics_.preempted();
  {
    const std::lock_guard lock(r.j->mu);
    ++r.j->preemptions;
  }
  move_to(q_.running, r, q_.waiting, /*front=*/true);
}

void engine_core::finish(request_state& r, const std::string& reason) {
  if (r.ended()) return;
  exec_.close(r, /*commit=*/true);  // the documents stay for later requests
  r.status = request_status::finished;
  out_.finish(r, reason);
  count_out();
}

void engine_core::fail(request_state& r, int status, const std::string& message) {
  if (r.ended()) return;
  exec_.close(r, /*commit=*/false);
  r.status = request_status::finished;
  out_.fail(r, status, message);
  count_out();
}

void engine_core::count_out() {
  const std::lock_guard lock(mu_);
  --in_flight_;
}

void engine_core::snapshot() {
  cache_snapshot c = exec_.snapshot();
  c.running = static_cast<std::int64_t>(q_.running.size());
  c.prefilling = static_cast<std::int64_t>(q_.prefilling.size());
  c.waiting = static_cast<std::int64_t>(q_.waiting.size());
  metrics_.snapshot(c);
}

}  // namespace relokv_server
