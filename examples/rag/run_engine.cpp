// The QA job's loop over any sequence engine (run_engine.hpp).
#include "run_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <relokv/layout/builder.hpp>
#include <relokv/recompute/escalation.hpp>
#include <relokv/recompute/full.hpp>
#include <relokv/recompute/none.hpp>

namespace relokv_rag::detail {

/// One request of the noise-floor row: full prefill on the fp32-KV engine, its greedy answer
/// against the reference's, and its logits along the reference's answer (teacher-forced).
namespace {
void add_floor(relokv_engine::sequence_engine& eng, const relokv::request_layout& flat,
               const std::vector<std::vector<float>>& ref_steps,
               const std::vector<relokv::token_t>& ref_answer, relokv::token_t stop,
               const run_options& opt, const qa_request& r, const text_codec& codec,
               variant_result& out) {
  const auto keys = tenant_keys(opt);
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = eng.prefill(flat, relokv::recompute::full{}, nullptr, keys, opt.principal);
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<relokv::token_t> answer;
  for (relokv::token_t t = relokv_engine::argmax(logits);;) {
    answer.push_back(t);
    if (t == stop || static_cast<std::int32_t>(answer.size()) == opt.max_answer) break;
    t = relokv_engine::argmax(eng.decode(t));
  }
  eng.end(false);
  out.busy_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::vector<float>> steps{logits};
  (void)eng.prefill(flat, relokv::recompute::full{}, nullptr, keys, opt.principal);
  for (std::size_t i = 0; i + 1 < ref_answer.size(); ++i)
    steps.push_back(eng.decode(ref_answer[i]));
  eng.end(false);
  out.ttft_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  out.computed.push_back(double(flat.tokens.size()));
  out.work.push_back(1.0);
  out.tf_agreement.push_back(teacher_forced_agreement(steps, ref_answer));
  score_answer(ref_steps, steps, ref_answer, answer, stop, r, codec, out);
}

}  // namespace

std::vector<variant_result> run_engine(const engine_under_test& e, const workload& w,
                                       const text_codec& codec,
                                       const std::vector<variant>& variants, const run_options& opt,
                                       std::optional<relokv::link_rows> adapter) {
  if (e.eng == nullptr) throw std::invalid_argument("run_engine: no engine");
  relokv_engine::sequence_engine& eng = *e.eng;
  relokv_engine::sequence_engine* const floor_eng = e.floor;
  const std::int32_t n_layers = e.n_layers;
  const std::int64_t block_bytes = e.block_bytes;
  const relokv::token_t stop = codec.tok ? codec.tok->end_of_turn() : -1;
  const std::size_t total = w.requests.size() * (variants.size() + 1);
  std::size_t done = 0;
  // A question's passages are cached as spans computed after the system prompt, just before
  // the question (as a RAG server warms what its retriever returns): whatever the corpus size,
  // the pool needs only the recently used passages. A passage still cached costs one token.
  // What the passages are compiled behind (run_options::compile); none: the system prompt.
  const std::optional<std::vector<relokv::token_t>> behind = compile_context(opt.compile, w);
  const auto keys = tenant_keys(opt);
  // A span-link adapter: the layouts of the variants that read it, and its rows in each.
  const bool any_links =
      std::any_of(variants.begin(), variants.end(), [](const variant& v) { return v.links; });
  if (any_links && !adapter)
    throw std::invalid_argument(
        "a links variant needs a span-link adapter (--links; relokv's own engine only)");
  // A passage cached on its own behind what opt.compile names (under the adapter's keys and
  // with its header rows when `linked`).
  const auto compile = [&](std::size_t p, bool linked) {
    relokv::layout_builder b(16);
    if (linked) b.links(*adapter);
    if (!behind)
      b.prefix(w.prefix);
    else if (!behind->empty())
      b.prefix(*behind);
    (void)eng.prefill(b.span(w.corpus[p].tokens).build(), relokv::recompute::none{}, nullptr, keys,
                      opt.principal);
    eng.end(true);
  };
  const auto warm = [&](const qa_request& r) {
    // Passages compiled behind something other than the system prompt do not cache it: keep
    // it as a server keeps its system prompt, so that requests meet it as exact hits.
    if (behind) {
      (void)eng.prefill(relokv::layout_builder(16).prefix(w.prefix).build(),
                        relokv::recompute::none{}, nullptr, keys, opt.principal);
      eng.end(true);
    }
    for (std::size_t p : r.passages) {
      compile(p, false);
      if (any_links) compile(p, true);  // the same passage under the adapter's keys
    }
    if (opt.progress) opt.progress(++done, total);
  };
  std::vector<variant_result> res(variants.size());
  for (std::size_t v = 0; v < variants.size(); ++v) {
    res[v].name = variants[v].name;
    res[v].note = variants[v].note;
    res[v].key = variants[v].key;
  }
  const bool floor = floor_eng != nullptr;
  variant_result floor_row;
  if (floor) {
    floor_row.name = "noise floor: full, fp32 KV";
    floor_row.note = "full prefill with fp32 KV against the reference's KV type: no reuse";
    floor_row.key = "fp32_floor";
  }
  for (const qa_request& r : w.requests) {
    warm(r);
    // The request over its spans (reading the adapter's rows when `linked`).
    const auto span_layout = [&](bool linked) {
      relokv::layout_builder b(16);
      if (linked) b.links(*adapter);
      b.prefix(w.prefix);
      if (behind) b.span_context(*behind);
      for (std::size_t p : r.passages) b.span(w.corpus[p].tokens);
      return b.question(r.question_tokens).build();
    };
    relokv::layout_builder flat(16);
    std::vector<relokv::token_t> all(w.prefix);
    for (std::size_t p : r.passages)
      all.insert(all.end(), w.corpus[p].tokens.begin(), w.corpus[p].tokens.end());
    all.insert(all.end(), r.question_tokens.begin(), r.question_tokens.end());
    const auto l_spans = span_layout(false);
    const auto l_linked = any_links ? span_layout(true) : relokv::request_layout{};
    const auto l_flat = flat.prefix(all).build();
    // Full recompute's greedy answer and the logits before each of its tokens.
    std::vector<std::vector<float>> ref_steps;
    std::vector<relokv::token_t> ref_answer;
    const double layers = n_layers;
    std::vector<float> naive_first;  // naive PIC's first-token logits, when it ran
    for (std::size_t v = 0; v < variants.size(); ++v) {
      const variant& var = variants[v];
      const auto& layout = var.links ? l_linked : var.spans ? l_spans : l_flat;
      const relokv::recompute::escalation_policy& esc = var.escalation;
      relokv_engine::prefill_stats st;
      std::int64_t token_layers = 0;
      std::int32_t escalated_at = -1;
      // Full recompute of the prompt, then the answer so far fed back: from here on the
      // answer is full recompute's continuation of what was already produced (and sent).
      const auto escalate = [&](const std::vector<relokv::token_t>& so_far) {
        eng.end(false);
        relokv_engine::prefill_stats fs;
        auto l = eng.prefill(l_flat, relokv::recompute::full{}, &fs, keys, opt.principal);
        token_layers += fs.token_layers;
        for (const relokv::token_t tok : so_far) {
          l = eng.decode(tok);
          token_layers += n_layers;
        }
        escalated_at = static_cast<std::int32_t>(so_far.size());
        return l;
      };
      // Before the first token or any answer token; the draft stage checks a whole answer.
      const bool per_step = esc.enabled && esc.stage != relokv::recompute::escalation_stage::draft;
      const auto t0 = std::chrono::steady_clock::now();
      auto logits = eng.prefill(layout, var.strategy, &st, keys, opt.principal);
      token_layers += st.token_layers;
      relokv::recompute::logit_summary first;
      std::vector<float> first_logits;
      if (per_step) {  // choosing to escalate is part of TTFT
        first = relokv::recompute::summarize_logits(logits);
        if (!naive_first.empty()) first_logits = logits;
        if (esc.escalate(first, 0)) logits = escalate({});
      }
      relokv::token_t t = relokv_engine::argmax(logits);  // choosing it is part of TTFT
      auto t1 = std::chrono::steady_clock::now();
      if (!per_step) {
        first = relokv::recompute::summarize_logits(logits);
        if (!naive_first.empty()) first_logits = logits;
      }
      const std::int64_t in_use = e.blocks_in_use ? e.blocks_in_use() : 0;
      // Greedy answer; the logits of each step are kept while the answer follows full's (they
      // are then the teacher-forced ones too).
      std::vector<relokv::token_t> answer;
      std::vector<std::vector<float>> steps;
      std::vector<double> margins{first.margin}, entropies{first.entropy};
      const auto greedy = [&](bool record) {
        for (std::int32_t i = 0; i < opt.max_answer; ++i) {
          const bool on_ref =
              v == 0 || (i < static_cast<std::int32_t>(ref_answer.size()) &&
                         std::equal(answer.begin(), answer.end(), ref_answer.begin()));
          if (on_ref) steps.push_back(logits);
          answer.push_back(t);
          if (t == stop || i + 1 == opt.max_answer) break;
          logits = eng.decode(t);
          if (record) {
            const auto sum = relokv::recompute::summarize_logits(logits);
            margins.push_back(sum.margin);
            entropies.push_back(sum.entropy);
            if (per_step && escalated_at < 0 && esc.escalate(sum, i + 1)) logits = escalate(answer);
          }
          t = relokv_engine::argmax(logits);
        }
      };
      greedy(true);
      if (esc.enabled && !per_step) {
        // The draft was held back: its least sure step decides whether it is sent or replaced
        // by full recompute's answer. Either way the first token goes out after the check.
        const relokv::recompute::logit_summary worst{
            static_cast<float>(*std::min_element(margins.begin(), margins.end())),
            static_cast<float>(*std::max_element(entropies.begin(), entropies.end())), -1};
        if (esc.escalate(worst, 0)) {
          logits = escalate({});
          answer.clear();
          steps.clear();
          t = relokv_engine::argmax(logits);
          t1 = std::chrono::steady_clock::now();
          greedy(false);
        } else {
          t1 = std::chrono::steady_clock::now();
        }
      }
      eng.end(false);  // questions are not kept: every variant meets the same cache
      const auto t2 = std::chrono::steady_clock::now();
      if (v == 0) {
        ref_steps = steps;
        ref_answer = answer;
        if (floor)
          add_floor(*floor_eng, l_flat, ref_steps, ref_answer, stop, opt, r, codec, floor_row);
      } else if (steps.size() < ref_answer.size()) {
        // The answer left full's: feed full's answer from a second, identical prefill (under
        // the same policy, which now reads the distributions along full's answer).
        auto l = eng.prefill(layout, var.strategy, nullptr, keys, opt.principal);
        bool esc_tf = false;
        const auto tf_escalate = [&](std::size_t upto) {
          eng.end(false);
          auto f = eng.prefill(l_flat, relokv::recompute::full{}, nullptr, keys, opt.principal);
          for (std::size_t j = 0; j < upto; ++j) f = eng.decode(ref_answer[j]);
          esc_tf = true;
          return f;
        };
        if (per_step && esc.escalate(relokv::recompute::summarize_logits(l), 0)) l = tf_escalate(0);
        steps.assign(1, std::move(l));
        for (std::size_t i = 0; i + 1 < ref_answer.size(); ++i) {
          auto next = eng.decode(ref_answer[i]);
          if (per_step && !esc_tf &&
              esc.escalate(relokv::recompute::summarize_logits(next),
                           static_cast<std::int32_t>(i + 1)))
            next = tf_escalate(i + 1);
          steps.push_back(std::move(next));
        }
        eng.end(false);
      }
      variant_result& out = res[v];
      if (var.key == "naive" && !steps.empty()) naive_first = steps[0];
      std::int32_t diverged = -1;
      for (std::size_t i = 0; diverged < 0 && i < std::max(answer.size(), ref_answer.size()); ++i)
        if (i >= answer.size() || i >= ref_answer.size() || answer[i] != ref_answer[i])
          diverged = static_cast<std::int32_t>(i);
      out.tf_agreement.push_back(teacher_forced_agreement(steps, ref_answer));
      out.margin0.push_back(first.margin);
      out.entropy0.push_back(first.entropy);
      out.min_margin.push_back(*std::min_element(margins.begin(), margins.end()));
      out.max_entropy.push_back(*std::max_element(entropies.begin(), entropies.end()));
      out.naive_kl.push_back(first_logits.empty() ? -1.0
                                                  : kl_divergence(naive_first, first_logits));
      out.diverged_at.push_back(diverged);
      out.step_margins.push_back(std::move(margins));
      out.step_entropies.push_back(std::move(entropies));
      out.escalated.push_back(escalated_at >= 0 ? 1.0 : 0.0);
      out.escalated_at.push_back(escalated_at);
      out.prompt_tokens.push_back(st.tokens);
      out.ttft_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      out.busy_s += std::chrono::duration<double>(t2 - t0).count();
      out.computed.push_back(st.computed);
      // Work is over the prompt's own tokens: a links variant's rows are work it adds.
      const auto prompt_tokens = static_cast<std::int32_t>(l_flat.tokens.size());
      out.work.push_back(double(token_layers) / (layers * double(std::max(prompt_tokens, 1))));
      out.blocks += st.exact_hits + st.relocated_hits + st.misses;
      out.exact += st.exact_hits;
      out.relocated += st.relocated_hits;
      out.peak_kv_bytes = std::max<std::int64_t>(out.peak_kv_bytes, in_use * block_bytes);
      score_answer(ref_steps, steps, ref_answer, answer, stop, r, codec, out);
      if (opt.progress) opt.progress(++done, total);
    }
  }
  if (floor) res.push_back(std::move(floor_row));
  return res;
}

}  // namespace relokv_rag::detail
