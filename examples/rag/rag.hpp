#pragma once
// Multi-document QA on relokv: every PIC variant served by one relocatable_cache, requests
// interleaved, measured side by side against full recompute.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/escalation.hpp>
#include <relokv/types.hpp>

#include "dataset.hpp"
#include "llama_engine.hpp"
#include "strategy_profile.hpp"
#include "tokenizer.hpp"

namespace relokv_rag {

struct passage {
  std::string title, text;
  std::vector<relokv::token_t> tokens;
};
struct qa_request {
  std::vector<std::size_t> passages;  // into the corpus, in the order the prompt shows them
  std::string question, answer;
  std::vector<relokv::token_t> question_tokens, answer_tokens;
};
struct workload {
  std::string source;                   // "generator" or the JSONL path
  std::vector<relokv::token_t> prefix;  // system prompt
  std::vector<passage> corpus;
  std::vector<qa_request> requests;
};

/// Text to tokens: the model's tokenizer, or bytes folded into the vocabulary (synthetic model).
struct text_codec {
  const relokv_engine::tokenizer* tok = nullptr;
  std::int32_t vocab = 256;
  [[nodiscard]] std::vector<relokv::token_t> encode(const std::string& s) const;
  /// The chat format's prompt opening (system, then the user's) and closing (the assistant's
  /// opening); ChatML's without a tokenizer.
  [[nodiscard]] std::string open(const std::string& system) const;
  [[nodiscard]] std::string close() const;
  [[nodiscard]] std::string decode(const std::vector<relokv::token_t>& t) const;
};

/// 2WikiMultihopQA-style JSONL: question, answer, context = [[title, [sentences...]], ...].
/// Passages are pooled across questions; each request shows its passages in a seeded random
/// order. Throws naming the line and the problem for malformed input.
workload load_jsonl(const std::string& path, std::size_t max_requests, std::uint32_t seed,
                    const text_codec& codec);
/// Built-in generator: a corpus of passages with Zipf popularity; each request is the system
/// prompt, k passages in random order and a question whose answer is a span of one of them.
workload generate(std::size_t requests, std::size_t corpus, std::size_t k, double zipf,
                  std::uint32_t seed, std::int32_t vocab);
/// Writes the tokenized workload as JSON: {"source", "prefix", "end_of_turn", "corpus":
/// [{"title", "tokens"}], "requests": [{"passages", "question", "question_tokens", "answer"}]}:
/// what tools/links trains on, tokenized exactly as the measurements are.
/// @throws std::runtime_error when the file cannot be written
void export_workload(const std::string& path, const workload& w, const text_codec& codec);

struct variant {
  std::string name;
  relokv::recompute::any_strategy strategy;
  bool spans = true;  // false: the whole prompt is one prefix (exact keys only)
  std::string note;
  std::string key;  // short name for --variants: full, prefix, naive, block, epic, ...
  relokv_engine::strategy_spec spec;  // the strategy by kind and budget
  /// Per-request escalation to full recompute (examples/rag/escalation_study.hpp); never by
  /// default.
  relokv::recompute::escalation_policy escalation{};
  /// Reads the model's span-link adapter (relokv_engine::with_links): its link rows open the
  /// question and its header rows each span; spans are cached under the adapter's keys.
  bool links = false;
};
/// The variants of a span-link adapter (--links): links (naive reuse plus the rows), and with
/// EPIC's first k and the question's top share; for a sweep, each over its budget.
std::vector<variant> link_variants(std::int32_t first_k, float topk, bool sweep);
/// The twelve variants, reference first (union: EPIC's first k pinned plus CacheBlend's top-k;
/// question and qepic: the question's attention picks the tokens, question_topk, without and
/// with EPIC's first 2 pinned; ape: APE's grouped attention at the reader's tokens; seam:
/// KVBoost's window without its check layer).
/// first_k sets EPIC's k and KVBoost's window; topk is CacheBlend's recompute ratio. @throws
/// relokv::error for values the strategies reject.
std::vector<variant> default_variants(std::int32_t first_k = 16, float topk = 0.15f);
/// The budget sweep: full (reference), naive, and each strategy over its budget: k for first_k
/// and the seam window (KVBoost's, with its 15% cosine CacheBlend), r for deviation_topk, both
/// for the union, r for question_topk (and r with k = 2), APE at two (T, S).
std::vector<variant> sweep_variants();
/// The variants of `all` whose key `keys` names, in `all`'s order, the reference (all[0])
/// always first; every variant when `keys` is empty (relokv_rag --variants, relokv.rag.run).
/// @throws relokv::error naming an unknown key and the known ones
std::vector<variant> pick_variants(std::vector<variant> all, const std::vector<std::string>& keys);
/// A variant serving `spec`.
variant variant_of(const relokv_engine::strategy_spec& spec);

/// Per-request measurements of one variant. Faithfulness is measured against full recompute
/// (variant 0): kl is the KL divergence of the first answer token's distribution, answer_kl
/// the mean per-token KL over full recompute's greedy answer fed back (teacher-forced, the stop
/// token included), agreement the share of the greedy answer's tokens equal to full's; em and
/// f1 score the answer against the gold one (SQuAD's normalization). work is the prefill work
/// done, as a fraction of computing every prompt token at every layer.
struct variant_result {
  std::string name, note, key;
  std::vector<double> ttft_ms, computed, work, kl, answer_kl, agreement, em, f1;
  /// Teacher-forced top-1 agreement: the share of full recompute's answer tokens that this
  /// variant's argmax matches, given full's answer so far.
  std::vector<double> tf_agreement;
  /// Per request, what an escalation policy could read (escalation_study.hpp), measured on the
  /// variant's own first attempt: the first token's top-1 margin and entropy, the least margin
  /// and the largest entropy along its greedy answer, the first-token KL from naive PIC's
  /// distribution (-1 without a naive variant before it), and the answer step where it left
  /// full's answer (-1: it did not).
  std::vector<double> margin0, entropy0, min_margin, max_entropy, naive_kl, diverged_at;
  /// Per request, the margin before each step of the variant's own greedy answer.
  std::vector<std::vector<double>> step_margins, step_entropies;
  /// Per request: 1 when the escalation policy recomputed it (the step in escalated_at).
  std::vector<double> escalated, escalated_at;
  std::vector<std::int32_t> prompt_tokens;
  std::int64_t blocks = 0, exact = 0, relocated = 0;
  double busy_s = 0;
  std::int64_t peak_kv_bytes = 0;
};
struct run_options {
  std::int32_t max_answer = 16;
  std::string placement = "block_relative";
  std::string kv_dtype = "bf16";  ///< the KV pool's element type: bf16 or fp32
  std::int32_t num_blocks = 4096;
  /// With bf16 KV: one more row, full prefill with fp32 KV against the bf16 reference (the
  /// KV's own rounding: the floor under every variant's distance).
  bool noise_floor = false;
  /// What the passages are cached behind: "prompt" (the system prompt, which every request
  /// shares), "alone" (nothing: a passage starts at position 0 and its first token is a sink),
  /// or "absorber:N" (the system prompt's first N tokens, its chat header: a sink-absorbing
  /// compile that any system prompt of the template reuses; requests name it as their
  /// span_context).
  std::string compile = "prompt";
  /// The engine: "relokv" (the example engine) or "llama.cpp" (a relocatable_cache in charge
  /// of a llama.cpp context, examples/llama_cpp: placement pre_rotated through llama.cpp's
  /// K-shift, KV f16, or f32 with kv_dtype "fp32"; static strategies only).
  std::string engine = "relokv";
  std::string model_path;  ///< the GGUF llama.cpp loads (engine "llama.cpp")
  /// Every request's tenant salt (relokv::extra_keys::tenant_salt: tenants share no block) and
  /// principal (the provenance policy's sender), on either engine.
  std::uint64_t tenant = 0, principal = 0;
  std::function<void(std::size_t done, std::size_t total)> progress;
};

/// Whether this build has relokv inside llama.cpp (run_options::engine = "llama.cpp").
bool has_llama_cpp() noexcept;

/// Runs each request under every variant, interleaved, in one engine and one cache; before a
/// request, its passages are cached (each computed on its own behind what opt.compile names)
/// unless the cache still holds them. @throws std::invalid_argument for a bad opt.compile
/// (naming it) before any work.
std::vector<variant_result> run(std::shared_ptr<const relokv_engine::llama_model> model,
                                const workload& w, const text_codec& codec,
                                const std::vector<variant>& variants, const run_options& opt);

/// KL(softmax(ref) || softmax(got)) of two logit vectors, in nats.
double kl_divergence(const std::vector<float>& ref, const std::vector<float>& got);

/// SQuAD's answer normalization, exactly: lowercase, ASCII punctuation deleted (not turned into
/// spaces), the articles a/an/the removed, whitespace collapsed.
std::string squad_normalize(const std::string& s);
/// SQuAD's token F1 and exact match between two answers.
double answer_f1(const std::string& prediction, const std::string& gold);
double exact_match(const std::string& prediction, const std::string& gold);

/// A mean with its bootstrap 95% interval (resampling the requests, 2,000 draws, seeded).
struct estimate {
  double mean = 0, lo = 0, hi = 0;
};
estimate bootstrap_mean(const std::vector<double>& v, std::uint32_t seed = 1);
/// mean(num) / mean(den) over paired per-request values (F1 over full recompute's F1), with
/// its bootstrap 95% interval (the pairs resampled together).
estimate bootstrap_ratio(const std::vector<double>& num, const std::vector<double>& den,
                         std::uint32_t seed = 1);
double percentile(std::vector<double> v, double p);
/// The plain mean (0 for no values).
double mean(const std::vector<double>& v);

}  // namespace relokv_rag
