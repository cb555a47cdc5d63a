// Span links in the example engine: an adapter's rows read for ids past the vocabulary, at any
// position (in a span compiled and cached with it, or before the question), the file checked
// against the model, and its identity in the cache keys.
#include "links.hpp"
#include "llama_engine.hpp"

#include <relokv/layout/builder.hpp>
#include <relokv/recompute/none.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/gguf_writer.hpp"
#include "support/catch.hpp"
#include "support/test_data.hpp"

using relokv::token_t;
using relokv_engine::llama_engine;
using relokv_engine::llama_model;

namespace {

std::shared_ptr<const llama_model> model() {
  static const auto m = std::make_shared<const llama_model>(llama_model::synthetic());
  return m;
}

struct adapter_file {
  std::string arch = "llama", placement = "before_question";
  std::int64_t dim = 64, vocab = 256;
  std::uint32_t rows = 4, header = 0, trailer = 0;
  std::vector<float> values;  // [rows][dim]; default: token 10 + i's embedding rows
  bool architecture = true;
  std::string depth;                   // empty: not written (embedding)
  std::vector<float> kv;               // deep: [rows][layers][2][kv_dim]
  std::vector<std::uint64_t> kv_dims;  // default {kv_dim, 2, layers, rows}
  // A low-rank correction (written when lowrank_rank > 0): a [layers - first][dim][rank], b
  // [layers - first][rank][2 * kv_dim], as links.hpp reads them; dims default to those.
  std::uint32_t lowrank_rank = 0, lowrank_first = 0;
  std::vector<float> lowrank_a, lowrank_b;
  std::vector<std::uint64_t> lowrank_a_dims, lowrank_b_dims;

  std::string write(const std::string& name) const {
    relokv_test::gguf_writer w;
    if (architecture) w.kv_str("general.architecture", "relokv-links");
    w.kv_str("relokv.links.placement", placement);
    w.kv_u32("relokv.links.rows", rows);
    w.kv_u32("relokv.links.header_rows", header);
    w.kv_u32("relokv.links.trailer_rows", trailer);
    if (!depth.empty()) w.kv_str("relokv.links.depth", depth);
    w.kv_str("relokv.links.model_arch", arch);
    w.kv_u32("relokv.links.model_dim", static_cast<std::uint32_t>(dim));
    w.kv_u32("relokv.links.model_vocab", static_cast<std::uint32_t>(vocab));
    std::vector<float> v = values;
    if (v.empty()) {
      v.resize(static_cast<std::size_t>(rows * dim));
      for (std::uint32_t r = 0; r < rows; ++r)
        model()->embed(static_cast<token_t>(10 + r), v.data() + r * dim);
    }
    if (lowrank_rank > 0) {
      const auto& c = model()->cfg;
      const auto nl = static_cast<std::uint64_t>(c.n_layers) - lowrank_first;
      w.kv_u32("relokv.links.lowrank_rank", lowrank_rank);
      w.kv_u32("relokv.links.lowrank_first_layer", lowrank_first);
      w.tensor_f32(
          "links.lowrank_a",
          lowrank_a_dims.empty()
              ? std::vector<std::uint64_t>{lowrank_rank, static_cast<std::uint64_t>(dim), nl}
              : lowrank_a_dims,
          lowrank_a);
      w.tensor_f32("links.lowrank_b",
                   lowrank_b_dims.empty()
                       ? std::vector<std::uint64_t>{2 * static_cast<std::uint64_t>(c.n_kv_heads *
                                                                                   c.head_dim),
                                                    lowrank_rank, nl}
                       : lowrank_b_dims,
                   lowrank_b);
    }
    if (rows == 0 && lowrank_rank > 0) {
      // A correction alone: no rows tensor.
    } else if (!kv.empty()) {
      const auto& c = model()->cfg;
      auto d = kv_dims;
      if (d.empty())
        d = {static_cast<std::uint64_t>(c.n_kv_heads * c.head_dim), 2,
             static_cast<std::uint64_t>(c.n_layers), rows};
      w.tensor_f32("links.kv", d, kv);
    } else {
      w.tensor_f32("links.rows", {static_cast<std::uint64_t>(dim), rows}, v);
    }
    const auto path = (std::filesystem::temp_directory_path() /
                       ("relokv_links_" + std::to_string(::getpid()) + "_" + name + ".gguf"))
                          .string();
    const auto bytes = w.bytes();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return path;
  }
};

const auto kSys = relokv_test::iota_tokens(1, 21);
const auto kDoc = relokv_test::iota_tokens(40, 37);
const auto kQ = relokv_test::iota_tokens(200, 9);

}  // namespace

