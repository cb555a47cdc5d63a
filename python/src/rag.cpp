// relokv.rag.run's C++ side: the QA job (relokv_rag's run) with its figures as Python values.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "links.hpp"
#include "load_model.hpp"
#include "model_path.hpp"
#include "rag.hpp"
#include "report.hpp"

namespace relokv_py {
namespace {

using namespace nb::literals;

nb::dict estimate_dict(const relokv_rag::estimate& e) {
  nb::dict d;
  d["mean"] = e.mean;
  d["lo"] = e.lo;
  d["hi"] = e.hi;
  return d;
}

nb::list per_request(const std::vector<double>& v) {
  nb::list l;
  for (double x : v) l.append(x);
  return l;
}

}  // namespace

void bind_rag(nb::module_& m) {
  m.attr("default_data") = RELOKV_RAG_SAMPLE;
  m.def(
      "_rag_run",
      [](std::optional<std::string> model, std::optional<std::string> data,
         const std::vector<std::string>& variants, std::size_t requests, std::int32_t max_answer,
         std::size_t passages, std::size_t corpus, std::int32_t first_k, double topk,
         const std::string& placement, const std::string& kv_dtype, std::uint32_t seed,
         std::optional<std::string> links, bool noise_floor, std::int32_t num_blocks,
         std::optional<std::function<void(std::size_t, std::size_t)>> progress) {
        if (requests == 0) throw relokv::error("rag.run: requests must be positive");
        if (max_answer <= 0) throw relokv::error("rag.run: max_answer must be positive");
        if (passages == 0 || corpus == 0)
          throw relokv::error("rag.run: passages and corpus must be positive");
        if (first_k < 0) throw relokv::error("rag.run: first_k must be >= 0");
        if (!(topk > 0 && topk <= 1)) throw relokv::error("rag.run: topk must be in (0, 1]");
        if (placement != "block_relative" && placement != "at_attention" &&
            placement != "pre_rotated")
          throw relokv::error("rag.run: placement '" + placement +
                              "' is not one of block_relative, at_attention, pre_rotated");
        if (kv_dtype != "bf16" && kv_dtype != "fp32")
          throw relokv::error("rag.run: kv_dtype '" + kv_dtype + "' is not one of bf16, fp32");
        const std::string path = model ? model_path_of(*model) : std::string();
        // The variants by key, the reference (full recompute) first, in relokv_rag's order.
        auto all = relokv_rag::default_variants(first_k, static_cast<float>(topk));
        if (links)
          for (auto& v : relokv_rag::link_variants(first_k, static_cast<float>(topk), false))
            all.push_back(std::move(v));
        auto chosen = relokv_rag::pick_variants(std::move(all), variants);

        std::vector<relokv_rag::variant_result> res;
        std::string source;
        bool synthetic = false;
        {
          nb::gil_scoped_release unlock;
          const auto loaded = relokv_engine::load_model(path);
          auto mdl = loaded.model;
          if (links) mdl = relokv_engine::with_links(mdl, relokv_engine::load_links(*links, *mdl));
          synthetic = !loaded.tokenizer;
          const relokv_rag::text_codec codec{loaded.tokenizer.get(), mdl->cfg.vocab};
          std::string file = data.value_or("");
          if (!data && !path.empty()) file = RELOKV_RAG_SAMPLE;
          const auto w = file.empty() ? relokv_rag::generate(requests, corpus, passages, 1.0, seed,
                                                             mdl->cfg.vocab)
                                      : relokv_rag::load_jsonl(file, requests, seed, codec);
          source = w.source;
          relokv_rag::run_options o;
          o.max_answer = max_answer;
          o.placement = placement;
          o.kv_dtype = kv_dtype;
          o.num_blocks = num_blocks;
          o.noise_floor = noise_floor;
          if (progress)
            o.progress = [&progress](std::size_t done, std::size_t total) {
              nb::gil_scoped_acquire g;
              (*progress)(done, total);
            };
          res = relokv_rag::run(mdl, w, codec, chosen, o);
        }
        const auto rows = relokv_rag::rows_of(res);
        nb::list out;
        for (std::size_t i = 0; i < res.size(); ++i) {
          const auto& r = res[i];
          const auto& w = rows[i];
          nb::dict d;
          d["name"] = w.name;
          d["key"] = w.key;
          d["note"] = w.note;
          d["ttft_p50_ms"] = w.p50;
          d["ttft_p95_ms"] = w.p95;
          d["computed"] = w.computed;
          d["work_pct"] = w.work;
          d["exact_pct"] = w.exact;
          d["relocated_pct"] = w.reloc;
          d["requests_per_s"] = w.rps;
          d["kv_mib"] = w.kv_mib;
          d["first_token_kl"] = estimate_dict(w.kl);
          d["answer_kl"] = estimate_dict(w.answer_kl);
          d["agreement_pct"] = estimate_dict(w.agree);
          d["em_pct"] = estimate_dict(w.em);
          d["f1_pct"] = estimate_dict(w.f1);
          d["tf_agreement_pct"] = estimate_dict(w.tf);
          d["f1_over_full"] = estimate_dict(w.f1_rel);
          d["identical_pct"] = w.identical;
          d["escalated_pct"] = w.escalated;
          nb::dict q;
          q["ttft_ms"] = per_request(r.ttft_ms);
          q["computed"] = per_request(r.computed);
          q["work"] = per_request(r.work);
          q["first_token_kl"] = per_request(r.kl);
          q["answer_kl"] = per_request(r.answer_kl);
          q["agreement"] = per_request(r.agreement);
          q["tf_agreement"] = per_request(r.tf_agreement);
          q["em"] = per_request(r.em);
          q["f1"] = per_request(r.f1);
          nb::list pt;
          for (std::int32_t t : r.prompt_tokens) pt.append(t);
          q["prompt_tokens"] = pt;
          d["requests"] = q;
          out.append(d);
        }
        nb::dict result;
        result["variants"] = out;
        result["source"] = source;
        result["synthetic"] = synthetic;
        result["model"] = path;
        return result;
      },
      "model"_a, "data"_a, "variants"_a, "requests"_a, "max_answer"_a, "passages"_a, "corpus"_a,
      "first_k"_a, "topk"_a, "placement"_a, "kv_dtype"_a, "seed"_a, "links"_a, "noise_floor"_a,
      "num_blocks"_a, "progress"_a = nb::none(),
      "The QA job (use relokv.rag.run): every variant on the same requests in one cache.");
}

}  // namespace relokv_py
