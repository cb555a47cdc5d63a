#pragma once
// relokv_rag's outputs: the table, CSV, JSON and SVG of one run, and the budget sweep's curve.
#include <string>
#include <vector>

#include "rag.hpp"

namespace relokv_rag {

/// One variant's summary: latency percentiles, hit rates, and each faithfulness measure as a
/// mean with its bootstrap 95% interval over the requests.
struct row {
  std::string name, key, note;
  double p50 = 0, p95 = 0, computed = 0, work = 0, exact = 0, reloc = 0, rps = 0, kv_mib = 0;
  estimate kl, answer_kl, agree, em, f1;
  /// Teacher-forced top-1 agreement (%), F1 over full recompute's F1, the share of answers
  /// identical to full's (%) and of requests escalated to full recompute (%).
  estimate tf, f1_rel;
  double identical = 0, escalated = 0;
};
std::vector<row> rows_of(const std::vector<variant_result>& res);

void print_table(const std::vector<row>& rows);
/// The table, each variant's TTFT speedup over full prefill and its notes, and a warning when
/// the model is the synthetic one (its EM and F1 mean nothing).
void print_summary(const std::vector<row>& rows, bool synthetic);
void write_csv(const std::string& path, const std::vector<row>& rows);
void write_json(const std::string& path, const std::vector<row>& rows, const std::string& source,
                std::size_t requests, const std::string& placement, const std::string& model);
/// TTFT against agreement per variant, and tokens computed per request.
void write_svg(const std::string& path, const std::vector<row>& rows,
               const std::vector<variant_result>& res);

/// A point of the sweep: a strategy kind at one budget.
struct sweep_point {
  std::string kind, label;
  double budget = 0;  ///< k, or r in percent
  row r;
};
/// Accuracy against recompute: first-token KL and agreement against prefill work (% of full),
/// one line per strategy kind, with the points' 95% intervals.
void write_sweep_svg(const std::string& path, const std::vector<sweep_point>& pts,
                     const std::string& title);
void write_sweep_csv(const std::string& path, const std::vector<sweep_point>& pts,
                     const std::string& model);

}  // namespace relokv_rag
