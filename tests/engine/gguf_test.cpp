#include "gguf.hpp"

#include <string>

#include "llama_engine.hpp"

#include <relokv/dtype.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/gguf_writer.hpp"
#include "support/catch.hpp"

using relokv_engine::gguf_error;
using relokv_engine::gguf_file;

namespace {
void put_half(std::vector<std::uint8_t>& b, float x) {
  const auto h = relokv::fp16::from_float(x).bits;
  b.push_back(static_cast<std::uint8_t>(h & 0xFF));
  b.push_back(static_cast<std::uint8_t>(h >> 8));
}
std::uint64_t error_offset(const std::vector<std::uint8_t>& bytes) {
  try {
    (void)gguf_file::from_memory(bytes, "test.gguf");
  } catch (const gguf_error& e) {
    return e.offset();
  }
  FAIL("no error");
  return 0;
}
relokv_test::gguf_writer small() {
  relokv_test::gguf_writer w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", 2);
  w.kv_f32("llama.rope.freq_base", 10000.0f);
  w.kv_strs("tokenizer.ggml.tokens", {"a", "b", "ab"});
  w.tensor_f32("norm.weight", {4}, {1, 2, 3, 4});
  return w;
}
}  // namespace

TEST_CASE("gguf: metadata and tensor infos", "[engine]") {
  for (std::uint32_t version : {2u, 3u}) {
    relokv_test::gguf_writer w(version, 64);
    w.kv_u32("general.alignment", 64);
    w.kv_str("general.architecture", "llama");
    w.kv_f32("llama.rope.freq_base", 100000.0f);
    w.kv_i32s("tokenizer.ggml.token_type", {1, 3, 1});
    w.tensor_f32("a", {2, 3}, {1, 2, 3, 4, 5, 6});
    w.tensor_f32("b", {4}, {7, 8, 9, 10});
    const auto f = gguf_file::from_memory(w.bytes());
    CHECK(f.version() == version);
    CHECK(f.alignment() == 64);
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_float("llama.rope.freq_base") == 100000.0);
    CHECK(f.get_ints("tokenizer.ggml.token_type") == std::vector<std::int64_t>{1, 3, 1});
    CHECK(f.get_int("missing", 7) == 7);
    REQUIRE(f.tensors().size() == 2);
    const auto& a = f.tensor("a");
    CHECK(a.dims == std::vector<std::uint64_t>{2, 3});
    CHECK(a.rows() == 3);
    CHECK(f.dequantize(a) == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(f.dequantize(f.tensor("b")) == std::vector<float>{7, 8, 9, 10});
    CHECK(f.tensor("b").offset % 64 == 0);  // aligned within the data section
    CHECK(f.tensor("b").data - a.data == static_cast<std::ptrdiff_t>(f.tensor("b").offset));
    CHECK_THROWS_AS(f.tensor("c"), gguf_error);
  }
}

