// Tests on a real model, named by the first argument (smollm2: SmolLM2-135M-Instruct, llama;
// qwen2.5-0.5b: Qwen2.5-Coder-0.5B-Instruct, qwen2; gemma3-270m: Gemma 3 270M, gemma3, with
// sliding-window layers and a SentencePiece vocabulary), as scripts/get-model fetches them. Without
// the model the binary says so and exits with 77, which ctest reports as skipped; the
// synthetic-model tests (relokv_engine_test) always run.
#define CATCH_CONFIG_RUNNER
#include <relokv/attention/host_attention.hpp>
#include <relokv/layout/builder.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf.hpp"
#include "isa.hpp"
#include "llama_engine.hpp"
#include "model_path.hpp"
#include "qgemm.hpp"
#include "support/catch.hpp"
#include "support/skip.hpp"
#include "tokenizer.hpp"

namespace {
std::string g_name = "smollm2", g_model;
bool qwen() { return g_name == "qwen2.5-0.5b"; }
bool gemma() { return g_name == "gemma3-270m"; }

struct loaded {
  relokv_engine::gguf_file file;
  std::shared_ptr<const relokv_engine::llama_model> model;
  relokv_engine::tokenizer tok;
};
const loaded& model() {
  static const loaded l = [] {
    auto f = relokv_engine::gguf_file::open(g_model);
    auto m = std::make_shared<const relokv_engine::llama_model>(
        relokv_engine::llama_model::from_gguf(f));
    relokv_engine::tokenizer t(f);
    return loaded{std::move(f), std::move(m), std::move(t)};
  }();
  return l;
}
/// Logits with KV in bf16 against fp32 references, relative to the largest logit.
constexpr double kBf16Tolerance = 2e-2;

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    s = std::max(s, double(std::fabs(b[i])));
  }
  return d / s;
}
}  // namespace

TEST_CASE("real model: shapes and tokenizer", "[model]") {
  const auto& m = model();
  const auto& c = m.model->cfg;
  if (gemma()) {
    // Against the file's own metadata, and llama.cpp's defaults where it is silent (the
    // local base, the pattern): 18 layers, a window of 512 on five layers in six, bases
    // 10,000 and 1,000,000, head_dim 256 over one KV head, 262,144 SentencePiece tokens.
    CHECK(c.arch == "gemma3");
    CHECK(c.n_layers == 18);
    CHECK(c.dim == 640);
    CHECK(c.n_heads == 4);
    CHECK(c.n_kv_heads == 1);
    CHECK(c.head_dim == 256);
    CHECK(c.vocab == 262144);
    CHECK(c.sliding_window == 512);
    CHECK(c.swa_pattern == 6);
    CHECK(c.rope.layout == relokv::rope_layout::kNeoX);
    CHECK(c.rope.theta == 1e6);
    CHECK(c.rope_local.theta == 1e4);
    CHECK(c.embed_scale == Approx(std::sqrt(640.0f)));
    int windowed = 0;
    for (int l = 0; l < c.n_layers; ++l) windowed += c.windowed(l) ? 1 : 0;
    CHECK(windowed == 15);
    CHECK_FALSE(c.windowed(5));
    CHECK_FALSE(c.windowed(17));
    CHECK(m.model->layers[0].q_norm.size() == 256);
    CHECK(m.model->layers[0].post_ffn_norm.size() == 640);
    CHECK(m.model->output.empty());  // tied
    CHECK(m.tok.id("<bos>") == 2);
    CHECK(m.tok.format() == relokv_engine::chat_format::kPlain);  // no chat template: base
  } else if (qwen()) {
    CHECK(c.arch == "qwen2");
    CHECK(c.n_layers == 24);
    CHECK(c.vocab == 151936);
    CHECK(c.n_kv_heads == 2);
    CHECK(c.rope.layout == relokv::rope_layout::kNeoX);
    CHECK(c.rope.theta == 1e6);
    CHECK(!m.model->output.empty());  // untied
    CHECK(m.model->layers[0].bq.size() == 896);
  } else {
    CHECK(c.arch == "llama");
    CHECK(c.n_layers == 30);
    CHECK(c.vocab == 49152);
    CHECK(m.tok.id("<|im_start|>") == 1);
  }
  for (const std::string s : {"Hello world, it's 2026!", "  spaces\tand\nlines  ", "café ü 東京"})
    CHECK(m.tok.decode(m.tok.encode(s)) == s);
  const auto ids = m.tok.encode(m.tok.chat("sys", "hi"));
  CHECK(ids.front() == m.tok.id(gemma() ? "<bos>" : "<|im_start|>"));  // one token
  CHECK(m.tok.end_of_turn() == m.tok.id(gemma() ? "\n" : "<|im_end|>"));
  CHECK(m.tok.end_of_turn() >= 0);
}