TEST_CASE("links: the engine reads an adapter's rows for ids past the vocabulary",
          "[engine][links]") {
  const auto path = adapter_file{}.write("rows");
  const auto a = relokv_engine::load_links(path, *model());
  CHECK(a->n == 4);
  CHECK(a->before_question == 4);
  CHECK(a->id != 0);
  const auto linked = relokv_engine::with_links(model(), a);
  // Row i is token 10 + i's embedding: a prompt with the row's id in place of the token is the
  // same prompt, bit for bit, wherever it stands (prefix, span, question).
  auto with_ids = kSys, with_tokens = kSys;
  for (int i = 0; i < 4; ++i) {
    with_ids.insert(with_ids.begin() + 3 + 4 * i, 256 + i);
    with_tokens.insert(with_tokens.begin() + 3 + 4 * i, 10 + i);
  }
  CHECK(relokv_engine::plain_prefill(*linked, with_ids) ==
        relokv_engine::plain_prefill(*linked, with_tokens));
  llama_engine<relokv::block_relative> eng(linked, 64);
  const auto rows = a->layout_rows(256);
  const auto l =
      relokv::layout_builder(16).links(rows).prefix(kSys).span(kDoc).question(kQ).build();
  auto plain_q = kQ;
  plain_q.insert(plain_q.begin(), {10, 11, 12, 13});
  const auto same = relokv::layout_builder(16).prefix(kSys).span(kDoc).question(plain_q).build();
  const auto got = eng.prefill(l, relokv::recompute::none{});
  eng.end(false);
  CHECK(got == eng.prefill(same, relokv::recompute::none{}));
  eng.end(false);
  // The model without the adapter refuses the ids; with it, ids past its rows.
  CHECK_THROWS_AS(relokv_engine::plain_prefill(*model(), with_ids), std::out_of_range);
  CHECK_THROWS_AS(relokv_engine::plain_prefill(*linked, {1, 2, 260}), std::out_of_range);
  std::filesystem::remove(path);
}

TEST_CASE("links: a span compiled under one adapter is not served under another",
          "[engine][links]") {
  adapter_file f;
  const auto pa = f.write("a");
  f.values.assign(4 * 64, 0.01f);
  const auto pb = f.write("b");
  const auto a = relokv_engine::load_links(pa, *model());
  const auto b = relokv_engine::load_links(pb, *model());
  CHECK(a->id != b->id);
  CHECK(relokv_engine::load_links(pa, *model())->id == a->id);  // the file's bytes
  llama_engine<relokv::block_relative> eng(relokv_engine::with_links(model(), a), 64);
  const auto compile = [&](const relokv_engine::link_adapter& x) {
    (void)eng.prefill(
        relokv::layout_builder(16).links(x.layout_rows(256)).prefix(kSys).span(kDoc).build(),
        relokv::recompute::none{});
    eng.end(true);
  };
  const auto read = [&](const relokv_engine::link_adapter* x) {
    relokv::layout_builder lb(16);
    if (x) lb.links(x->layout_rows(256));
    relokv_engine::prefill_stats st;
    (void)eng.prefill(
        lb.prefix(kSys).span(relokv_test::iota_tokens(100, 16)).span(kDoc).question(kQ).build(),
        relokv::recompute::none{}, &st);
    eng.end(false);
    return st.relocated_hits;
  };
  compile(*a);
  CHECK(read(b.get()) == 0);
  CHECK(read(nullptr) == 0);
  CHECK(read(a.get()) == 3);  // kDoc's three blocks
  std::filesystem::remove(pa);
  std::filesystem::remove(pb);
}