TEST_CASE("gguf: every supported type dequantizes to its closed form", "[engine]") {
  relokv_test::gguf_writer w;
  std::vector<float> want_q40, want_q41, want_q80, want_f16, want_bf16, want_q6k, want_q50,
      want_q4k;
  std::vector<std::uint8_t> q40, q41, q80, f16, bf16, q6k, q50, q4k;
  // Q4_0: d = 0.5, nibble j -> (j - 8) * d; element j from the low nibble of byte j (value
  // j % 16), element j + 16 from its high nibble (value 15 - j).
  put_half(q40, 0.5f);
  for (int j = 0; j < 16; ++j)
    q40.push_back(static_cast<std::uint8_t>((j & 0xF) | ((15 - j) << 4)));
  want_q40.resize(32);
  for (int j = 0; j < 16; ++j) {
    want_q40[static_cast<std::size_t>(j)] = 0.5f * static_cast<float>(j - 8);
    want_q40[static_cast<std::size_t>(j + 16)] = 0.5f * static_cast<float>(15 - j - 8);
  }
  // Q4_1: d = 0.25, m = -1.
  put_half(q41, 0.25f);
  put_half(q41, -1.0f);
  for (int j = 0; j < 16; ++j)
    q41.push_back(static_cast<std::uint8_t>((j & 0xF) | ((15 - j) << 4)));
  want_q41.resize(32);
  for (int j = 0; j < 16; ++j) {
    want_q41[static_cast<std::size_t>(j)] = 0.25f * static_cast<float>(j) - 1.0f;
    want_q41[static_cast<std::size_t>(j + 16)] = 0.25f * static_cast<float>(15 - j) - 1.0f;
  }
  // Q8_0: d = 2, q = j - 16.
  put_half(q80, 2.0f);
  for (int j = 0; j < 32; ++j) {
    q80.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(j - 16)));
    want_q80.push_back(2.0f * static_cast<float>(j - 16));
  }
  for (float x : {1.5f, -0.25f, 65504.0f, 0.0f}) {
    put_half(f16, x);
    want_f16.push_back(x);
    const auto b = relokv::bf16::from_float(x).bits;
    bf16.push_back(static_cast<std::uint8_t>(b & 0xFF));
    bf16.push_back(static_cast<std::uint8_t>(b >> 8));
    want_bf16.push_back(relokv::bf16{b}.to_float());
  }
  // Q6_K: all 6-bit values q = 33 (-> +1), scales s = i + 1 for sub-block i, d = 0.5:
  // element e in sub-block e / 16 is 0.5 * (e / 16 + 1).
  q6k.assign(128, 0x11);            // low nibbles 1 | 1
  q6k.insert(q6k.end(), 64, 0xAA);  // high bits 2 (binary 10) everywhere: q = 1 | 2 << 4 = 33
  for (int i = 0; i < 16; ++i) q6k.push_back(static_cast<std::uint8_t>(i + 1));
  put_half(q6k, 0.5f);
  for (int e = 0; e < 256; ++e) want_q6k.push_back(0.5f * static_cast<float>(e / 16 + 1));
  // Q5_0: d = 0.5, nibbles as Q4_0, high bit of element e = bit e of qh = e odd; value
  // (5-bit - 16) * d.
  put_half(q50, 0.5f);
  for (int b = 0; b < 4; ++b) q50.push_back(0xAA);
  for (int j = 0; j < 16; ++j)
    q50.push_back(static_cast<std::uint8_t>((j & 0xF) | ((15 - j) << 4)));
  want_q50.resize(32);
  for (int j = 0; j < 16; ++j) {
    want_q50[static_cast<std::size_t>(j)] = 0.5f * static_cast<float>((j | (j % 2) << 4) - 16);
    const int e = j + 16;
    want_q50[static_cast<std::size_t>(e)] =
        0.5f * static_cast<float>(((15 - j) | (e % 2) << 4) - 16);
  }
  // Q4_K: d = 1, dmin = 0.5, pair j has scale 8j + 1 and min 7j (6 bits each, the high two
  // bits of pairs 4..7 packed into the top of bytes 0..7); nibble of element e = e % 16;
  // value d * scale(e / 32) * (e % 16) - dmin * min(e / 32).
  put_half(q4k, 1.0f);
  put_half(q4k, 0.5f);
  {
    std::uint8_t sc[12] = {};
    for (int j = 0; j < 8; ++j) {
      const int scale = 8 * j + 1, mn = 7 * j;
      if (j < 4) {
        sc[j] = static_cast<std::uint8_t>(sc[j] | scale);
        sc[j + 4] = static_cast<std::uint8_t>(sc[j + 4] | mn);
      } else {
        sc[j + 4] = static_cast<std::uint8_t>((scale & 0xF) | ((mn & 0xF) << 4));
        sc[j - 4] = static_cast<std::uint8_t>(sc[j - 4] | ((scale >> 4) << 6));
        sc[j] = static_cast<std::uint8_t>(sc[j] | ((mn >> 4) << 6));
      }
    }
    q4k.insert(q4k.end(), sc, sc + 12);
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 32; ++i) q4k.push_back(static_cast<std::uint8_t>((i % 16) * 0x11));
    for (int e = 0; e < 256; ++e)
      want_q4k.push_back(static_cast<float>(8 * (e / 32) + 1) * static_cast<float>(e % 16) -
                         0.5f * static_cast<float>(7 * (e / 32)));
  }
  w.tensor("q50", {32}, 6, q50);
  w.tensor("q4k", {256}, 12, q4k);
  w.tensor("q40", {32}, 2, q40);
  w.tensor("q41", {32}, 3, q41);
  w.tensor("q80", {32}, 8, q80);
  w.tensor("f16", {4}, 1, f16);
  w.tensor("bf16", {4}, 30, bf16);
  w.tensor("q6k", {256}, 14, q6k);
  const auto f = gguf_file::from_memory(w.bytes());
  CHECK(f.dequantize(f.tensor("q40")) == want_q40);
  CHECK(f.dequantize(f.tensor("q41")) == want_q41);
  CHECK(f.dequantize(f.tensor("q80")) == want_q80);
  CHECK(f.dequantize(f.tensor("f16")) == want_f16);
  CHECK(f.dequantize(f.tensor("bf16")) == want_bf16);
  CHECK(f.dequantize(f.tensor("q6k")) == want_q6k);
  CHECK(f.dequantize(f.tensor("q50")) == want_q50);
  CHECK(f.dequantize(f.tensor("q4k")) == want_q4k);
}

