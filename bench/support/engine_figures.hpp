#pragma once
// Reference-engine figures: on SmolLM2 when it is present, else on the synthetic Llama
// (engine_on_real_model says which): prefill and decode throughput at a 1k-token context,
// resident memory against the file, relokv's overhead against a plain contiguous KV buffer,
// and the quantized GEMV kernels' bandwidth against a plain read.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <relokv/attention/detail/amx_bf16.hpp>
#include <relokv/attention/prefill.hpp>
#include <relokv/layout/builder.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/block_relative.hpp>

#include "lanes.hpp"
#include "llama_engine.hpp"
#include "load_model.hpp"
#include "model_path.hpp"
#include "qgemm.hpp"
#include "support/measure.hpp"
#include "tokenizer.hpp"

namespace relokv_bench {

/// BPE encode of one long word (the merge is O(n log n)): milliseconds for 8,000 characters,
/// and the time ratio 8,000 / 2,000 characters (4 is linear; quadratic would be 16).
/// A BPE vocabulary over a..z grown by 2,000 merges of existing tokens (up to 8 letters).
inline relokv_engine::bpe_tokenizer bench_tokenizer() {
  std::mt19937 rng(3);
  std::vector<std::string> tokens, merges;
  for (char c = 'a'; c <= 'z'; ++c) tokens.emplace_back(1, c);
  while (merges.size() < 2000) {
    const std::string l = tokens[rng() % tokens.size()], r = tokens[rng() % tokens.size()];
    if (l.size() + r.size() > 8) continue;
    merges.push_back(l + " " + r);
    tokens.push_back(l + r);
  }
  return relokv_engine::bpe_tokenizer(tokens, merges, {});
}
/// One word of n random letters (no pre-tokenizer split inside it).
inline std::string bench_word(int n, std::uint32_t seed = 4) {
  std::mt19937 rng(seed);
  std::string w;
  for (int i = 0; i < n; ++i) w += static_cast<char>('a' + rng() % 26);
  return w;
}

inline void tokenizer_figures(int reps, std::vector<std::pair<std::string, double>>& out) {
  const auto tok = bench_tokenizer();
  const std::string w2k = bench_word(2000), w8k = bench_word(8000);
  const int r = reps < 5 ? 5 : reps;
  auto enc2 = [&] { keep(tok.encode(w2k)); };
  auto enc8 = [&] { keep(tok.encode(w8k)); };
  out.emplace_back("bpe_word_8k_ms", median_ns(enc8, r, 1) * 1e-6);
  out.emplace_back("bpe_growth_8k_over_2k", median_ratio(enc8, enc2, r, 1));
}

/// Pages resident in this process (bytes), from /proc/self/statm.
inline double resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long size = 0, resident = 0;
  const int got = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) : 0;
}

