// Multi-document QA workload and runner (see rag.hpp).
#include "rag.hpp"

#include "run_engine.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include <relokv/layout/builder.hpp>

namespace relokv_rag {

std::vector<relokv::token_t> text_codec::encode(const std::string& s) const {
  if (tok) return tok->encode(s);
  std::vector<relokv::token_t> out;
  for (unsigned char c : s) out.push_back(static_cast<relokv::token_t>(c % vocab));
  return out;
}
std::string text_codec::open(const std::string& system) const {
  if (tok) return tok->open(system);
  return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n";
}
std::string text_codec::close() const {
  return tok ? tok->close() : "<|im_end|>\n<|im_start|>assistant\n";
}
std::string text_codec::decode(const std::vector<relokv::token_t>& t) const {
  if (tok) {
    std::string s = tok->decode(t);
    for (const std::string& stop : tok->stop_texts())
      if (const auto p = s.find(stop); p != std::string::npos) s.resize(p);
    return s;
  }
  std::string s;
  for (auto x : t) s += std::to_string(x) + " ";
  return s;
}

workload load_jsonl(const std::string& path, std::size_t max_requests, std::uint32_t seed,
                    const text_codec& codec) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  workload w;
  w.source = path;
  w.prefix = codec.encode(codec.open("Answer the question from the documents, in a few words."));
  std::map<std::string, std::size_t> index;
  std::mt19937 rng(seed);
  std::string line;
  for (std::size_t lineno = 1; std::getline(in, line) && w.requests.size() < max_requests;
       ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    const qa_record rec = parse_qa_line(line, path + ":" + std::to_string(lineno));
    qa_request r;
    r.question = rec.question;
    r.answer = rec.answer;
    for (const auto& [title, text] : rec.passages) {
      const std::string key = title + "\n" + text;
      auto it = index.find(key);
      if (it == index.end()) {
        passage p{title, text, codec.encode("Document: " + title + "\n" + text + "\n")};
        it = index.emplace(key, w.corpus.size()).first;
        w.corpus.push_back(std::move(p));
      }
      r.passages.push_back(it->second);
    }
    std::shuffle(r.passages.begin(), r.passages.end(), rng);
    r.question_tokens = codec.encode("Question: " + r.question + codec.close());
    r.answer_tokens = codec.encode(r.answer);
    w.requests.push_back(std::move(r));
  }
  if (in.bad()) throw std::runtime_error(path + ": read error");
  if (w.requests.empty()) throw std::runtime_error(path + ": no requests");
  return w;
}

workload generate(std::size_t requests, std::size_t corpus, std::size_t k, double zipf,
                  std::uint32_t seed, std::int32_t vocab) {
  if (corpus == 0 || k == 0)
    throw std::invalid_argument(
        "the generator needs at least one passage per question and one "
        "in the corpus (got " +
        std::to_string(k) + " and " + std::to_string(corpus) + ")");
  if (!(zipf >= 0) || vocab < 16)
    throw std::invalid_argument(
        "the generator needs a Zipf exponent >= 0 and a vocabulary of "
        "at least 16 tokens");
  std::mt19937 rng(seed);
  workload w;
  w.source = "generator";
  std::uniform_int_distribution<relokv::token_t> tok(3, vocab - 1);
  for (int i = 0; i < 24; ++i) w.prefix.push_back(tok(rng));
  std::uniform_int_distribution<int> len(60, 140);
  for (std::size_t i = 0; i < corpus; ++i) {
    passage p;
    p.title = "passage " + std::to_string(i);
    const int n = len(rng);
    for (int t = 0; t < n; ++t) p.tokens.push_back(tok(rng));
    w.corpus.push_back(std::move(p));
  }
  std::vector<double> weight(corpus);  // Zipf popularity
  for (std::size_t i = 0; i < corpus; ++i) weight[i] = 1.0 / std::pow(double(i + 1), zipf);
  std::discrete_distribution<std::size_t> pick(weight.begin(), weight.end());
  for (std::size_t r = 0; r < requests; ++r) {
    qa_request q;
    while (q.passages.size() < std::min(k, corpus)) {
      const std::size_t p = pick(rng);
      if (std::find(q.passages.begin(), q.passages.end(), p) == q.passages.end())
        q.passages.push_back(p);
    }
    std::shuffle(q.passages.begin(), q.passages.end(), rng);
    for (int t = 0; t < 12; ++t) q.question_tokens.push_back(tok(rng));
    const auto& src = w.corpus[q.passages[rng() % q.passages.size()]].tokens;
    q.answer_tokens.assign(src.begin() + 5, src.begin() + 9);
    for (auto t : q.answer_tokens) q.answer += std::to_string(t) + " ";
    w.requests.push_back(std::move(q));
  }
  return w;
}