TEST_CASE("links: an adapter for another model, or malformed, is refused by name",
          "[engine][links]") {
  const auto refused = [](adapter_file f, const std::string& what) {
    const auto path = f.write("bad");
    std::string msg;
    try {
      (void)relokv_engine::load_links(path, *model());
    } catch (const std::exception& e) {
      msg = e.what();
    }
    std::filesystem::remove(path);
    INFO(msg);
    CHECK(msg.find(what) != std::string::npos);
  };
  adapter_file f;
  f.dim = 32;
  f.values.assign(4 * 32, 0.0f);
  refused(f, "dim 32");
  f = {};
  f.vocab = 300;
  refused(f, "vocabulary 300");
  f = {};
  f.arch = "qwen2";
  refused(f, "qwen2");
  f = {};
  f.architecture = false;
  refused(f, "not a span-link adapter");
  f = {};
  f.placement = "inside_spans";
  refused(f, "placement");
  f = {};
  f.rows = 0;
  refused(f, "dimension 0");
  f = {};
  f.values.assign(4 * 64, 0.0f);
  f.values[70] = std::numeric_limits<float>::quiet_NaN();
  refused(f, "not finite");
  // Wrappers and depth.
  f = {};
  f.header = 2;  // counts that say wrappers under a placement that says otherwise
  refused(f, "does not match its counts");
  f = {};
  f.header = 3;
  f.trailer = 2;
  f.placement = "wrappers";
  refused(f, "header_rows + trailer_rows");
  f = {};
  f.depth = "deepest";
  refused(f, "depth");
  f = {};
  f.depth = "kv";  // deep without its tensor
  refused(f, "links.kv");
  const auto& c = model()->cfg;
  const auto kv_size = static_cast<std::size_t>(4 * c.n_layers * 2 * c.n_kv_heads * c.head_dim);
  f = {};
  f.depth = "kv";
  f.kv.assign(kv_size, 0.0f);
  f.kv_dims = {static_cast<std::uint64_t>(c.n_kv_heads * c.head_dim), 2,
               static_cast<std::uint64_t>(c.n_layers - 1), 4};
  f.kv.resize(kv_size / static_cast<std::size_t>(c.n_layers) *
              static_cast<std::size_t>(c.n_layers - 1));
  refused(f, "links.kv must be F32");
  f = {};
  f.depth = "kv";
  f.kv.assign(kv_size, 0.0f);
  f.kv[5] = std::numeric_limits<float>::infinity();
  refused(f, "links.kv holds a value that is not finite");
}

namespace {

/// Every position's K (unrotated: at_attention stores keys as computed) and V at every layer,
/// read from the engine's pool after a prefill of `l`: [position][layer][K|V][kv_dim].
std::vector<float> pool_kv(llama_engine<relokv::at_attention, float>& eng,
                           const relokv::request_layout& l) {
  const auto& c = model()->cfg;
  (void)eng.prefill(l, relokv::recompute::none{});
  const auto table = eng.block_table(eng.current());
  std::vector<float> out;
  for (std::size_t p = 0; p < l.tokens.size(); ++p) {
    const auto pos = static_cast<relokv::pos_t>(p);
    const auto e = std::find_if(table.begin(), table.end(), [&](const relokv::block_entry& b) {
      return pos >= b.pos0 && pos < b.pos0 + b.len;
    });
    REQUIRE(e != table.end());
    const auto slot = static_cast<std::size_t>(pos - e->pos0);
    for (int layer = 0; layer < c.n_layers; ++layer) {
      const auto v = eng.kv().layer(layer);
      for (int kind = 0; kind < 2; ++kind)
        for (int h = 0; h < c.n_kv_heads; ++h) {
          const float* src = (kind == 0 ? v.k(e->block, h) : v.v(e->block, h)) +
                             slot * static_cast<std::size_t>(c.head_dim);
          out.insert(out.end(), src, src + c.head_dim);
        }
    }
  }
  eng.end(false);
  return out;
}

/// The same for the rows of a layout at ids past the vocabulary only: what a deep adapter must
/// hold to give the same request the same bits.
std::vector<float> rows_kv(llama_engine<relokv::at_attention, float>& eng,
                           const relokv::request_layout& l) {
  const auto& c = model()->cfg;
  const auto per_pos = static_cast<std::size_t>(c.n_layers * 2 * c.n_kv_heads * c.head_dim);
  const auto all = pool_kv(eng, l);
  std::vector<float> out;
  for (std::size_t p = 0; p < l.tokens.size(); ++p)
    if (l.tokens[p] >= 256)
      out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(p * per_pos),
                 all.begin() + static_cast<std::ptrdiff_t>((p + 1) * per_pos));
  REQUIRE(out.size() == 4 * per_pos);
  return out;
}

}  // namespace