// Ids the reference implementation (Hugging Face tokenizers, tests/reference/tokenizer_ref.py,
// for BPE; llama.cpp's SentencePiece, tests/reference/spm_tokenizer_ref.cpp, for Gemma 3)
// produced for tests/engine/data/tokenizer_strings.txt: non-ASCII punctuation, paragraph
// breaks, tabs, digits, contractions, CJK, emoji, specials.
TEST_CASE("real model: token ids equal the reference tokenizer's", "[model]") {
  const auto& m = model();
  std::ifstream strings(RELOKV_SOURCE_DIR "/tests/engine/data/tokenizer_strings.txt");
  std::ifstream ref(RELOKV_SOURCE_DIR "/tests/engine/data/tokenizer_ref_ids.tsv");
  REQUIRE(strings);
  REQUIRE(ref);
  std::vector<std::string> texts;
  for (std::string line; std::getline(strings, line);)
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line).get<std::string>());
  std::size_t i = 0, checked = 0;
  for (std::string line; std::getline(ref, line);) {
    const auto tab = line.find('\t');
    REQUIRE(tab != std::string::npos);
    const bool mine = line.substr(0, tab) == g_name;
    if (!mine) {
      ++i;
      continue;
    }
    const std::string& text = texts.at(i++ % texts.size());
    std::vector<relokv::token_t> want;
    std::istringstream is(line.substr(tab + 1));
    for (relokv::token_t t; is >> t;) want.push_back(t);
    INFO(nlohmann::json(text).dump());
    CHECK(m.tok.encode(text) == want);
    ++checked;
  }
  CHECK(checked == texts.size());
}

// Hidden from the default run: ctest runs it as its own entry (relokv_numpy_reference_test),
// which main() reports as skipped (77) when python3 with numpy is missing.
TEST_CASE("real model: logits agree with the numpy reference", "[.][numpy]") {
  const auto& m = model();
  // Two short prompts (at most 8 rows: fp32 activations on the blocks) and one of over 64
  // tokens: prefill's tiles (AMX where the host has it, int16 otherwise), its norms and SiLU
  // split over the lanes, and the grouped attention kernel (AMX under bf16 KV).
  const std::string longer =
      "Paris is the capital and largest city of France. With an estimated population of over "
      "two million residents, it is the centre of the Ile-de-France region, which has more "
      "than twelve million people. Since the seventeenth century Paris has been a major "
      "centre of finance, diplomacy, commerce, fashion, science and the arts. The city of";
  std::vector<std::string> prompts{"The capital of France is", "1, 2, 3, 4,", longer};
  // Gemma 3: a prompt of over 512 tokens, so that the windowed layers cut it.
  if (gemma())
    prompts.push_back(longer + " " + longer + " " + longer + " " + longer + " " + longer + " " +
                      longer + " " + longer + " " + longer + ".");
  for (const std::string& prompt : prompts) {
    const auto ids = m.tok.encode(prompt);
    std::string cmd =
        "python3 " RELOKV_SOURCE_DIR "/tests/reference/llama_ref.py '" + g_model + "'";
    for (auto t : ids) {
      cmd += ' ';
      cmd += std::to_string(t);
    }
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    std::vector<float> want;
    float v;
    while (std::fscanf(p, "%f", &v) == 1) want.push_back(v);
    REQUIRE(pclose(p) == 0);
    REQUIRE(want.size() == static_cast<std::size_t>(m.model->cfg.vocab));
    relokv_engine::llama_engine<relokv::block_relative, float> eng(m.model, 64);
    const auto got =
        eng.prefill(relokv::layout_builder(16).prefix(ids).build(), relokv::recompute::none{});
    INFO(prompt << " (" << ids.size() << " tokens): fp32 KV " << max_rel(got, want));
    CHECK(max_rel(got, want) < 1e-3);  // fp32 KV; summation order differs
    CHECK(relokv_engine::argmax(got) == relokv_engine::argmax(want));
    // KV in bf16, the engine's default: K and V rounded to 8 bits of mantissa.
    relokv_engine::llama_engine<relokv::block_relative> eng16(m.model, 64);
    const auto got16 =
        eng16.prefill(relokv::layout_builder(16).prefix(ids).build(), relokv::recompute::none{});
    INFO("bf16 KV " << max_rel(got16, want));
    CHECK(max_rel(got16, want) < kBf16Tolerance);
    CHECK(relokv_engine::argmax(got16) == relokv_engine::argmax(want));
  }
}

