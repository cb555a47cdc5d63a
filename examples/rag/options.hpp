#pragma once
// relokv_rag's command line: every option with its default, parsed by CLI11 (Debian
// libcli11-dev; the examples' dependency, never the library's).
#include <cstddef>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "rag.hpp"

namespace relokv_rag {

struct options {
  std::string data, model, json_out, csv_out, svg_out, sweep_out, calibrate_out, profile;
  /// --escalate POLICY (each variant again with it), --escalation PREFIX (the study).
  std::string escalate, escalation_out;
  /// --export-workload PATH: the tokenized workload as JSON (tools/links trains on it).
  std::string export_out;
  /// --links FILE: a span-link adapter (tools/links): adds the links variants.
  std::string links;
  /// --link-variants KEYS: which of links, links+epic, links+question run (default all).
  std::string link_variants = "links,links+epic,links+question";
  /// --layer-deviation PREFIX: reused spans' K/V against full recompute, layer by layer.
  std::string layer_deviation_out;
  double target_agreement = 0.95;
  std::size_t requests = 24, passages = 10, corpus = 40;
  double zipf = 1.0, max_kl = 0.05, min_agreement = 0.8;
  std::uint32_t seed = 1;
  bool quiet = false, synthetic = false, generator = false;
  std::string variants;
  std::string store, role = "both";
  std::string store_key_file, store_key_env;  ///< seal the store's blocks (sealed_store)
  std::int32_t first_k = 16;
  float topk = 0.15f;
  relokv_rag::run_options run;
};

/// The 2WikiMultihopQA sample shipped in the source tree's data/ (its path at configure time).
std::string default_data();

/// Registers every option of relokv_rag on `app`, writing into `o`.
void add_options(CLI::App& app, options& o);

}  // namespace relokv_rag