/// GEMV (one activation row) from weights of type t straight from their blocks, rows split
/// over the engine's two lanes as its matmul does, against a plain read of the same bytes on
/// the same lanes: the fraction of the read's bandwidth the kernel reaches. The matrix (about
/// 48 MB) does not fit in the caches.
inline double gemv_bw_fraction(relokv_engine::ggml_type t, int reps) {
  constexpr int kCols = 4096;
  const auto tr = relokv_engine::traits_of(t);
  const int rows = static_cast<int>(
      48.0 * 1024 * 1024 / (double(kCols) / double(tr.block_elems) * double(tr.block_bytes)));
  auto bytes = std::make_shared<std::vector<std::uint8_t>>(
      static_cast<std::size_t>(rows) * (kCols / tr.block_elems * tr.block_bytes));
  std::mt19937 rng(5);
  for (auto& b : *bytes) b = static_cast<std::uint8_t>(rng() & 0x77);  // finite fp16 scales
  const auto w = relokv_engine::qmatrix::over(t, rows, kCols, bytes->data(), bytes);
  std::vector<float> x(kCols), y(static_cast<std::size_t>(rows));
  for (auto& v : x) v = static_cast<float>(rng() % 1000) / 500.0f - 1.0f;
  relokv_engine::q8_activations xq;
  auto& lanes = relokv_engine::lanes::get();
  const int mid = rows / 2;
  auto gemv = [&] {
    xq.quantize(x.data(), 1, kCols);
    lanes.run([&](int lane) {
      relokv_engine::qmatmul_rows(w, x.data(), &xq, 1, y.data(), rows, lane == 0 ? 0 : mid,
                                  lane == 0 ? mid : rows);
    });
    keep(y[0]);
  };
  std::uint64_t sink[2] = {0, 0};
  auto read = [&] {
    lanes.run([&](int lane) {
      const std::size_t half = w.bytes() / 2 / 64 * 64;
      const auto* p =
          reinterpret_cast<const std::uint64_t*>(bytes->data() + (lane == 0 ? 0 : half));
      std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
      for (std::size_t i = 0; i + 8 <= half / 8; i += 8) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
        s4 += p[i + 4];
        s5 += p[i + 5];
        s6 += p[i + 6];
        s7 += p[i + 7];
      }
      sink[lane] = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    });
    keep(sink[0] + sink[1]);
  };
  const int r = reps < 5 ? 5 : reps;
  return median_ratio(read, gemv, r, 1);
}

/// Prefill's product of 1,024 activation rows with a [1536][576] matrix of type t (SmolLM2's
/// gate) in each of the ways the engine computes it, rows split over the two lanes as its
/// matmul does, activation conversion included.
class gate_product {
 public:
  gate_product(relokv_engine::ggml_type t, unsigned seed) {
    const auto tr = relokv_engine::traits_of(t);
    type_ = t;
    bytes_ = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(kRows) *
                                                         (kCols / tr.block_elems * tr.block_bytes));
    std::mt19937 rng(seed);
    for (auto& b : *bytes_) b = static_cast<std::uint8_t>(rng() & 0x77);  // finite fp16 scales
    w_ = relokv_engine::qmatrix::over(t, kRows, kCols, bytes_->data(), bytes_);
    x_.resize(static_cast<std::size_t>(kN) * kCols);
    y_.resize(static_cast<std::size_t>(kN) * kRows);
    for (auto& v : x_) v = static_cast<float>(rng() % 1000) / 500.0f - 1.0f;
  }
  /// fp32 panels with BLAS (the path before the tiles, and the one use_integer_kernels(false)
  /// keeps).
  void panels() {
    lanes().run([&](int lane) {
      relokv_engine::qmatmul_rows(w_, x_.data(), nullptr, kN, y_.data(), kRows, first(lane),
                                  last(lane));
    });
    keep(y_[0]);
  }
  /// The int16 tiles.
  void int16() {
    xq_.size(kN, kCols, relokv_engine::tile_weight_bound(type_));
    lanes().run([&](int lane) {
      xq_.quantize_rows(x_.data(), lane == 0 ? 0 : kN / 2, lane == 0 ? kN / 2 : kN);
    });
    lanes().run([&](int lane) {
      relokv_engine::tile_matmul_rows(w_, xq_, y_.data(), kRows, first(lane), last(lane));
    });
    keep(y_[0]);
  }
  /// The AMX tiles (bf16 hi + lo).
  void amx() {
    xb_.size(kN, kCols);
    lanes().run([&](int lane) {
      xb_.convert_rows(x_.data(), lane == 0 ? 0 : kN / 2, lane == 0 ? kN / 2 : kN);
    });
    lanes().run([&](int lane) {
      relokv_engine::amx_matmul_rows(w_, xb_, y_.data(), kRows, first(lane), last(lane));
    });
    keep(y_[0]);
  }

 private:
  static constexpr int kRows = 1536, kCols = 576, kN = 1024, kMid = kRows / 2;
  static relokv_engine::lanes& lanes() { return relokv_engine::lanes::get(); }
  static int first(int lane) { return lane == 0 ? 0 : kMid; }
  static int last(int lane) { return lane == 0 ? kMid : kRows; }
  relokv_engine::ggml_type type_;
  std::shared_ptr<std::vector<std::uint8_t>> bytes_;
  relokv_engine::qmatrix w_;
  std::vector<float> x_, y_;
  relokv_engine::q16_activations xq_;
  relokv_engine::bf16_activations xb_;
};

