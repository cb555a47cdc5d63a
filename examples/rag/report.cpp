// relokv_rag's outputs (see report.hpp).
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace relokv_rag {
namespace {

std::string fmt(double v, int prec = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}
estimate scaled(estimate e, double f) { return {e.mean * f, e.lo * f, e.hi * f}; }
nlohmann::json to_json(const estimate& e) { return {{"mean", e.mean}, {"lo", e.lo}, {"hi", e.hi}}; }
const char* kColors[] = {"#222",    "#888",    "#d62728", "#ff7f0e", "#2ca02c",
                         "#1f77b4", "#9467bd", "#8c564b", "#e377c2"};
constexpr std::size_t kNumColors = sizeof kColors / sizeof kColors[0];

}  // namespace

std::vector<row> rows_of(const std::vector<variant_result>& res) {
  std::vector<row> out;
  for (const auto& r : res) {
    const double blocks = r.blocks ? double(r.blocks) : 1.0;
    row w;
    w.name = r.name;
    w.key = r.key;
    w.note = r.note;
    w.p50 = percentile(r.ttft_ms, 50);
    w.p95 = percentile(r.ttft_ms, 95);
    w.computed = mean(r.computed);
    w.work = 100.0 * mean(r.work);
    w.exact = 100.0 * double(r.exact) / blocks;
    w.reloc = 100.0 * double(r.relocated) / blocks;
    w.rps = r.busy_s > 0 ? double(r.ttft_ms.size()) / r.busy_s : 0;
    w.kv_mib = double(r.peak_kv_bytes) / (1 << 20);
    w.kl = bootstrap_mean(r.kl);
    w.answer_kl = bootstrap_mean(r.answer_kl);
    w.agree = scaled(bootstrap_mean(r.agreement), 100);
    w.em = scaled(bootstrap_mean(r.em), 100);
    w.f1 = scaled(bootstrap_mean(r.f1), 100);
    w.tf = scaled(bootstrap_mean(r.tf_agreement), 100);
    w.f1_rel = bootstrap_ratio(r.f1, res.front().f1);
    double same = 0;
    for (double a : r.agreement) same += a == 1.0;
    w.identical = r.agreement.empty() ? 0 : 100.0 * same / double(r.agreement.size());
    w.escalated = 100.0 * mean(r.escalated);
    out.push_back(std::move(w));
  }
  return out;
}

void print_table(const std::vector<row>& rows) {
  std::printf("\n%-34s %9s %9s %8s %6s %6s %6s %6s %19s %19s %17s %6s %6s\n", "variant", "TTFT p50",
              "TTFT p95", "computed", "work%", "exact%", "reloc%", "req/s", "first-token KL",
              "answer KL", "agree% [95% CI]", "EM%", "F1%");
  for (const auto& r : rows)
    std::printf(
        "%-34s %7.1fms %7.1fms %8.1f %6.1f %6.1f %6.1f %6.2f %6.3f [%.3f,%.3f] %6.3f "
        "[%.3f,%.3f] %5.1f [%4.1f,%5.1f] %6.1f %6.1f\n",
        r.name.c_str(), r.p50, r.p95, r.computed, r.work, r.exact, r.reloc, r.rps, r.kl.mean,
        r.kl.lo, r.kl.hi, r.answer_kl.mean, r.answer_kl.lo, r.answer_kl.hi, r.agree.mean,
        r.agree.lo, r.agree.hi, r.em.mean, r.f1.mean);
}

void write_csv(const std::string& path, const std::vector<row>& rows) {
  std::ofstream o(path);
  o << "variant,ttft_p50_ms,ttft_p95_ms,tokens_computed,work_pct,exact_hit_pct,"
       "relocated_hit_pct,requests_per_s,kv_mib,kl,kl_lo,kl_hi,answer_kl,answer_kl_lo,"
       "answer_kl_hi,agreement_pct,agreement_lo,agreement_hi,em_pct,em_lo,em_hi,f1_pct,f1_lo,"
       "f1_hi\n";
  for (const auto& r : rows) {
    o << '"' << r.name << "\"," << r.p50 << ',' << r.p95 << ',' << r.computed << ',' << r.work
      << ',' << r.exact << ',' << r.reloc << ',' << r.rps << ',' << r.kv_mib;
    for (const estimate* e : {&r.kl, &r.answer_kl, &r.agree, &r.em, &r.f1})
      o << ',' << e->mean << ',' << e->lo << ',' << e->hi;
    o << '\n';
  }
  if (!o) throw std::runtime_error(path + ": cannot write");
}

void write_json(const std::string& path, const std::vector<row>& rows, const std::string& source,
                std::size_t requests, const std::string& placement, const std::string& model) {
  nlohmann::json doc = {{"source", source},
                        {"requests", requests},
                        {"placement", placement},
                        {"model", model},
                        {"intervals", "bootstrap 95% over requests"},
                        {"variants", nlohmann::json::array()}};
  for (const auto& r : rows)
    doc["variants"].push_back({{"name", r.name},
                               {"key", r.key},
                               {"ttft_p50_ms", r.p50},
                               {"ttft_p95_ms", r.p95},
                               {"tokens_computed", r.computed},
                               {"work_pct", r.work},
                               {"exact_hit_pct", r.exact},
                               {"relocated_hit_pct", r.reloc},
                               {"requests_per_s", r.rps},
                               {"kv_mib", r.kv_mib},
                               {"first_token_kl", to_json(r.kl)},
                               {"answer_kl", to_json(r.answer_kl)},
                               {"agreement_pct", to_json(r.agree)},
                               {"em_pct", to_json(r.em)},
                               {"f1_pct", to_json(r.f1)},
                               {"teacher_forced_pct", to_json(r.tf)},
                               {"f1_over_full", to_json(r.f1_rel)},
                               {"identical_pct", r.identical},
                               {"escalated_pct", r.escalated}});
  std::ofstream o(path);
  o << doc.dump(1) << "\n";
  if (!o) throw std::runtime_error(path + ": cannot write");
}

void write_svg(const std::string& path, const std::vector<row>& rows,
               const std::vector<variant_result>& res) {
  std::ofstream o(path);
  const double W = 900, H = 420, pw = 400, ph = 300, x0 = 60, y0 = 50, x1 = 520;
  double tmax = 1e-9;
  for (const auto& r : rows) tmax = std::max(tmax, r.p50);
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' "
       "fill='white'/>\n";
  o << "<text x='" << x0
    << "' y='25' font-size='14'>TTFT p50 (ms) vs agreement with full recompute (%)</text>\n";
  o << "<rect x='" << x0 << "' y='" << y0 << "' width='" << pw << "' height='" << ph
    << "' fill='none' stroke='#999'/>\n";
  for (int t = 0; t <= 4; ++t) {
    const double y = y0 + ph - ph * t / 4.0;
    o << "<text x='" << x0 - 30 << "' y='" << y + 4 << "'>" << t * 25 << "</text>\n";
    const double x = x0 + pw * t / 4.0;
    o << "<text x='" << x - 10 << "' y='" << y0 + ph + 16 << "'>" << fmt(tmax * 1.1 * t / 4, 0)
      << "</text>\n";
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double x = x0 + pw * rows[i].p50 / (tmax * 1.1);
    const double y = y0 + ph - ph * rows[i].agree.mean / 100;
    const char* c = kColors[i % kNumColors];
    o << "<line x1='" << x << "' x2='" << x << "' y1='" << y0 + ph - ph * rows[i].agree.lo / 100
      << "' y2='" << y0 + ph - ph * rows[i].agree.hi / 100 << "' stroke='" << c << "'/>\n";
    o << "<circle cx='" << x << "' cy='" << y << "' r='5' fill='" << c << "'/>\n";
    o << "<text x='" << x + 7 << "' y='" << y - 6 - 11.0 * double(i % 3) << "' fill='" << c << "'>"
      << rows[i].name << "</text>\n";
  }
  o << "<text x='" << x1 << "' y='25' font-size='14'>prefill tokens computed per request</text>\n";
  o << "<rect x='" << x1 << "' y='" << y0 << "' width='" << 340 << "' height='" << ph
    << "' fill='none' stroke='#999'/>\n";
  double cmax = 1;
  std::size_t n = 1;
  for (const auto& r : res) {
    for (double c : r.computed) cmax = std::max(cmax, c);
    n = std::max(n, r.computed.size());
  }
  for (std::size_t v = 0; v < res.size(); ++v) {
    o << "<polyline fill='none' stroke='" << kColors[v % kNumColors] << "' points='";
    for (std::size_t i = 0; i < res[v].computed.size(); ++i)
      o << x1 + 340.0 * double(i) / double(std::max<std::size_t>(n - 1, 1)) << ","
        << y0 + ph - ph * res[v].computed[i] / cmax << " ";
    o << "'/>\n";
  }
  o << "<text x='" << x1 << "' y='" << y0 + ph + 16 << "'>request</text><text x='" << x1 - 40
    << "' y='" << y0 + 10 << "'>" << fmt(cmax, 0) << "</text>\n</svg>\n";
  if (!o) throw std::runtime_error(path + ": cannot write");
}

void write_sweep_csv(const std::string& path, const std::vector<sweep_point>& pts,
                     const std::string& model) {
  std::ofstream o(path);
  o << "model,kind,label,budget,work_pct,ttft_p50_ms,first_token_kl,kl_lo,kl_hi,answer_kl,"
       "answer_kl_lo,answer_kl_hi,agreement_pct,agreement_lo,agreement_hi,em_pct,f1_pct\n";
  for (const auto& p : pts)
    o << '"' << model << "\"," << p.kind << ",\"" << p.label << "\"," << p.budget << ',' << p.r.work
      << ',' << p.r.p50 << ',' << p.r.kl.mean << ',' << p.r.kl.lo << ',' << p.r.kl.hi << ','
      << p.r.answer_kl.mean << ',' << p.r.answer_kl.lo << ',' << p.r.answer_kl.hi << ','
      << p.r.agree.mean << ',' << p.r.agree.lo << ',' << p.r.agree.hi << ',' << p.r.em.mean << ','
      << p.r.f1.mean << '\n';
  if (!o) throw std::runtime_error(path + ": cannot write");
}

void write_sweep_svg(const std::string& path, const std::vector<sweep_point>& pts,
                     const std::string& title) {
  std::map<std::string, std::vector<const sweep_point*>> by_kind;
  std::vector<std::string> order;
  double wmax = 1;
  double klmax = 1e-3;
  for (const auto& p : pts) {
    if (!by_kind.count(p.kind)) order.push_back(p.kind);
    by_kind[p.kind].push_back(&p);
    wmax = std::max(wmax, p.r.work);
    klmax = std::max(klmax, p.r.kl.hi);
  }
  for (auto& [k, v] : by_kind)
    std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->r.work < b->r.work; });
  wmax = std::ceil(wmax / 10) * 10;
  const double pw = 380, ph = 280, y0 = 60, xa = 60, xb = 520;
  std::ofstream o(path);
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='960' height='420' "
       "font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' "
       "fill='white'/>\n<text x='60' y='22' font-size='14'>"
    << title << "</text>\n";
  // Left: first-token KL (log scale from 1e-3); right: agreement (%). x: prefill work (%).
  const double lmin = std::log10(1e-3), lmax = std::log10(klmax) + 0.1;
  auto ykl = [&](double kl) {
    return y0 + ph - ph * (std::log10(std::max(kl, 1e-3)) - lmin) / (lmax - lmin);
  };
  auto yag = [&](double a) { return y0 + ph - ph * a / 100.0; };
  auto xw = [&](double x0, double w) { return x0 + pw * w / wmax; };
  for (double x0 : {xa, xb}) {
    o << "<rect x='" << x0 << "' y='" << y0 << "' width='" << pw << "' height='" << ph
      << "' fill='none' stroke='#999'/>\n";
    for (int t = 0; t <= 5; ++t)
      o << "<text x='" << xw(x0, wmax * t / 5) - 8 << "' y='" << y0 + ph + 15 << "'>"
        << fmt(wmax * t / 5, 0) << "</text>\n";
    o << "<text x='" << x0 + pw / 2 - 80 << "' y='" << y0 + ph + 32
      << "'>prefill work, % of full recompute</text>\n";
  }
  o << "<text x='" << xa << "' y='" << y0 - 8 << "'>first-token KL to full (log)</text>\n";
  for (double v = 1e-3; v <= klmax * 1.3; v *= 10)
    o << "<text x='" << xa - 40 << "' y='" << ykl(v) + 4 << "'>" << fmt(v, 3) << "</text>\n";
  o << "<text x='" << xb << "' y='" << y0 - 8 << "'>greedy agreement with full (%)</text>\n";
  for (int t = 0; t <= 4; ++t)
    o << "<text x='" << xb - 25 << "' y='" << yag(25.0 * t) + 4 << "'>" << 25 * t << "</text>\n";
  for (std::size_t i = 0; i < order.size(); ++i) {
    const char* c = kColors[(i + 2) % kNumColors];
    const auto& v = by_kind[order[i]];
    for (int panel = 0; panel < 2; ++panel) {
      const double x0 = panel == 0 ? xa : xb;
      o << "<polyline fill='none' stroke='" << c << "' stroke-width='1.5' points='";
      for (const auto* p : v)
        o << xw(x0, p->r.work) << ',' << (panel == 0 ? ykl(p->r.kl.mean) : yag(p->r.agree.mean))
          << ' ';
      o << "'/>\n";
      for (const auto* p : v) {
        const double x = xw(x0, p->r.work);
        const double lo = panel == 0 ? ykl(p->r.kl.lo) : yag(p->r.agree.lo);
        const double hi = panel == 0 ? ykl(p->r.kl.hi) : yag(p->r.agree.hi);
        o << "<line x1='" << x << "' x2='" << x << "' y1='" << lo << "' y2='" << hi << "' stroke='"
          << c << "' opacity='0.5'/><circle cx='" << x << "' cy='"
          << (panel == 0 ? ykl(p->r.kl.mean) : yag(p->r.agree.mean)) << "' r='3' fill='" << c
          << "'><title>" << p->label << "</title></circle>\n";
      }
    }
    o << "<text x='" << xb + pw + 8 << "' y='" << y0 + 14 * double(i) + 10 << "' fill='" << c
      << "'>" << order[i] << "</text>\n";
  }
  o << "</svg>\n";
  if (!o) throw std::runtime_error(path + ": cannot write");
}