std::vector<variant> default_variants(std::int32_t first_k, float topk) {
  std::vector<variant> out;
  for (const auto& n : relokv_engine::strategy_table(first_k, topk))
    out.push_back(variant{n.name, n.spec.make(), n.spans, n.note, n.key, n.spec});
  return out;
}

std::vector<variant> pick_variants(std::vector<variant> all, const std::vector<std::string>& keys) {
  if (keys.empty()) return all;
  std::vector<bool> keep(all.size(), false);
  keep[0] = true;  // the reference
  for (const auto& key : keys) {
    std::size_t k = 0;
    while (k < all.size() && all[k].key != key) ++k;
    if (k == all.size()) {
      std::string known;
      for (const auto& v : all) known += (known.empty() ? "" : ", ") + v.key;
      throw relokv::error("unknown variant '" + key + "' (" + known + ")");
    }
    keep[k] = true;
  }
  std::vector<variant> out;
  for (std::size_t k = 0; k < all.size(); ++k)
    if (keep[k]) out.push_back(std::move(all[k]));
  return out;
}

variant variant_of(const relokv_engine::strategy_spec& spec) {
  // Full recompute is the reference: the prompt as one segment, as an engine without relokv
  // would see it. (Over the span layout its blocks break at other slots, and bf16 keys stored
  // rotated by their slot round differently: first-token logits move by up to ~0.1.)
  return {spec.label(), spec.make(), spec.kind != "full", "", spec.kind, spec};
}

std::vector<variant> sweep_variants() {
  using relokv_engine::strategy_spec;
  std::vector<variant> out = {variant_of({"full"}), variant_of({"none"})};
  for (int k : {1, 2, 4, 8, 16, 32}) out.push_back(variant_of({"first_k", k}));
  for (int k : {4, 16}) out.push_back(variant_of({"kvboost", k, 0.15f}));
  for (float r : {0.05f, 0.10f, 0.15f, 0.30f}) out.push_back(variant_of({"deviation_topk", 0, r}));
  for (auto [k, r] : {std::pair{2, 0.05f}, std::pair{4, 0.10f}, std::pair{16, 0.15f}})
    out.push_back(variant_of({"union", k, r}));
  for (float r : {0.05f, 0.10f, 0.15f, 0.20f}) out.push_back(variant_of({"question", 0, r}));
  for (float r : {0.06f, 0.12f}) out.push_back(variant_of({"question", 2, r}));
  for (auto [t, sc] : {std::pair{0.9f, 0.9f}, std::pair{0.7f, 1.0f}})
    out.push_back(variant_of({"ape", 0, 0.0f, t, sc}));
  return out;
}