TEST_CASE("real model: a coherent greedy answer", "[model]") {
  const auto& m = model();
  relokv_engine::llama_engine<relokv::at_attention, float> eng(m.model, 256);
  const auto prompt = m.tok.encode(
      m.tok.chat(qwen()    ? "You are a helpful assistant."
                 : gemma() ? ""
                           : "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                 "What is the capital of France?"));
  const auto out = eng.generate(
      eng.prefill(relokv::layout_builder(16).prefix(prompt).build(), relokv::recompute::none{}), 24,
      m.tok.end_of_turn());
  const std::string answer = m.tok.decode(out);
  INFO(answer);
  CHECK(answer.find("Paris") != std::string::npos);
}

TEST_CASE("real model: full recompute after reuse equals no reuse; placements agree", "[model]") {
  const auto& m = model();
  const auto sys = m.tok.encode("<|im_start|>system\nAnswer from the documents.<|im_end|>\n");
  const auto a = m.tok.encode("Paris is the capital and largest city of France.");
  const auto b = m.tok.encode("Berlin is the capital of Germany and its largest city.");
  const auto q = m.tok.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n");
  const auto l1 = relokv::layout_builder(16).prefix(sys).span(a).span(b).question(q).build();
  const auto l2 = relokv::layout_builder(16).prefix(sys).span(b).span(a).question(q).build();
  const auto want = relokv_engine::plain_prefill(*m.model, l2.tokens);
  relokv_engine::llama_engine<relokv::block_relative, float> eng(m.model, 256);
  (void)eng.prefill(l1, relokv::recompute::none{});
  eng.end();
  relokv_engine::prefill_stats st;
  const auto full = eng.prefill(l2, relokv::recompute::full{}, &st);
  eng.end(false);
  CHECK(st.relocated_hits > 0);
  CHECK(max_rel(full, want) < 1e-3);
  relokv_engine::llama_engine<relokv::pre_rotated, float> pre(m.model, 256);
  relokv_engine::llama_engine<relokv::at_attention, float> at(m.model, 256);
  CHECK(max_rel(pre.prefill(l2, relokv::recompute::none{}), want) < 1e-3);
  CHECK(max_rel(at.prefill(l2, relokv::recompute::none{}), want) < 1e-3);
  // The same under bf16 KV (the default): full recompute after reuse is bit for bit a prefill
  // without reuse.
  relokv_engine::llama_engine<relokv::block_relative> e16(m.model, 256), fresh16(m.model, 256);
  (void)e16.prefill(l1, relokv::recompute::none{});
  e16.end();
  const auto full16 = e16.prefill(l2, relokv::recompute::full{});
  e16.end(false);
  CHECK(full16 == fresh16.prefill(l2, relokv::recompute::none{}));
  CHECK(max_rel(full16, want) < kBf16Tolerance);
}

TEST_CASE("real model: spans relocated across a sliding window", "[model]") {
  // Three long passages (about 250 tokens each) read in another order: on Gemma 3 the windowed
  // layers (512 tokens) cut the request, its spans and the relocated ones; on the others the
  // same request exercises long relocations. Full recompute after reuse is a prefill without
  // reuse, every placement agrees with the fp32 plain prefill, and exact reuse of the whole
  // request is bit for bit.
  const auto& m = model();
  std::vector<std::vector<relokv::token_t>> docs;
  for (const char* topic : {"the river", "the old bridge", "the lighthouse"}) {
    std::string text;
    for (int i = 0; i < 12; ++i)
      text += "Record " + std::to_string(i) + " about " + topic +
              " says the keeper counted boats, wrote the weather down and mended the nets. ";
    docs.push_back(m.tok.encode(text));
  }
  const auto sys = m.tok.encode(m.tok.open("Answer from the documents."));
  const auto q = m.tok.encode("Question: who mended the nets?" + m.tok.close());
  const auto build = [&](std::initializer_list<int> order) {
    relokv::layout_builder b(16);
    b.prefix(sys);
    for (const int d : order) b.span(docs[static_cast<std::size_t>(d)]);
    return b.question(q).build();
  };
  const auto l1 = build({0, 1, 2}), l2 = build({2, 0, 1});
  REQUIRE(l2.tokens.size() > 700);
  const auto want = relokv_engine::plain_prefill(*m.model, l2.tokens);
  relokv_engine::llama_engine<relokv::block_relative, float> eng(m.model, 256);
  (void)eng.prefill(l1, relokv::recompute::none{});
  eng.end();
  relokv_engine::prefill_stats st;
  const auto full = eng.prefill(l2, relokv::recompute::full{}, &st);
  eng.end(false);
  CHECK(st.relocated_hits > 0);
  CHECK(max_rel(full, want) < 1e-3);
  relokv_engine::llama_engine<relokv::pre_rotated, float> pre(m.model, 256);
  relokv_engine::llama_engine<relokv::at_attention, float> at(m.model, 256);
  CHECK(max_rel(pre.prefill(l2, relokv::recompute::none{}), want) < 1e-3);
  CHECK(max_rel(at.prefill(l2, relokv::recompute::none{}), want) < 1e-3);
  pre.end(false);
  at.end(false);
  // pre_rotated relocation rotates each layer by its own base: reused spans under none{}
  // give what at_attention's give (the same K/V, rotated at attention instead).
  (void)pre.prefill(l1, relokv::recompute::none{});
  pre.end();
  (void)at.prefill(l1, relokv::recompute::none{});
  at.end();
  relokv_engine::prefill_stats sp, sa;
  const auto reused_pre = pre.prefill(l2, relokv::recompute::none{}, &sp);
  const auto reused_at = at.prefill(l2, relokv::recompute::none{}, &sa);
  CHECK(sp.relocated_hits > 0);
  CHECK(sa.relocated_hits == sp.relocated_hits);
  CHECK(max_rel(reused_pre, reused_at) < 1e-3);
  pre.end(false);
  at.end(false);
  // The whole request again: exact hits, bit for bit.
  relokv_engine::llama_engine<relokv::block_relative> e16(m.model, 256), fresh16(m.model, 256);
  const auto first16 = fresh16.prefill(l2, relokv::recompute::none{});
  fresh16.end(false);
  (void)e16.prefill(l2, relokv::recompute::none{});
  e16.end();
  relokv_engine::prefill_stats se;
  CHECK(e16.prefill(l2, relokv::recompute::none{}, &se) == first16);
  CHECK(se.exact_hits > 0);
}

TEST_CASE("real model: CacheBlend's candidates confined to the windows' seam", "[model]") {
  // Gemma 3 only (its layer 0 is windowed; the others have no window): two relocated spans of
  // about 700 tokens. Beyond offset W - 1 a token's K/V at CacheBlend's check layer (1) match
  // a fresh computation up to rounding, so confining the candidates to the first W - 1
  // tokens of each span must choose the same tokens, for less work. (The logits are close,
  // not equal: unconfined, the candidates beyond the seams write their fresh layer-0 and
  // layer-1 K/V, which differ from the cached ones in their last bits.)
  const auto& m = model();
  const auto& c = m.model->cfg;
  if (!c.windowed(0)) {
    SUCCEED("no windowed layer below the check layer");
    return;
  }
  std::vector<std::vector<relokv::token_t>> docs;
  for (const char* topic : {"the harbour", "the mill"}) {
    std::string text;
    for (int i = 0; i < 32; ++i)
      text += "Entry " + std::to_string(i) + " on " + topic +
              ": the tide turned, two boats came in and the catch was weighed. ";
    docs.push_back(m.tok.encode(text));
  }
  REQUIRE(docs[0].size() > 600);
  const auto sys = m.tok.encode(m.tok.open("Answer from the records."));
  const auto q = m.tok.encode("Question: how many boats came in?" + m.tok.close());
  const auto build = [&](int a, int b) {
    return relokv::layout_builder(16)
        .prefix(sys)
        .span(docs[static_cast<std::size_t>(a)])
        .span(docs[static_cast<std::size_t>(b)])
        .question(q)
        .build();
  };
  relokv_engine::llama_engine<relokv::block_relative> eng(m.model, 512);
  (void)eng.prefill(build(0, 1), relokv::recompute::none{});
  eng.end();
  const auto l2 = build(1, 0);
  const relokv::recompute::deviation_topk blend(0.15f);
  relokv_engine::prefill_stats all, seam;
  const auto want = eng.prefill(l2, blend, &all);
  eng.end(false);
  const auto got = eng.prefill(l2, blend.with_seam(c.sliding_window - 1), &seam);
  eng.end(false);
  INFO("token-layers: every candidate " << all.token_layers << ", the seams' "
                                        << seam.token_layers);
  CHECK(all.relocated_hits > 0);
  CHECK(seam.check_kept == all.check_kept);  // the same tokens chosen at the check layer
  CHECK(max_rel(got, want) < 1e-2);
  CHECK(relokv_engine::argmax(got) == relokv_engine::argmax(want));
  CHECK(seam.token_layers < all.token_layers);
}

TEST_CASE("real model: a sequence's bits do not depend on its batch", "[model][exact]") {
  // A server's step decodes many sequences in one forward and prefills in chunks: every
  // sequence must get the logits it gets alone, bit for bit (greedy answers that do not
  // depend on the load). Twelve sequences (more than one integer-kernel group of 8 rows), of
  // different prompts and lengths, prefilled in chunks of 7 rows interleaved with each other's
  // decode steps, against each decoded alone with its prompt at once.
  const auto& m = model();
  using engine_t = relokv_engine::llama_engine<relokv::block_relative>;
  constexpr int kSeqs = 12, kSteps = 5;
  std::vector<relokv::request_layout> layouts;
  const char* topics[] = {"rivers", "bridges", "the moon", "bread", "violins", "glaciers"};
  for (int i = 0; i < kSeqs; ++i) {
    std::string q = "Tell me one fact about " + std::string(topics[i % 6]);
    for (int j = 0; j < i; ++j) q += " and why";
    q += "?";
    layouts.push_back(
        relokv::layout_builder(16).prefix(m.tok.encode(m.tok.chat("Be brief.", q))).build());
  }
  std::vector<std::vector<std::vector<float>>> alone(kSeqs);
  {
    engine_t eng(m.model, 512);
    for (int i = 0; i < kSeqs; ++i) {
      auto& steps = alone[static_cast<std::size_t>(i)];
      steps.push_back(eng.prefill(layouts[static_cast<std::size_t>(i)], relokv::recompute::full{}));
      for (int t = 0; t < kSteps; ++t)
        steps.push_back(eng.decode(relokv_engine::argmax(steps.back())));
      eng.end(false);
    }
  }
  engine_t eng(m.model, 512);
  std::vector<engine_t::seq_id> ids;
  std::vector<std::vector<std::vector<float>>> batched(kSeqs);
  for (const auto& l : layouts) ids.push_back(eng.open(l, relokv::recompute::full{}));
  // Round robin: one chunk of one prompt, then a decode step of every prefilled sequence.
  std::vector<engine_t::seq_id> decoding;
  for (std::size_t next = 0; decoding.size() < ids.size() || !decoding.empty();) {
    if (next < ids.size()) {
      auto logits = eng.prefill_step(ids[next], 7);
      if (!logits.empty()) {
        batched[next].push_back(std::move(logits));
        decoding.push_back(ids[next]);
        ++next;
      }
    } else if (decoding.empty()) {
      break;
    }
    std::vector<engine_t::seq_id> step;
    for (const auto s : decoding) {
      auto& steps = batched[static_cast<std::size_t>(s)];
      if (static_cast<int>(steps.size()) > kSteps) continue;
      REQUIRE(eng.append(s, relokv_engine::argmax(steps.back())));
      step.push_back(s);
    }
    if (step.empty() && next == ids.size()) break;
    const auto out = eng.decode_step(step);
    for (std::size_t j = 0; j < step.size(); ++j)
      batched[static_cast<std::size_t>(step[j])].push_back(out[j]);
  }
  CHECK(eng.live() == kSeqs);
  for (const auto s : ids) eng.close(s, false);
  CHECK(eng.live() == 0);
  for (int i = 0; i < kSeqs; ++i) {
    INFO("sequence " << i);
    REQUIRE(batched[static_cast<std::size_t>(i)].size() ==
            alone[static_cast<std::size_t>(i)].size());
    for (std::size_t t = 0; t < alone[static_cast<std::size_t>(i)].size(); ++t) {
      INFO("step " << t);
      CHECK(batched[static_cast<std::size_t>(i)][t] == alone[static_cast<std::size_t>(i)][t]);
    }
  }
}

TEST_CASE("real model: exact hits change nothing, bit for bit, whatever the batch shapes",
          "[model][exact]") {
  // An answer served from exact (prefix) hits must equal a plain prefill of the same layout:
  // logits and tokens, bit for bit, at the first token and every decode step after it. The
  // cached blocks are computed by other requests, in batches of other sizes (one block of the
  // system prompt behind a passage, or the prompt's first k blocks behind other text), on each
  // product path this host can take (AMX tiles or int16 tiles for prefill; int8 or dequantized
  // products for decode).
  const auto& m = model();
  const auto sys = m.tok.encode(
      "<|im_start|>system\nYou answer questions from the documents you are given, briefly and "
      "exactly.<|im_end|>\n");
  const auto body = m.tok.encode(
      "<|im_start|>user\nDocument: The Eiffel Tower is a wrought-iron lattice tower on the Champ "
      "de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose company "
      "designed and built the tower from 1887 to 1889. Document: Berlin is the capital of "
      "Germany; the Brandenburg Gate stands in its centre. Question: who designed the company "
      "behind the Eiffel Tower, and in which city does it stand?<|im_end|>\n<|im_start|>"
      "assistant\n");
  std::vector<relokv::token_t> prompt = sys;
  prompt.insert(prompt.end(), body.begin(), body.end());
  // A few tokens past the last full block (see the last warmer below).
  while (prompt.size() % 16 == 0 || prompt.size() % 16 > 5) prompt.pop_back();
  REQUIRE(prompt.size() > 96);
  const auto flat = relokv::layout_builder(16).prefix(prompt).build();
  const auto other = m.tok.encode("An unrelated passage about rivers, bridges and their builders.");
  using engine_t = relokv_engine::llama_engine<relokv::block_relative>;
  const auto answer = [&](engine_t& eng, std::int32_t* exact_hits) {
    relokv_engine::prefill_stats st;
    std::vector<std::vector<float>> steps{eng.prefill(flat, relokv::recompute::none{}, &st)};
    for (int i = 0; i < 8; ++i) steps.push_back(eng.decode(relokv_engine::argmax(steps.back())));
    eng.end(false);
    if (exact_hits != nullptr) *exact_hits = st.exact_hits;
    return steps;
  };
  // The AMX switches matter only where the tiles run (an AMX host under no lower cap); the
  // integer kernels' switch everywhere.
  relokv_engine::use_amx_tiles(true);
  const bool amx_here = relokv_engine::has_amx_tiles();
  const std::vector<bool> amx_options =
      amx_here ? std::vector<bool>{true, false} : std::vector<bool>{false};
  INFO("ISA cap " << relokv_engine::isa_name(relokv_engine::isa_cap()) << ", tiles "
                  << relokv_engine::tile_kernel_isa() << ", integer kernels "
                  << relokv_engine::integer_kernel_isa());
  // The prompt's last full block, and a few tokens after it: a remainder of at most 8 rows,
  // which once took another product path than the rows of a longer batch.
  const std::size_t full_blocks = prompt.size() / 16;
  for (const bool attention_amx : amx_options)
    for (const bool amx : amx_options)
      for (const bool integer : {true, false}) {
        relokv::detail::amx::switched_on().store(attention_amx);
        relokv_engine::use_amx_tiles(amx);
        relokv_engine::use_integer_kernels(integer);
        engine_t fresh(m.model, 256);
        const auto want = answer(fresh, nullptr);
        // What caches the prompt's first blocks: its system prompt behind a passage (a span), or
        // its first k blocks as a flat prefix followed by other text (the last: every full
        // block, leaving the prompt's last few tokens to compute).
        std::vector<relokv::request_layout> warmers = {
            relokv::layout_builder(16).prefix(sys).span(other).build()};
        for (std::size_t k : {std::size_t{1}, std::size_t{3}, full_blocks - 1, full_blocks}) {
          std::vector<relokv::token_t> t(prompt.begin(), prompt.begin() + 16 * k);
          t.insert(t.end(), other.begin(), other.end());
          warmers.push_back(relokv::layout_builder(16).prefix(t).build());
        }
        for (std::size_t wi = 0; wi < warmers.size(); ++wi) {
          engine_t eng(m.model, 256);
          (void)eng.prefill(warmers[wi], relokv::recompute::none{});
          eng.end(true);
          std::int32_t hits = 0;
          const auto got = answer(eng, &hits);
          INFO("attention amx " << attention_amx << ", amx " << amx << ", integer kernels "
                                << integer << ", warmer " << wi << ": " << hits << " exact hits");
          CHECK(hits >= 1);
          REQUIRE(got.size() == want.size());
          for (std::size_t s = 0; s < want.size(); ++s) {
            INFO("step " << s);
            // Bit for bit: no logit differs in its bits (a count, not the vectors printed).
            std::size_t differing = 0;
            double largest = 0;
            for (std::size_t i = 0; i < want[s].size(); ++i) {
              differing += std::memcmp(&got[s][i], &want[s][i], sizeof(float)) != 0;
              largest = std::max(largest, double(std::fabs(got[s][i] - want[s][i])));
            }
            INFO("largest difference " << largest);
            CHECK(differing == 0);
            CHECK(relokv_engine::argmax(got[s]) == relokv_engine::argmax(want[s]));
          }
        }
      }
  relokv::detail::amx::switched_on().store(relokv_engine::isa_cap() >=
                                           relokv_engine::isa_level::kAmx);
  relokv_engine::use_amx_tiles(true);
  relokv_engine::use_integer_kernels(true);
}

/// Whether this host (and this build, -march=native) runs the level RELOKV_ISA names: a level
/// above the host's is not a cap but a request the host cannot honour.
std::string isa_missing() {
  const char* v = std::getenv("RELOKV_ISA");
  if (v == nullptr || *v == '\0') return {};
  relokv_engine::isa_level want{};
  try {
    want = relokv_engine::parse_isa_level(v);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  std::ifstream in("/proc/cpuinfo");
  const std::string cpu((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto has = [&](const char* flag) {
    return cpu.find(std::string(" ") + flag) != std::string::npos;
  };
  // The engine's own build decides (this file is compiled without -march=native: asking its
  // macros skipped the AVX-512 level on hosts whose engine runs AVX-512 kernels).
  const bool built512 = relokv_engine::engine_built_with_avx512();
  if (want >= relokv_engine::isa_level::kAvx2 && !has("avx2")) return "this host has no AVX2";
  if (want >= relokv_engine::isa_level::kAvx512 && !(has("avx512f") && built512))
    return "this host has no AVX-512 (or the build targets one without it)";
  if (want >= relokv_engine::isa_level::kAmx && !has("amx_tile")) return "this host has no AMX";
  return {};
}

int main(int argc, char** argv) {
  // The first argument names the model when it is not a Catch option or tag.
  if (argc > 1 && argv[1][0] != '-' && argv[1][0] != '[') {
    g_name = argv[1];
    argv[1] = argv[0];
    ++argv;
    --argc;
  }
  g_model = relokv_engine::default_model_path(g_name);
  if (g_model.empty()) {
    const std::string why = "no " + g_name + " model (run scripts/get-model " + g_name +
                            "): the real-model tests did not run";
    return relokv_test::skip(why.c_str());
  }
  if (const std::string why = isa_missing(); !why.empty()) {
    // Not a missing install: the host's CPU. Reported skipped (77) with the reason, CI or not.
    std::printf("SKIPPED: RELOKV_ISA=%s: %s; this level's exactness runs on hosts that have it\n",
                std::getenv("RELOKV_ISA"), why.c_str());
    return 77;
  }
  std::printf("model: %s\n", g_model.c_str());
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).find("[numpy]") != std::string::npos &&
        std::system("python3 -c 'import numpy' 2>/dev/null") != 0)
      return relokv_test::skip(
          "python3 with numpy is not available: the numpy reference forward pass did not run");
  return Catch::Session().run(argc, argv);
}