TEST_CASE("links: deep rows (per-layer K/V) give what the rows they hold computed",
          "[engine][links]") {
  // A shallow adapter's rows before the question, computed in one request; a deep adapter that
  // holds exactly the K/V they computed there serves the same request with the same bits: the
  // engine writes the learned K/V where it computed them, and nothing else reads the rows.
  const auto shallow = relokv_engine::load_links(adapter_file{}.write("shallow"), *model());
  auto eng_s = std::make_unique<llama_engine<relokv::at_attention, float>>(
      relokv_engine::with_links(model(), shallow), 64);
  const auto layout = [&](const relokv_engine::link_adapter& a) {
    return relokv::layout_builder(16)
        .links(a.layout_rows(256))
        .prefix(kSys)
        .span(kDoc)
        .question(kQ)
        .build();
  };
  adapter_file d;
  d.depth = "kv";
  d.kv = rows_kv(*eng_s, layout(*shallow));
  const auto want = eng_s->prefill(layout(*shallow), relokv::recompute::none{});
  eng_s->end(false);
  const auto dpath = d.write("deep");
  const auto deep = relokv_engine::load_links(dpath, *model());
  CHECK(deep->deep);
  CHECK(deep->before_question == 4);
  CHECK(deep->id != shallow->id);
  llama_engine<relokv::at_attention, float> eng_d(relokv_engine::with_links(model(), deep), 64);
  CHECK(eng_d.prefill(layout(*deep), relokv::recompute::none{}) == want);
  eng_d.end(false);
  // Other K/V in the rows change the answer (the rows are read).
  d.kv[3] += 1.0f;
  d.kv[static_cast<std::size_t>(model()->cfg.n_kv_heads * model()->cfg.head_dim) + 7] -= 1.0f;
  const auto dpath2 = d.write("deep2");
  llama_engine<relokv::at_attention, float> eng_d2(
      relokv_engine::with_links(model(), relokv_engine::load_links(dpath2, *model())), 64);
  CHECK(eng_d2.prefill(layout(*deep), relokv::recompute::none{}) != want);
  std::filesystem::remove(dpath);
  std::filesystem::remove(dpath2);
  std::filesystem::remove(shallow->path);
}