void print_summary(const std::vector<row>& rows, bool synthetic) {
  print_table(rows);
  // Beside free-running agreement (one near-tie flip changes the rest of an answer): each
  // answer token given full recompute's answer so far, and F1 as the papers report it.
  std::printf("\n%-34s %21s %21s %11s %10s\n", "variant", "teacher-forced% [CI]",
              "F1 / full's F1 [CI]", "identical%", "escalated%");
  for (const auto& r : rows)
    std::printf("%-34s %5.1f [%5.1f,%5.1f] %6.2f [%5.2f,%5.2f] %11.1f %10.1f\n", r.name.c_str(),
                r.tf.mean, r.tf.lo, r.tf.hi, r.f1_rel.mean, r.f1_rel.lo, r.f1_rel.hi, r.identical,
                r.escalated);
  std::printf("\nTTFT speedup over full prefill:");
  for (std::size_t i = 1; i < rows.size(); ++i)
    std::printf(" %s %.1fx;", rows[i].name.c_str(), rows[0].p50 / rows[i].p50);
  std::printf("\n");
  for (const auto& r : rows)
    if (!r.note.empty()) std::printf("  %s: %s\n", r.name.c_str(), r.note.c_str());
  if (synthetic)
    std::printf(
        "\n*** synthetic model (random weights, offline): EM and F1 against the generator's "
        "answers mean nothing; KL and agreement still compare the variants. Run "
        "scripts/get-model for a real one. ***\n");
}

}  // namespace relokv_rag