/// fp32 panels over the int16 tiles for the gate product.
inline double prefill_tiles_speedup(relokv_engine::ggml_type t, int reps) {
  gate_product g(t, 6);
  return median_ratio([&] { g.panels(); }, [&] { g.int16(); }, reps < 5 ? 5 : reps, 1);
}

/// The int16 tiles over the AMX tiles for the gate product.
inline double prefill_amx_speedup(relokv_engine::ggml_type t, int reps) {
  gate_product g(t, 7);
  return median_ratio([&] { g.int16(); }, [&] { g.amx(); }, reps < 5 ? 5 : reps, 1);
}

/// Prefill attention of 1,024 queries over 1,024 bf16 keys in SmolLM2's shape (9 query heads,
/// 3 KV heads, head_dim 64, blocks of 16, block_relative), on one thread: the fp32 group
/// kernel over the AMX kernels (amx_bf16.hpp).
inline double attention_amx_speedup(int reps) {
  constexpr int kTokens = 1024, kBlock = 16, kHq = 9, kHk = 3, kD = 64;
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = kD;
  const relokv::rope_table rope(cfg, kTokens);
  relokv::host_kv_storage<relokv::bf16> st(relokv::kv_shape{1, kTokens / kBlock, kHk, kBlock, kD});
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  for (std::size_t i = 0; i < st.shape().total_elems(); ++i)
    st.data()[i] = relokv::bf16::from_float(nd(rng));
  std::vector<relokv::block_entry> entries;
  for (int b = 0; b < kTokens / kBlock; ++b) entries.push_back({b, b * kBlock, kBlock});
  std::vector<relokv::pos_t> qpos(kTokens);
  for (int i = 0; i < kTokens; ++i) qpos[static_cast<std::size_t>(i)] = i;
  std::vector<float> q(static_cast<std::size_t>(kTokens) * kHq * kD), out(q.size());
  for (auto& v : q) v = nd(rng);
  const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(entries.size())};
  const std::int32_t qind[2] = {0, kTokens};
  const relokv::paged_kv_view<const relokv::bf16> kv(st.layer(0));
  const auto run = [&](bool amx) {
    relokv::detail::amx::switched_on().store(amx);
    relokv::prefill_attention<relokv::block_relative>(rope, kv, {entries.data(), indptr, 1},
                                                      q.data(), qpos.data(), qind, kHq, 0.125f,
                                                      out.data());
    relokv::detail::amx::switched_on().store(true);
    keep(out[0]);
  };
  return median_ratio([&] { run(false); }, [&] { run(true); }, reps < 3 ? 3 : reps, 1);
}