TEST_CASE("links: per-span wrappers are compiled with the span and relocated with it",
          "[engine][links]") {
  // Header rows 0-1 open every span, trailer row 2 closes it, row 3 opens the question.
  adapter_file f;
  f.header = 2;
  f.trailer = 1;
  f.placement = "wrappers+before_question";
  const auto pw = f.write("wrap");
  const auto a = relokv_engine::load_links(pw, *model());
  CHECK(a->header == 2);
  CHECK(a->trailer == 1);
  CHECK(a->before_question == 1);
  const auto l = relokv::layout_builder(16)
                     .links(a->layout_rows(256))
                     .prefix(kSys)
                     .span(kDoc)
                     .question(kQ)
                     .build();
  // The rows in the layout: the span is header, its tokens, trailer; the question opens with
  // its row. Row r is token 10 + r's embedding, so the same prompt written with those tokens
  // gives the same bits under full recompute.
  auto doc = kDoc;
  doc.insert(doc.begin(), {256, 257});
  doc.push_back(258);
  auto q = kQ;
  q.insert(q.begin(), 259);
  std::vector<token_t> ids = kSys;
  ids.insert(ids.end(), doc.begin(), doc.end());
  ids.insert(ids.end(), q.begin(), q.end());
  CHECK(l.tokens == ids);
  const auto linked = relokv_engine::with_links(model(), a);
  auto tokens = ids;
  for (auto& t : tokens)
    if (t >= 256) t = 10 + (t - 256);
  CHECK(relokv_engine::plain_prefill(*linked, ids) ==
        relokv_engine::plain_prefill(*linked, tokens));
  // Compiled once with its wrappers, the span is reused whole at another position (its header
  // and trailer are not computed again), and only under this adapter.
  llama_engine<relokv::block_relative> eng(linked, 64);
  (void)eng.prefill(
      relokv::layout_builder(16).links(a->layout_rows(256)).prefix(kSys).span(kDoc).build(),
      relokv::recompute::none{});
  eng.end(true);
  const auto read = [&](const relokv_engine::link_adapter* x) {
    relokv::layout_builder lb(16);
    if (x) lb.links(x->layout_rows(256));
    relokv_engine::prefill_stats st;
    (void)eng.prefill(
        lb.prefix(kSys).span(relokv_test::iota_tokens(100, 16)).span(kDoc).question(kQ).build(),
        relokv::recompute::none{}, &st);
    eng.end(false);
    return st;
  };
  CHECK(read(nullptr).relocated_hits == 0);
  const auto hit = read(a.get());
  CHECK(hit.relocated_hits == 3);  // 2 + 37 + 1 rows: kDoc's three blocks, wrappers inside
  f.values.assign(4 * 64, 0.02f);  // another adapter of the same shape
  const auto pb = f.write("wrap_b");
  const auto b = relokv_engine::load_links(pb, *model());
  CHECK(read(b.get()).relocated_hits == 0);
  std::filesystem::remove(pw);
  std::filesystem::remove(pb);
}