TEST_CASE("gguf: malformed files name the offset and the problem", "[engine]") {
  const auto good = small().bytes();
  REQUIRE_NOTHROW(gguf_file::from_memory(good));
  // Every truncation is an error, never a crash.
  for (std::size_t n = 0; n < good.size(); n += 7) {
    std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_THROWS_AS(gguf_file::from_memory(cut), gguf_error);
  }
  auto bad = good;
  bad[0] = 'X';
  CHECK(error_offset(bad) == 0);
  bad = good;
  bad[4] = 9;  // version
  CHECK(error_offset(bad) == 4);
  try {
    relokv_test::gguf_writer w;
    w.tensor("q5", {32}, 7, std::vector<std::uint8_t>(24));  // Q5_1: not supported
    (void)gguf_file::from_memory(w.bytes(), "model.gguf");
    FAIL("no error");
  } catch (const gguf_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("model.gguf") != std::string::npos);
    CHECK(msg.find("unsupported type 7") != std::string::npos);
    CHECK(msg.find("'q5'") != std::string::npos);
  }
  {  // data past the end of the file
    relokv_test::gguf_writer w;
    w.tensor_f32("t", {8}, {1, 2, 3, 4, 5, 6, 7, 8});
    auto b = w.bytes();
    b.resize(b.size() - 4);
    try {
      (void)gguf_file::from_memory(b);
      FAIL("no error");
    } catch (const gguf_error& e) {
      CHECK(std::string(e.what()).find("past the end") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(gguf_file::open("/nonexistent/model.gguf"), gguf_error);
}

TEST_CASE("gguf: a huge metadata array is an error before it is held", "[engine]") {
  // One u8 array of 2^24 elements, with the bytes to back it: the file holds it, but the
  // reader would hold 2^24 values (~50 bytes each in memory). 10^8 elements in a 100 MB file
  // asked for ~20 GB before the limit.
  const std::uint64_t n = std::uint64_t{1} << 24;
  std::vector<std::uint8_t> b;
  const auto put = [&](auto v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(v));
  };
  put(std::uint32_t{0x46554747});  // "GGUF"
  put(std::uint32_t{3});
  put(std::uint64_t{0});  // tensors
  put(std::uint64_t{1});  // metadata
  put(std::uint64_t{3});
  b.insert(b.end(), {'b', 'i', 'g'});
  put(std::uint32_t{9});  // array
  put(std::uint32_t{0});  // of u8
  put(n);
  const std::size_t array_at = 24 + 8 + 3 + 4;
  b.resize(b.size() + n, 0);
  try {
    (void)gguf_file::from_memory(std::move(b), "big.gguf");
    FAIL("no error");
  } catch (const gguf_error& e) {
    CHECK(e.offset() == array_at);
    CHECK_THAT(std::string(e.what()), Catch::Matchers::Contains("limit"));
  }
  // The same array's bytes claimed by tensor infos that follow the metadata: not in the file.
  std::vector<std::uint8_t> c;
  const auto put_c = [&](auto v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    c.insert(c.end(), p, p + sizeof(v));
  };
  put_c(std::uint32_t{0x46554747});
  put_c(std::uint32_t{3});
  put_c(std::uint64_t{100});  // 100 tensor infos need at least 2,400 bytes
  put_c(std::uint64_t{1});
  put_c(std::uint64_t{1});
  c.push_back('a');
  put_c(std::uint32_t{9});
  put_c(std::uint32_t{0});
  put_c(std::uint64_t{2000});
  c.resize(c.size() + 2400, 0);  // 2,400 bytes: the array's 2,000 leave too few for the infos
  CHECK_THROWS_WITH(gguf_file::from_memory(std::move(c)),
                    Catch::Matchers::Contains("array of 2000 elements exceeds the file"));
}

namespace {
/// A llama GGUF header (token embeddings only) whose hyperparameters a test overrides; the
/// checks read them before any other tensor.
struct llama_keys {
  std::uint32_t block_count = 2;
  std::uint32_t head_count = 2;
  float eps = 1e-5f;
  float freq_base = 10000.0f;
  std::uint32_t rope_dims = 4;
  std::string scaling = "";
  std::uint32_t yarn_original = 4096;
};
std::string llama_load_error(const llama_keys& k) {
  relokv_test::gguf_writer w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", k.block_count);
  w.kv_u32("llama.embedding_length", 8);
  w.kv_u32("llama.attention.head_count", k.head_count);
  w.kv_u32("llama.feed_forward_length", 16);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", k.eps);
  w.kv_f32("llama.rope.freq_base", k.freq_base);
  w.kv_u32("llama.rope.dimension_count", k.rope_dims);
  if (!k.scaling.empty()) {
    w.kv_str("llama.rope.scaling.type", k.scaling);
    w.kv_f32("llama.rope.scaling.factor", 2.0f);
    w.kv_u32("llama.rope.scaling.original_context_length", k.yarn_original);
  }
  w.tensor_f32("token_embd.weight", {8, 4}, std::vector<float>(32, 0.5f));
  try {
    (void)relokv_engine::llama_model::from_gguf(gguf_file::from_memory(w.bytes(), "m.gguf"));
  } catch (const gguf_error& e) {
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("gguf: hyperparameters are checked at load, naming the key", "[engine]") {
  auto fails_on = [](const llama_keys& k, const char* key) {
    const std::string msg = llama_load_error(k);
    INFO(msg);
    return msg.find(key) != std::string::npos && msg.find("m.gguf") != std::string::npos;
  };
  llama_keys k;
  // The good header passes the checks and fails later, at the first missing layer tensor.
  CHECK(llama_load_error(k).find("output_norm.weight") != std::string::npos);
  k = {};
  k.eps = std::nanf("");
  CHECK(fails_on(k, "layer_norm_rms_epsilon"));
  k.eps = -1.0f;
  CHECK(fails_on(k, "layer_norm_rms_epsilon"));
  k = {};
  k.block_count = 0;
  CHECK(fails_on(k, "llama.block_count = 0"));
  k.block_count = 0xFFFFFFFFu;
  CHECK(fails_on(k, "llama.block_count = 4294967295"));
  k = {};
  k.rope_dims = 3;
  CHECK(fails_on(k, "llama.rope.dimension_count = 3"));
  k = {};
  k.freq_base = std::nanf("");
  CHECK(fails_on(k, "llama.rope.freq_base"));
  k = {};
  k.scaling = "yarn";
  k.yarn_original = 0;
  CHECK(fails_on(k, "original_context_length = 0"));
  k = {};
  k.scaling = "longrope";
  CHECK(fails_on(k, "llama.rope.scaling.type = 'longrope'"));
  k = {};
  k.head_count = 3;  // 8 is not a multiple of 3
  CHECK(fails_on(k, "head_count 3"));
}
