// relokv_server's scheduler (scheduler.hpp): the decisions of a step, no engine call.
#include "scheduler.hpp"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <span>
#include <string_view>
#include <unordered_set>

#include <relokv/recompute/escalation.hpp>

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

const std::vector<std::uint64_t>& spans_of(request_state& r) {
  if (!r.spans) r.spans = span_ids(r.j->prompt.layout, r.j->keys);
  return *r.spans;
}
}  // namespace

admission_plan scheduler::admit(request_queues& q, std::int32_t max_live) {
  admission_plan plan;
  std::int32_t room = std::min(opt_.max_running, max_live) - q.live();
  // The spans being computed: those of the prompts now prefilling and of those this plan opens.
  std::unordered_set<std::uint64_t> computing;
  for (auto& p : q.prefilling)
    if (p->fresh()) computing.insert(spans_of(*p).begin(), spans_of(*p).end());
  for (auto& w : q.waiting) {
    if (room <= 0) break;
    request_state& r = *w;
    if (r.fetch && !r.fetch->ready()) continue;  // waiting_for_store: its fetch wakes the loop
    if (r.fresh() && std::any_of(spans_of(r).begin(), spans_of(r).end(),
                                 [&](std::uint64_t id) { return computing.contains(id); })) {
      plan.held.push_back(&r);
      continue;
    }
    if (r.fresh()) computing.insert(spans_of(r).begin(), spans_of(r).end());
    plan.open.push_back(&r);
    --room;
  }
  return plan;
}

std::vector<prefill_chunk> scheduler::prefill(request_queues& q) {
  std::int32_t budget =
      std::max<std::int32_t>(0, opt_.step_tokens - static_cast<std::int32_t>(q.running.size()));
  std::vector<request_state*> order;
  order.reserve(q.prefilling.size());
  for (auto& p : q.prefilling) order.push_back(p.get());
  if (opt_.least_work_first)
    std::stable_sort(order.begin(), order.end(),
                     [](const request_state* a, const request_state* b) {
                       if (a->starved != b->starved) return a->starved;
                       return !a->starved && a->rows_left < b->rows_left;
                     });
  std::vector<prefill_chunk> chunks;
  bool first = true;
  for (request_state* r : order) {
    const std::int32_t rows = std::min(opt_.prefill_chunk, budget);
    if (rows <= 0 && !first) {
      r->starved = r->starved || ++r->passed >= kStarveSteps;
      continue;
    }
    first = false;
    const std::int32_t n = std::max(rows, 1);
    budget -= n;
    r->passed = 0;
    r->rows_left = std::max<std::int64_t>(0, r->rows_left - n);
    chunks.push_back({r, n});
  }
  return chunks;
}

std::vector<request_state*> scheduler::decode(const request_queues& q) const {
  std::vector<request_state*> rows;
  for (const auto& r : q.running)
    if (r->status == request_status::decoding && r->next >= 0) rows.push_back(r.get());
  return rows;
}

request_state* scheduler::victim(const request_queues& q, request_state& needing) const {
  // The youngest running request from `needing` on (those before it were fed this step); one
  // that finished this step holds no blocks.
  for (std::size_t k = q.running.size(); k-- > 0;) {
    request_state* r = q.running[k].get();
    if (r == &needing) break;
    if (r->status == request_status::decoding && r->next >= 0) return r;
  }
  return &needing;
}

bool scheduler::escalate(const request_state& r, std::span<const float> logits) {
  const job& j = *r.j;
  return j.escalation.enabled && !r.full && r.generated.empty() &&
         j.escalation.escalate(relokv::recompute::summarize_logits(logits), 0);
}

}  // namespace relokv_server