TEST_CASE("links: a low-rank correction changes the spans' own K/V from its first layer on",
          "[engine][links]") {
  // A rank-1 correction of the last layer: a span token's K and V there move by t b_k and
  // t b_v (one scalar t = h . a per token); the system prompt's and the question's tokens, and
  // every layer before it, are computed as without the adapter.
  const auto& c = model()->cfg;
  const int kvd = c.n_kv_heads * c.head_dim, L = c.n_layers;
  adapter_file f;
  f.rows = 0;
  f.placement = "none";
  f.lowrank_rank = 1;
  f.lowrank_first = static_cast<std::uint32_t>(L - 1);
  for (int d = 0; d < 64; ++d) f.lowrank_a.push_back(d % 3 == 0 ? 0.5f : -0.25f);
  for (int e = 0; e < 2 * kvd; ++e) f.lowrank_b.push_back(0.1f + 0.01f * static_cast<float>(e % 7));
  const auto path = f.write("lowrank");
  const auto a = relokv_engine::load_links(path, *model());
  CHECK(a->n == 0);
  CHECK(a->lowrank == 1);
  CHECK(a->lowrank_from == L - 1);
  const auto layout = [&](const relokv_engine::link_adapter* x) {
    relokv::layout_builder b(16);
    if (x) b.links(x->layout_rows(256));
    return b.prefix(kSys).span(kDoc).question(kQ).build();
  };
  llama_engine<relokv::at_attention, float> plain(model(), 64);
  llama_engine<relokv::at_attention, float> corrected(relokv_engine::with_links(model(), a), 64);
  const auto want = pool_kv(plain, layout(nullptr));
  const auto got = pool_kv(corrected, layout(a.get()));
  REQUIRE(got.size() == want.size());
  const auto at = [&](const std::vector<float>& x, std::size_t pos, int layer, int kind, int e) {
    return x[((pos * static_cast<std::size_t>(L) + static_cast<std::size_t>(layer)) * 2 +
              static_cast<std::size_t>(kind)) *
                 static_cast<std::size_t>(kvd) +
             static_cast<std::size_t>(e)];
  };
  const std::size_t s0 = kSys.size(), s1 = kSys.size() + kDoc.size();
  for (std::size_t p = 0; p < s1; ++p)
    for (int layer = 0; layer < L; ++layer) {
      const bool moved = p >= s0 && layer == L - 1;
      bool same = true;
      for (int kind = 0; kind < 2; ++kind)
        for (int e = 0; e < kvd; ++e)
          same = same && at(got, p, layer, kind, e) == at(want, p, layer, kind, e);
      INFO("position " << p << " layer " << layer);
      CHECK(same != moved);
      if (!moved) continue;
      // Rank 1: the move is t b, one t for K and V alike.
      const float t = (at(got, p, layer, 0, 0) - at(want, p, layer, 0, 0)) / f.lowrank_b[0];
      for (int kind = 0; kind < 2; ++kind)
        for (int e = 0; e < kvd; e += 5) {
          const float b = f.lowrank_b[static_cast<std::size_t>(kind * kvd + e)];
          CHECK(at(got, p, layer, kind, e) - at(want, p, layer, kind, e) ==
                Approx(t * b).margin(1e-4).epsilon(1e-3));
        }
    }
  // The answer moves; a prompt with no span (full recompute) is the prompt without the adapter.
  CHECK(corrected.prefill(layout(a.get()), relokv::recompute::none{}) !=
        plain.prefill(layout(nullptr), relokv::recompute::none{}));
  corrected.end(false);
  plain.end(false);
  // A request read without the adapter (no link rows, not its keys) is the model's own: the
  // engine that holds the correction computes its span as the plain engine does.
  llama_engine<relokv::at_attention, float> holder(relokv_engine::with_links(model(), a), 64);
  llama_engine<relokv::at_attention, float> plain2(model(), 64);
  CHECK(pool_kv(holder, layout(nullptr)) == pool_kv(plain2, layout(nullptr)));
  std::vector<token_t> all = kSys;
  all.insert(all.end(), kDoc.begin(), kDoc.end());
  CHECK(relokv_engine::plain_prefill(*relokv_engine::with_links(model(), a), all) ==
        relokv_engine::plain_prefill(*model(), all));
  std::filesystem::remove(path);
}

TEST_CASE("links: a malformed low-rank correction is refused by name", "[engine][links]") {
  const auto& c = model()->cfg;
  const auto kvd = static_cast<std::size_t>(c.n_kv_heads * c.head_dim);
  const auto refused = [](adapter_file f, const std::string& what) {
    const auto path = f.write("bad_lowrank");
    std::string msg;
    try {
      (void)relokv_engine::load_links(path, *model());
    } catch (const std::exception& e) {
      msg = e.what();
    }
    std::filesystem::remove(path);
    INFO(msg);
    CHECK(msg.find(what) != std::string::npos);
  };
  adapter_file good;
  good.lowrank_rank = 2;
  good.lowrank_first = static_cast<std::uint32_t>(c.n_layers - 1);
  good.lowrank_a.assign(64 * 2, 0.1f);
  good.lowrank_b.assign(2 * 2 * kvd, 0.1f);
  const auto good_path = good.write("good_lowrank");
  CHECK(relokv_engine::load_links(good_path, *model())->lowrank == 2);
  std::filesystem::remove(good_path);
  auto f = good;
  f.lowrank_first = static_cast<std::uint32_t>(c.n_layers);  // past the last layer
  f.lowrank_a_dims = {2, 64, 1};
  f.lowrank_b_dims = {2 * kvd, 2, 1};
  refused(f, "lowrank_first_layer");
  f = good;
  f.lowrank_b.resize(f.lowrank_b.size() - kvd);  // b of the wrong shape
  f.lowrank_b_dims = {kvd, 2, 1};
  refused(f, "links.lowrank_b must be F32");
  f = good;
  f.lowrank_a[3] = std::numeric_limits<float>::quiet_NaN();
  refused(f, "links.lowrank_a holds a value that is not finite");
  f = good;
  f.rows = 0;  // no rows and a placement that names some
  refused(f, "does not match its counts");
}