std::vector<variant> link_variants(std::int32_t first_k, float topk, bool sweep) {
  using relokv_engine::strategy_spec;
  const auto v = [](const std::string& name, const strategy_spec& spec, const std::string& key) {
    variant out = variant_of(spec);
    out.name = name;
    out.key = key;
    out.note = "learned link rows before the question (tools/links)";
    out.links = true;
    return out;
  };
  std::vector<variant> out = {v("Links (naive + links)", {"none"}, "links")};
  if (sweep) {
    for (int k : {1, 2, 4, 8, 16})
      out.push_back(v("Links + EPIC k=" + std::to_string(k), {"first_k", k}, "links+epic"));
    for (float r : {0.05f, 0.10f, 0.15f, 0.20f})
      out.push_back(v("Links + question " + std::to_string(int(r * 100 + 0.5f)) + "%",
                      {"question", 0, r}, "links+question"));
    return out;
  }
  out.push_back(v("Links + EPIC k=" + std::to_string(first_k), {"first_k", first_k}, "links+epic"));
  out.push_back(v("Links + question " + std::to_string(int(topk * 100 + 0.5f)) + "%",
                  {"question", 0, topk}, "links+question"));
  return out;
}

double kl_divergence(const std::vector<float>& ref, const std::vector<float>& got) {
  const double mr = *std::max_element(ref.begin(), ref.end());
  const double mg = *std::max_element(got.begin(), got.end());
  double zr = 0, zg = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    zr += std::exp(ref[i] - mr);
    zg += std::exp(got[i] - mg);
  }
  double kl = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double lp = ref[i] - mr - std::log(zr), lq = got[i] - mg - std::log(zg);
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(0.0, kl);
}