/// The reference engine: SmolLM2 when scripts/get-model has fetched it (engine_on_real_model
/// 1), the synthetic model otherwise (0). Prefill of a 1,024-token prompt, decode after it,
/// the memory a loaded model keeps resident over its file's size, relokv's overhead against a
/// contiguous KV buffer, and the GEMV kernels' bandwidth.
inline std::vector<std::pair<std::string, double>> engine_figures(int reps) {
  std::vector<std::pair<std::string, double>> out;
  const std::string path = relokv_engine::default_model_path("smollm2");
  const double rss0 = resident_bytes();
  const auto loaded = relokv_engine::load_model(path);
  const auto model = loaded.model;
  constexpr int kContext = 1024;
  std::vector<relokv::token_t> prompt(kContext);
  for (int i = 0; i < kContext; ++i)
    prompt[static_cast<std::size_t>(i)] = (i * 7919) % std::min(4096, model->cfg.vocab);
  out.emplace_back("engine_on_real_model", path.empty() ? 0.0 : 1.0);
  if (!path.empty()) {
    keep(relokv_engine::plain_prefill(
        *model, std::vector<relokv::token_t>(prompt.begin(), prompt.begin() + 8)));
    out.emplace_back(
        "engine_resident_over_file",
        (resident_bytes() - rss0) / static_cast<double>(std::filesystem::file_size(path)));
  }
  const auto layout = relokv::layout_builder(16).prefix(prompt).build();
  // The placement the engine serves with (relokv_rag, relokv_chat): block_relative.
  relokv_engine::llama_engine<relokv::block_relative> rel(model, kContext / 16 + 64);
  // relokv's overhead: the engine as it serves (bf16 KV, 16-token blocks, plan, block table,
  // RoPE at attention) against the same layer loop over one contiguous bf16 buffer with keys
  // rotated as written. Both sides allocated here, outside the timed region.
  relokv_engine::contiguous_prefill<relokv::bf16> contiguous(model, kContext);
  auto via_relokv = [&] {
    keep(rel.prefill(layout, relokv::recompute::none{}));
    rel.end(false);  // nothing is kept: every prefill computes everything
  };
  auto plain = [&] { keep(contiguous(prompt)); };
  const int r = reps < 3 ? reps : 3;
  const double t_prefill = median_ns(
      [&] {
        keep(rel.prefill(layout, relokv::recompute::none{}));
        rel.end(false);
      },
      r, 1);
  out.emplace_back("engine_prefill_tok_s", kContext / (t_prefill * 1e-9));
  // Decode after the 1,024-token prompt: the median over 32 greedy steps.
  auto logits = rel.prefill(layout, relokv::recompute::none{});
  relokv::token_t t = relokv_engine::argmax(logits);
  const double t_decode = median_ns([&] { t = relokv_engine::argmax(rel.decode(t)); }, 32, 1);
  rel.end(false);
  out.emplace_back("engine_decode_tok_s", 1e9 / t_decode);
  // Alternated, so that both sides meet the same neighbours; five pairs at least.
  out.emplace_back("engine_relokv_overhead",
                   median_ratio(via_relokv, plain, reps < 5 ? reps : 5, 1));
  using relokv_engine::ggml_type;
  for (const auto& [name, type] :
       {std::pair{"q4_1", ggml_type::kQ4_1}, std::pair{"q8_0", ggml_type::kQ8_0},
        std::pair{"q4_0", ggml_type::kQ4_0}, std::pair{"q5_0", ggml_type::kQ5_0},
        std::pair{"q4_k", ggml_type::kQ4_K}, std::pair{"q6_k", ggml_type::kQ6_K}})
    out.emplace_back(std::string("gemv_bw_fraction_") + name, gemv_bw_fraction(type, reps));
  out.emplace_back("prefill_tiles_speedup_q4_1", prefill_tiles_speedup(ggml_type::kQ4_1, reps));
  out.emplace_back("prefill_tiles_speedup_q8_0", prefill_tiles_speedup(ggml_type::kQ8_0, reps));
  // AMX (bf16 hi + lo) where the host and build have it: the products and the attention.
  out.emplace_back("prefill_amx_on", relokv_engine::has_amx_tiles() ? 1.0 : 0.0);
  if (relokv_engine::has_amx_tiles()) {
    out.emplace_back("prefill_amx_speedup_q4_1", prefill_amx_speedup(ggml_type::kQ4_1, reps));
    out.emplace_back("prefill_amx_speedup_q8_0", prefill_amx_speedup(ggml_type::kQ8_0, reps));
  }
  if (relokv::detail::amx::enabled())
    out.emplace_back("attention_amx_speedup", attention_amx_speedup(reps));
  tokenizer_figures(reps, out);
  return out;
}

}  // namespace relokv_bench
