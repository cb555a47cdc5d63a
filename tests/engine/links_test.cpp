// Span links in the example engine: an adapter's rows read for ids past the vocabulary, at any
// position (in a span compiled and cached with it, or before the question), the file checked
// against the model, and its identity in the cache keys.
#include "links.hpp"
#include "llama.hpp"

#include <relokv/layout/builder.hpp>
#include <relokv/recompute/none.hpp>
#include <relokv/rope/block_relative.hpp>

#include <unistd.h>
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
  std::uint32_t rows = 4, header = 0;
  std::vector<float> values;  // [rows][dim]; default: token 10 + i's embedding rows
  bool architecture = true;

  std::string write(const std::string& name) const {
    relokv_test::gguf_writer w;
    if (architecture) w.kv_str("general.architecture", "relokv-links");
    w.kv_str("relokv.links.placement", placement);
    w.kv_u32("relokv.links.rows", rows);
    w.kv_u32("relokv.links.header_rows", header);
    w.kv_str("relokv.links.model_arch", arch);
    w.kv_u32("relokv.links.model_dim", static_cast<std::uint32_t>(dim));
    w.kv_u32("relokv.links.model_vocab", static_cast<std::uint32_t>(vocab));
    std::vector<float> v = values;
    if (v.empty()) {
      v.resize(static_cast<std::size_t>(rows * dim));
      for (std::uint32_t r = 0; r < rows; ++r)
        model()->embed(static_cast<token_t>(10 + r), v.data() + r * dim);
    }
    w.tensor_f32("links.rows", {static_cast<std::uint64_t>(dim), rows}, v);
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
}