namespace detail {

/// Scores one answer against the reference's: first-token KL, the mean KL along the
/// reference's answer, greedy agreement (token by token, end-of-turn dropped), F1 and EM.
void score_answer(const std::vector<std::vector<float>>& ref_steps,
                  const std::vector<std::vector<float>>& steps,
                  const std::vector<relokv::token_t>& ref_answer,
                  const std::vector<relokv::token_t>& answer, relokv::token_t stop,
                  const qa_request& r, const text_codec& codec, variant_result& out) {
  out.kl.push_back(kl_divergence(ref_steps[0], steps[0]));
  double akl = 0;
  for (std::size_t i = 0; i < ref_steps.size() && i < steps.size(); ++i)
    akl += kl_divergence(ref_steps[i], steps[i]);
  out.answer_kl.push_back(akl / double(std::max<std::size_t>(ref_steps.size(), 1)));
  auto strip = [stop](std::vector<relokv::token_t> a) {
    if (!a.empty() && a.back() == stop) a.pop_back();
    return a;
  };
  const auto mine = strip(answer), ref = strip(ref_answer);
  std::size_t same = 0;
  for (std::size_t i = 0; i < std::min(mine.size(), ref.size()); ++i) same += mine[i] == ref[i];
  // Two empty answers (the end of turn first: a pretrained model's newline after "Answer:")
  // agree; they counted 0 before.
  out.agreement.push_back(
      mine == ref ? 1.0
                  : double(same) / double(std::max<std::size_t>({mine.size(), ref.size(), 1})));
  const std::string text = codec.decode(mine);
  out.f1.push_back(answer_f1(text, r.answer));
  out.em.push_back(exact_match(text, r.answer));
}

/// The tokens passages are compiled behind for run_options::compile, or none for "prompt".
std::optional<std::vector<relokv::token_t>> compile_context(const std::string& mode,
                                                            const workload& w) {
  if (mode == "prompt") return std::nullopt;
  if (mode == "alone") return std::vector<relokv::token_t>{};
  if (mode.rfind("absorber:", 0) == 0) {
    std::size_t used = 0;
    long n = -1;
    try {
      n = std::stol(mode.substr(9), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != mode.size() - 9 || n < 1 || n > static_cast<long>(w.prefix.size()))
      throw std::invalid_argument("compile mode '" + mode + "': absorber:N needs N in [1, " +
                                  std::to_string(w.prefix.size()) +
                                  "] (the system prompt's length)");
    return std::vector<relokv::token_t>(w.prefix.begin(), w.prefix.begin() + n);
  }
  throw std::invalid_argument("unknown compile mode '" + mode + "' (prompt, alone or absorber:N)");
}

std::size_t longest_prompt(const workload& w) {
  std::size_t longest = 0;
  for (const qa_request& r : w.requests) {
    std::size_t n = w.prefix.size() + r.question_tokens.size();
    for (std::size_t p : r.passages) n += w.corpus[p].tokens.size();
    longest = std::max(longest, n);
  }
  return longest;
}

#ifndef RELOKV_RAG_LLAMA_CPP
std::vector<variant_result> run_llama_cpp(std::shared_ptr<const relokv_engine::llama_model>,
                                          const workload&, const text_codec&,
                                          const std::vector<variant>&, const run_options&) {
  throw std::invalid_argument(
      "engine llama.cpp: this build has no llama.cpp (run scripts/get-llama-cpp and configure "
      "with -DRELOKV_WITH_LLAMA_CPP=ON -DCMAKE_PREFIX_PATH=<its output>; scripts/test does)");
}
#endif

}  // namespace detail

#ifdef RELOKV_RAG_LLAMA_CPP
bool has_llama_cpp() noexcept { return true; }
#else
bool has_llama_cpp() noexcept { return false; }
#endif

namespace {

template <class P, class T>
std::vector<variant_result> run_with(std::shared_ptr<const relokv_engine::llama_model> model,
                                     const workload& w, const text_codec& codec,
                                     const std::vector<variant>& variants, const run_options& opt) {
  relokv_engine::llama_engine<P, T> eng(model, opt.num_blocks);
  // The noise floor: full prefill of the same prompt with fp32 KV, against the bf16 reference
  // (what the KV's own rounding moves, with no reuse at all). Its own small pool: one prompt.
  std::unique_ptr<relokv_engine::llama_engine<P, float>> eng32;
  if (opt.noise_floor && std::is_same_v<T, relokv::bf16>)
    eng32 = std::make_unique<relokv_engine::llama_engine<P, float>>(
        model,
        static_cast<std::int32_t>(
            (detail::longest_prompt(w) + static_cast<std::size_t>(opt.max_answer)) / 16 + 4));
  const auto block_bytes = static_cast<std::int64_t>(model->cfg.n_layers) * 2 *
                           model->cfg.n_kv_heads * 16 * model->cfg.head_dim *
                           static_cast<std::int64_t>(sizeof(T));
  std::optional<relokv::link_rows> adapter;
  if (model->links) adapter = model->links->layout_rows(model->cfg.vocab);
  detail::engine_under_test e;
  e.eng = &eng;
  e.floor = eng32.get();
  e.blocks_in_use = [&eng] {
    return std::int64_t{eng.cache().allocator().capacity() - eng.cache().allocator().num_free()};
  };
  e.n_layers = model->cfg.n_layers;
  e.block_bytes = block_bytes;
  return detail::run_engine(e, w, codec, variants, opt, adapter);
}

}  // namespace

std::vector<variant_result> run(std::shared_ptr<const relokv_engine::llama_model> model,
                                const workload& w, const text_codec& codec,
                                const std::vector<variant>& variants, const run_options& opt) {
  if (opt.max_answer < 1)
    throw std::invalid_argument("max_answer must be at least 1 (got " +
                                std::to_string(opt.max_answer) + ")");
  if (variants.empty()) throw std::invalid_argument("run needs at least the reference variant");
  (void)detail::compile_context(opt.compile, w);  // a bad mode fails before any work
  if (opt.kv_dtype != "bf16" && opt.kv_dtype != "fp32")
    throw std::invalid_argument("unknown KV dtype '" + opt.kv_dtype + "' (bf16 or fp32)");
  const bool f32 = opt.kv_dtype == "fp32";
  if (opt.engine == "llama.cpp") return detail::run_llama_cpp(model, w, codec, variants, opt);
  if (opt.engine != "relokv")
    throw std::invalid_argument("unknown engine '" + opt.engine + "' (relokv or llama.cpp)");
  if (opt.placement == "pre_rotated")
    return f32 ? run_with<relokv::pre_rotated, float>(model, w, codec, variants, opt)
               : run_with<relokv::pre_rotated, relokv::bf16>(model, w, codec, variants, opt);
  if (opt.placement == "at_attention")
    return f32 ? run_with<relokv::at_attention, float>(model, w, codec, variants, opt)
               : run_with<relokv::at_attention, relokv::bf16>(model, w, codec, variants, opt);
  if (opt.placement == "block_relative")
    return f32 ? run_with<relokv::block_relative, float>(model, w, codec, variants, opt)
               : run_with<relokv::block_relative, relokv::bf16>(model, w, codec, variants, opt);
  throw std::invalid_argument("unknown placement '" + opt.placement +
                              "' (pre_rotated, at_attention or block_relative)");
}

std::string squad_normalize(const std::string& s) {
  std::string lower;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && std::ispunct(u)) continue;  // string.punctuation: deleted
    lower += u < 0x80 ? static_cast<char>(std::tolower(u)) : c;
  }
  std::istringstream in(lower);
  std::string out;
  for (std::string w; in >> w;) {
    if (w == "a" || w == "an" || w == "the") continue;
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

double answer_f1(const std::string& prediction, const std::string& gold) {
  auto words = [](const std::string& s) {
    std::istringstream in(squad_normalize(s));
    std::vector<std::string> out;
    for (std::string t; in >> t;) out.push_back(t);
    return out;
  };
  const auto p = words(prediction), g = words(gold);
  if (p.empty() || g.empty()) return p.empty() && g.empty() ? 1.0 : 0.0;
  std::map<std::string, int> count;
  for (const auto& t : g) ++count[t];
  int common = 0;
  for (const auto& t : p)
    if (count[t]-- > 0) ++common;
  if (common == 0) return 0.0;
  const double prec = double(common) / double(p.size()), rec = double(common) / double(g.size());
  return 2 * prec * rec / (prec + rec);
}

double exact_match(const std::string& prediction, const std::string& gold) {
  return squad_normalize(prediction) == squad_normalize(gold) ? 1.0 : 0.0;
}

estimate bootstrap_mean(const std::vector<double>& v, std::uint32_t seed) {
  if (v.empty()) return {};
  const double n = double(v.size());
  estimate e;
  for (double x : v) e.mean += x;
  e.mean /= n;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, v.size() - 1);
  std::vector<double> means(2000);
  for (double& m : means) {
    double sum = 0;
    for (std::size_t i = 0; i < v.size(); ++i) sum += v[pick(rng)];
    m = sum / n;
  }
  e.lo = percentile(means, 2.5);
  e.hi = percentile(means, 97.5);
  return e;
}

estimate bootstrap_ratio(const std::vector<double>& num, const std::vector<double>& den,
                         std::uint32_t seed) {
  estimate e;
  const std::size_t n = std::min(num.size(), den.size());
  if (n == 0) return e;
  const auto ratio = [&](auto&& pick) {
    double a = 0, b = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = pick(i);
      a += num[k];
      b += den[k];
    }
    return b > 0 ? a / b : -1.0;  // undefined: no F1 in the denominator
  };
  e.mean = std::max(ratio([](std::size_t i) { return i; }), 0.0);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, n - 1);
  std::vector<double> rs;
  for (int k = 0; k < 2000; ++k)  // resamples where full's F1 is all 0 say nothing: left out
    if (const double r = ratio([&](std::size_t) { return pick(rng); }); r >= 0) rs.push_back(r);
  e.lo = percentile(rs, 2.5);
  e.hi = percentile(rs, 97.5);
  return e;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * double(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(idx));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - double(lo));
}

}  // namespace relokv_rag
