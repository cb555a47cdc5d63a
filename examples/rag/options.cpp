// relokv_rag's options (see options.hpp).
#include "options.hpp"

#include <sstream>
#include <string>

namespace relokv_rag {

std::string default_data() {
#ifdef RELOKV_RAG_SAMPLE
  return RELOKV_RAG_SAMPLE;
#else
  return "data/2wikimqa_dev_sample200.jsonl";
#endif
}

void add_options(CLI::App& app, options& o) {
  app.description(
      "Runs a multi-document QA workload under every position-independent caching variant, all "
      "served by ONE relocatable_cache with their requests interleaved, and compares each with "
      "full recompute: TTFT, prefill work, hit rates, KV memory, the KL divergence of the first "
      "answer token and of the whole answer (teacher-forced), greedy agreement, EM and F1, each "
      "with a bootstrap 95% interval.");
  // Every number is range-checked here, so that a bad value is a message, never a division
  // by zero or an out-of-bounds read further down (the library functions check again).
  auto* data = app.add_option("--data", o.data,
                              "2WikiMultihopQA-style JSONL (question, answer, context as [[title, "
                              "[sentences]], ...]); default with a model: the sample shipped in "
                              "data/ (" +
                                  default_data() + ")");
  app.add_flag("--generator", o.generator,
               "the built-in generator of random passages instead of a data file (the default "
               "of the synthetic model)")
      ->excludes(data);
  app.add_option("--requests", o.requests, "questions to run")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--passages", o.passages, "generator: passages per question")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}))
      ->capture_default_str();
  app.add_option("--corpus", o.corpus, "generator: passages in the corpus")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--zipf", o.zipf, "generator: Zipf exponent of passage popularity")
      ->check(CLI::Range(0.0, 16.0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed for passage order and the generator")
      ->capture_default_str();
  app.add_option("--model", o.model,
                 "GGUF model path, or a name scripts/get-model knows (smollm2, qwen2.5-0.5b), or "
                 "auto ($RELOKV_MODEL or the smollm2 cache); default: the synthetic model");
  app.add_flag("--synthetic", o.synthetic, "the offline synthetic model (the default)");
  app.add_option("--placement", o.run.placement, "pre_rotated, at_attention or block_relative")
      ->check(CLI::IsMember({"pre_rotated", "at_attention", "block_relative"}))
      ->capture_default_str();
  app.add_option("--compile-behind", o.run.compile,
                 "what passages are cached behind: prompt (the system prompt), alone (nothing) "
                 "or absorber:N (the system prompt's first N tokens, named by every request as "
                 "its span_context: a sink-absorbing compile)")
      ->capture_default_str();
  app.add_option("--engine", o.run.engine,
                 "relokv (the example engine) or llama.cpp (a relocatable_cache in charge of a "
                 "llama.cpp context: pre_rotated through llama.cpp's K-shift, KV f16 or fp32, "
                 "static strategies; default variants prefix,naive,epic,seam)")
      ->check(CLI::IsMember({"relokv", "llama.cpp"}))
      ->capture_default_str();
  app.add_option("--tenant", o.run.tenant,
                 "every request's tenant salt (its keys: tenants share no cached block)")
      ->capture_default_str();
  app.add_option("--principal", o.run.principal,
                 "every request's sender, for the provenance policy (a span computed in "
                 "another's context is served relocated only to the principal who computed it)")
      ->capture_default_str();
  app.add_option("--kv-dtype", o.run.kv_dtype,
                 "the KV pool's element type: bf16 or fp32 (llama.cpp: bf16 means its f16)")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  app.add_option("--max-answer", o.run.max_answer, "greedy answer tokens")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--first-k", o.first_k, "EPIC's tokens per span, and KVBoost's seam window")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--topk", o.topk, "CacheBlend's recompute ratio in [0, 1]")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  app.add_option("--variants", o.variants,
                 "comma-separated subset of full, prefix, naive, block, epic, kvboost, "
                 "cacheblend, union, question, qepic, ape, seam (full always runs first, as the "
                 "reference)");
  app.add_option("--profile", o.profile,
                 "a strategy profile (--calibrate's output): adds the variant it selects");
  app.add_option("--sweep", o.sweep_out,
                 "run every strategy over its budget; write PREFIX.csv and PREFIX.svg "
                 "(accuracy against prefill work)");
  app.add_option("--calibrate", o.calibrate_out,
                 "sweep, then write as a profile (JSON) the least-work choice of: the "
                 "cheapest strategy within --max-kl and --min-agreement, or a strategy with "
                 "an escalation threshold whose agreement reaches --min-agreement (fitted on "
                 "half the questions, measured on the other half)");
  app.add_option("--escalate", o.escalate,
                 "also run each variant (but full and prefix) with this per-request escalation "
                 "to full recompute: margin<T or entropy>T, then @first (before the first token) "
                 "or @every (before any answer token); e.g. margin<0.3@first");
  app.add_option("--layer-deviation", o.layer_deviation_out,
                 "the layer-deviation study: relocated spans' K/V against full recompute's at "
                 "every layer (cosine), by layer kind (windowed or global) and by offset in the "
                 "span (below the window or beyond it), for spans of one passage and of half "
                 "the passages each; writes PREFIX.md and PREFIX.json");
  app.add_option("--escalation", o.escalation_out,
                 "the escalation study: naive, EPIC and the question's attention with every "
                 "signal, thresholds fitted on half the questions for --target-agreement and "
                 "reported on the other half, the chosen policy run on that half; writes "
                 "PREFIX.md, PREFIX.svg and PREFIX.json");
  app.add_option("--target-agreement", o.target_agreement,
                 "the escalation study's target agreement with full recompute, in [0, 1]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--max-kl", o.max_kl, "calibration: largest mean first-token KL allowed")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--min-agreement", o.min_agreement,
                 "calibration: smallest mean greedy agreement allowed, in [0, 1]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--export-workload", o.export_out,
                 "write the tokenized workload (system prompt, passages, questions, the end of "
                 "turn) as JSON and exit: what tools/links trains on, tokenized as the "
                 "measurements are");
  app.add_option("--links", o.links,
                 "a span-link adapter (tools/links/make-learned): adds the variants links "
                 "(naive reuse plus the learned rows), links+epic and links+question")
      ->check(CLI::ExistingFile);
  app.add_option("--link-variants", o.link_variants,
                 "with --links: the comma-separated subset of links, links+epic, links+question "
                 "to run")
      ->check([](const std::string& s) {
        std::stringstream in(s);
        for (std::string k; std::getline(in, k, ',');)
          if (k != "links" && k != "links+epic" && k != "links+question")
            return "unknown link variant '" + k + "' (links, links+epic, links+question)";
        return std::string();
      });
  app.add_option("--json", o.json_out, "results as JSON");
  app.add_option("--csv", o.csv_out, "results as CSV");
  app.add_option("--svg", o.svg_out, "plot: TTFT against agreement, tokens computed per request");
  app.add_flag("--quiet", o.quiet, "no progress bar");
  app.add_option("--store", o.store,
                 "share spans through a store: redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]"
                 "[?prefix=P] (USER@HOST: the password from $RELOKV_REDIS_PASSWORD), "
                 "unix:///SOCKET, redis-cluster://HOST:PORT[,HOST:PORT...][?prefix=P] (a Redis "
                 "Cluster), file:DIR[?prefix=TENANT] or memory:. A "
                 "writer instance caches every question's passages into it, then a reader "
                 "instance with an empty pool answers the questions reusing them (variants "
                 "default to full,naive,epic)");
  app.add_option("--store-key-file", o.store_key_file,
                 "with --store: seal every stored block (AES-256-GCM) with the key in this file "
                 "(32 bytes or 64 hex digits, mode 0600); a block that does not open is a miss")
      ->check(CLI::ExistingFile);
  app.add_option("--store-key-env", o.store_key_env,
                 "with --store: as --store-key-file, the key (64 hex digits) in this environment "
                 "variable");
  app.add_option("--role", o.role,
                 "with --store: writer, reader, or both (the writer as a second process, then "
                 "the reader here; one process for memory:)")
      ->check(CLI::IsMember({"writer", "reader", "both"}))
      ->capture_default_str();
}

}  // namespace relokv_rag
