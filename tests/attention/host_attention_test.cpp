#include <relokv/attention/host_attention.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "support/attention_oracle.hpp"
#include "support/catch.hpp"
#include "support/test_data.hpp"

using relokv::block_entry;

namespace {

using relokv_test::randn;

// Tolerances (max abs error relative to the largest |output|), derived in the test notes:
// fp32: table rotations and float accumulation, ~1e-6; bf16: rounding each stored element by at
// most 2^-9 relative moves a score q.k/sqrt(d) by at most 2^-9 sum|q_i k_i|/sqrt(d), about
// 2^-9 * 0.8 sqrt(d) (= 0.013 for d = 64) and the output by about that relative; on AVX512_BF16
// hosts the query and the softmax weights are rounded to bf16 as well (bf16 products, fp32
// sums), which doubles the score bound and adds 2^-9 to the output: 0.03; at_attention there
// also rounds each slot's (cos, sin) to bf16 before rotating the key (a relative key error of
// at most 2^-9 sqrt(2) more, +0.018 on the score bound): 0.05 at worst, which 6e-2 still covers
// (these worst cases add every error with one sign); fp16 (2^-12): 8x less than the
// storage-only bf16 bound, with 2x margin. (Observed: bf16 0.005 for every placement, fp16
// 5e-4.)
template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  if constexpr (std::is_same_v<T, relokv::bf16>) return 6e-2;
  return 4e-3;
}

struct doc_block {
  relokv::block_id block;
  int orig_pos0;
  int len;
  std::vector<oracle::key_token> tokens;  // raw K/V per slot
};

/// Writes `len` random tokens into `block` as if computed at positions orig_pos0...
template <class P, class T>
doc_block write_block(const relokv::rope_table& rope, relokv::host_kv_storage<T>& st,
                      relokv::block_id block, int orig_pos0, int len, std::mt19937& rng) {
  const auto& s = st.shape();
  doc_block d{block, orig_pos0, len, {}};
  for (int j = 0; j < len; ++j) {
    oracle::key_token t;
    t.pos = 0;
    t.k = randn(static_cast<std::size_t>(s.num_kv_heads * s.head_dim), rng);
    t.v = randn(static_cast<std::size_t>(s.num_kv_heads * s.head_dim), rng);
    relokv::append_kv<P>(rope, st.layer(0), block, j, orig_pos0 + j, t.k.data(), t.v.data());
    d.tokens.push_back(std::move(t));
  }
  return d;
}

/// Blocks 0, 1, ... with the given lens, written one after another from position `pos`, `gap`
/// positions skipped before block `gap_at` (-1: none): appends their tokens (at their
/// positions) to keys and their table entries to entries; returns the end position.
template <class P, class T>
int write_run(const relokv::rope_table& rope, relokv::host_kv_storage<T>& st, int pos,
              const std::vector<int>& lens, int gap_at, int gap, std::mt19937& rng,
              std::vector<oracle::key_token>& keys, std::vector<block_entry>& entries) {
  for (int b = 0; b < static_cast<int>(lens.size()); ++b) {
    if (b == gap_at) pos += gap;
    const int len = lens[static_cast<std::size_t>(b)];
    auto d = write_block<P>(rope, st, b, pos, len, rng);
    for (int j = 0; j < len; ++j) {
      d.tokens[static_cast<std::size_t>(j)].pos = pos + j;
      keys.push_back(d.tokens[static_cast<std::size_t>(j)]);
    }
    entries.push_back({b, pos, len});
    pos += len;
  }
  return pos;
}

/// write_run from position 0 without a gap.
template <class P, class T>
int back_to_back(const relokv::rope_table& rope, relokv::host_kv_storage<T>& st,
                 std::initializer_list<int> lens, std::mt19937& rng,
                 std::vector<oracle::key_token>& keys, std::vector<block_entry>& entries) {
  return write_run<P>(rope, st, 0, lens, -1, 0, rng, keys, entries);
}

template <class T>
double max_err(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return err / scale;
}

relokv::rope_config config(relokv::rope_layout layout, int head_dim = 64) {
  relokv::rope_config c;
  c.head_dim = c.rotary_dim = head_dim;
  c.layout = layout;
  return c;
}

/// Blocks computed at one set of positions, read at others: the kernel must equal attention
/// over keys rotated afresh at the new positions.
template <class P, class T>
void relocation_case(relokv::rope_layout layout, int num_q_heads, int num_kv_heads) {
  std::mt19937 rng(7);
  const auto cfg = config(layout);
  const relokv::rope_table rope(cfg, 2048);
  relokv::host_kv_storage<T> st(relokv::kv_shape{1, 8, num_kv_heads, 16, 64});
  // Three blocks computed for another request at positions 300.., 700.., 1200..
  std::vector<doc_block> docs = {write_block<P>(rope, st, 0, 300, 16, rng),
                                 write_block<P>(rope, st, 1, 700, 16, rng),
                                 write_block<P>(rope, st, 2, 1200, 9, rng)};
  // This request reads them as: block 2 at 0, block 0 at 9, block 1 at 25 (len 16 each).
  const int new_pos0[3] = {9, 25, 0};
  std::vector<block_entry> table;
  for (int i : {2, 0, 1}) {
    relokv::block_id b = docs[static_cast<std::size_t>(i)].block;
    if constexpr (P::relocation_rotates_keys) {  // a private, delta-rotated copy
      const relokv::block_id copy = 4 + i;
      relokv::relocate_block(rope, st.layer(0), b, copy,
                             new_pos0[i] - docs[static_cast<std::size_t>(i)].orig_pos0, 16);
      b = copy;
    }
    table.push_back({b, new_pos0[i], docs[static_cast<std::size_t>(i)].len});
  }
  std::vector<oracle::key_token> keys;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < docs[static_cast<std::size_t>(i)].len; ++j) {
      auto t = docs[static_cast<std::size_t>(i)].tokens[static_cast<std::size_t>(j)];
      t.pos = new_pos0[i] + j;
      keys.push_back(t);
    }
  const std::int32_t indptr[2] = {0, 3};
  const relokv::block_table_view view{table.data(), indptr, 1};
  const float scale = 0.125f;
  // Decode at position 41 (after every key), and at 20 (causal: sees part of block 0 only).
  for (int m : {41, 20, 0}) {
    const auto q = randn(static_cast<std::size_t>(num_q_heads * 64), rng);
    std::vector<float> out(q.size());
    relokv::decode_attention<P>(rope, relokv::paged_kv_view<const T>(st.layer(0)), view, q.data(),
                                &m, num_q_heads, scale, out.data());
    const auto want = oracle::attend(cfg, keys, q, m, num_q_heads, num_kv_heads, scale);
    INFO("m " << m);
    CHECK(max_err<T>(out, want) < tolerance<T>());
  }
}

}  // namespace

TEMPLATE_TEST_CASE("attention: relocated blocks equal keys rotated afresh", "[attention]",
                   relokv::pre_rotated, relokv::at_attention, relokv::block_relative) {
  for (auto layout : {relokv::rope_layout::kNeoX, relokv::rope_layout::kGPTJ}) {
    INFO("layout " << int(layout));
    SECTION("fp32") { relocation_case<TestType, float>(layout, 8, 2); }
    SECTION("bf16") { relocation_case<TestType, relokv::bf16>(layout, 8, 2); }
    SECTION("fp16") { relocation_case<TestType, relokv::fp16>(layout, 8, 2); }
    SECTION("MQA fp32") { relocation_case<TestType, float>(layout, 4, 1); }
    SECTION("MHA fp32") { relocation_case<TestType, float>(layout, 2, 2); }
    SECTION("MHA bf16") { relocation_case<TestType, relokv::bf16>(layout, 2, 2); }
    SECTION("3 heads per group bf16") { relocation_case<TestType, relokv::bf16>(layout, 6, 2); }
  }
}

TEMPLATE_TEST_CASE("attention: one physical block at two positions in one batch", "[attention]",
                   relokv::at_attention, relokv::block_relative) {
  std::mt19937 rng(11);
  const auto cfg = config(relokv::rope_layout::kNeoX);
  const relokv::rope_table rope(cfg, 1024);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 4, 2, 16, 64});
  auto shared = write_block<TestType>(rope, st, 0, 0, 16, rng);
  auto other = write_block<TestType>(rope, st, 1, 0, 12, rng);
  // seq 0: [other at 0][shared at 12]; seq 1: [shared at 0][other at 16]
  const std::vector<block_entry> entries = {{1, 0, 12}, {0, 12, 16}, {0, 0, 16}, {1, 16, 12}};
  const std::int32_t indptr[3] = {0, 2, 4};
  const relokv::block_table_view view{entries.data(), indptr, 2};
  const relokv::pos_t pos[2] = {27, 27};
  const auto q = randn(2 * 4 * 64, rng);
  std::vector<float> out(q.size());
  relokv::decode_attention<TestType>(rope, relokv::paged_kv_view<const float>(st.layer(0)), view,
                                     q.data(), pos, 4, 0.125f, out.data());
  for (int s = 0; s < 2; ++s) {
    std::vector<oracle::key_token> keys;
    for (int e = indptr[s]; e < indptr[s + 1]; ++e) {
      const auto& blk = entries[static_cast<std::size_t>(e)].block == 0 ? shared : other;
      for (int j = 0; j < blk.len; ++j) {
        auto t = blk.tokens[static_cast<std::size_t>(j)];
        t.pos = entries[static_cast<std::size_t>(e)].pos0 + j;
        keys.push_back(t);
      }
    }
    const std::vector<float> qs(q.begin() + s * 256, q.begin() + (s + 1) * 256);
    const std::vector<float> got(out.begin() + s * 256, out.begin() + (s + 1) * 256);
    CHECK(max_err<float>(got, oracle::attend(cfg, keys, qs, 27, 4, 2, 0.125)) < 1e-5);
  }
}

TEMPLATE_TEST_CASE("attention: scattered prefill queries agree with brute force", "[attention]",
                   relokv::pre_rotated, relokv::at_attention, relokv::block_relative) {
  std::mt19937 rng(5);
  const auto cfg = config(relokv::rope_layout::kNeoX, 32);
  const relokv::rope_table rope(cfg, 512);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 4, 1, 8, 32});
  std::vector<oracle::key_token> keys;
  std::vector<block_entry> entries;
  back_to_back<TestType>(rope, st, {8, 5, 8}, rng, keys, entries);  // 5: padding
  const std::int32_t indptr[2] = {0, 3};
  const relokv::block_table_view view{entries.data(), indptr, 1};
  const std::vector<relokv::pos_t> qpos = {0, 7, 8, 12, 13, 20};  // scattered, seams included
  const std::int32_t qind[2] = {0, static_cast<std::int32_t>(qpos.size())};
  const auto q = randn(qpos.size() * 2 * 32, rng);
  std::vector<float> out(q.size());
  relokv::prefill_attention<TestType>(rope, relokv::paged_kv_view<const float>(st.layer(0)), view,
                                      q.data(), qpos.data(), qind, 2, 0.2f, out.data());
  for (std::size_t t = 0; t < qpos.size(); ++t) {
    const std::vector<float> qs(q.begin() + static_cast<std::ptrdiff_t>(t * 64),
                                q.begin() + static_cast<std::ptrdiff_t>((t + 1) * 64));
    const std::vector<float> got(out.begin() + static_cast<std::ptrdiff_t>(t * 64),
                                 out.begin() + static_cast<std::ptrdiff_t>((t + 1) * 64));
    INFO("query at " << qpos[t]);
    CHECK(max_err<float>(got, oracle::attend(cfg, keys, qs, qpos[t], 2, 1, 0.2)) < 1e-5);
  }
}

TEMPLATE_TEST_CASE("attention: prefill on the fast paths agrees with brute force", "[attention]",
                   relokv::pre_rotated, relokv::at_attention, relokv::block_relative) {
  // 20 queries (two groups of 16) at scattered positions over blocks with padding, GQA, head
  // dims 64 and 128, block sizes 16 and 32, every dtype, NeoX, GPT-J and partial rotary;
  // unused slots hold NaN.
  const auto run = [](auto zero, int head_dim, int block_size, relokv::rope_layout layout,
                      int rotary_dim) {
    using T = decltype(zero);
    std::mt19937 rng(23);
    auto cfg = config(layout, head_dim);
    cfg.rotary_dim = rotary_dim;
    const relokv::rope_table rope(cfg, 512);
    relokv::host_kv_storage<T> st(relokv::kv_shape{1, 6, 2, block_size, head_dim});
    for (std::size_t i = 0; i < st.shape().total_elems(); ++i)
      st.data()[i] = relokv::from_f32<T>(std::numeric_limits<float>::quiet_NaN());
    std::vector<oracle::key_token> keys;
    std::vector<block_entry> entries;
    const int end = block_size == 16
                        ? back_to_back<TestType>(rope, st, {16, 9, 16, 13, 16}, rng, keys, entries)
                        : back_to_back<TestType>(rope, st, {32, 21, 32}, rng, keys, entries);
    std::vector<relokv::pos_t> qpos;
    for (int t = 0; t < 20; ++t) qpos.push_back((t * 37 + 5) % end);
    const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(entries.size())};
    const std::int32_t qind[2] = {0, 20};
    const auto q = randn(20 * 6 * static_cast<std::size_t>(head_dim), rng);
    std::vector<float> out(q.size());
    relokv::prefill_attention<TestType>(rope, relokv::paged_kv_view<const T>(st.layer(0)),
                                        {entries.data(), indptr, 1}, q.data(), qpos.data(), qind, 6,
                                        0.1f, out.data());
    const auto row = static_cast<std::size_t>(6 * head_dim);
    for (std::size_t t = 0; t < qpos.size(); ++t) {
      const std::vector<float> qs(q.begin() + static_cast<std::ptrdiff_t>(t * row),
                                  q.begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
      const std::vector<float> got(out.begin() + static_cast<std::ptrdiff_t>(t * row),
                                   out.begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
      INFO("head_dim " << head_dim << " block " << block_size << " layout " << int(layout)
                       << " rotary " << rotary_dim << " query at " << qpos[t]);
      CHECK(max_err<T>(got, oracle::attend(cfg, keys, qs, qpos[t], 6, 2, 0.1)) < tolerance<T>());
    }
  };
  for (int head_dim : {64, 128})
    for (int block_size : {16, 32}) {
      run(float{}, head_dim, block_size, relokv::rope_layout::kNeoX, head_dim);
      run(relokv::bf16{}, head_dim, block_size, relokv::rope_layout::kNeoX, head_dim);
      run(relokv::fp16{}, head_dim, block_size, relokv::rope_layout::kNeoX, head_dim);
    }
  for (auto layout : {relokv::rope_layout::kNeoX, relokv::rope_layout::kGPTJ}) {
    run(float{}, 64, 16, layout, 32);  // partial rotary
    run(float{}, 128, 16, relokv::rope_layout::kGPTJ, 128);
    run(relokv::bf16{}, 64, 16, layout, 32);
    run(relokv::fp16{}, 128, 32, layout, 64);
  }
}

TEMPLATE_TEST_CASE("attention: garbage in unused slots never reaches the output", "[attention]",
                   relokv::pre_rotated, relokv::at_attention, relokv::block_relative) {
  // Slots past a block's len hold whatever was there (here NaN); head_dim 128 and odd lens
  // exercise the paired-slot value loads of the bf16 kernel.
  const auto run = [](auto zero) {
    using T = decltype(zero);
    std::mt19937 rng(13);
    const auto cfg = config(relokv::rope_layout::kNeoX, 128);
    const relokv::rope_table rope(cfg, 256);
    relokv::host_kv_storage<T> st(relokv::kv_shape{1, 4, 2, 16, 128});
    for (std::size_t i = 0; i < st.shape().total_elems(); ++i)
      st.data()[i] = relokv::from_f32<T>(std::numeric_limits<float>::quiet_NaN());
    std::vector<oracle::key_token> keys;
    std::vector<block_entry> entries;
    const int end = back_to_back<TestType>(rope, st, {9, 15, 6}, rng, keys, entries);
    const std::int32_t indptr[2] = {0, 3};
    const relokv::pos_t m = end - 1;
    const auto q = randn(8 * 128, rng);
    std::vector<float> out(q.size());
    relokv::decode_attention<TestType>(rope, relokv::paged_kv_view<const T>(st.layer(0)),
                                       {entries.data(), indptr, 1}, q.data(), &m, 8, 0.09f,
                                       out.data());
    for (float x : out) REQUIRE(std::isfinite(x));
    CHECK(max_err<T>(out, oracle::attend(cfg, keys, q, m, 8, 2, 0.09)) < tolerance<T>());
  };
  SECTION("fp32") { run(float{}); }
  SECTION("bf16") { run(relokv::bf16{}); }
  SECTION("fp16") { run(relokv::fp16{}); }
}

TEMPLATE_TEST_CASE("attention: long decode over consecutive blocks matches the oracle",
                   "[attention]", relokv::pre_rotated, relokv::at_attention,
                   relokv::block_relative) {
  // Decode composes the per-block query rotation from the previous block's when blocks follow
  // each other (re-reading the table every few blocks): 40 blocks across the table's end, with
  // a gap and a short block among them, NeoX and GPT-J, with and without a YaRN magnitude.
  const auto run = [](auto zero, relokv::rope_layout layout, bool yarn) {
    using T = decltype(zero);
    std::mt19937 rng(17);
    auto cfg = config(layout, 128);
    if (yarn) {
      cfg.scaling = relokv::rope_scaling::kYaRN;
      cfg.factor = 4;
      cfg.original_max_position = 512;
    }
    const relokv::rope_table rope(cfg, 4300);
    relokv::host_kv_storage<T> st(relokv::kv_shape{1, 40, 2, 16, 128});
    std::vector<oracle::key_token> keys;
    std::vector<block_entry> entries;
    std::vector<int> lens(40, 16);
    lens[25] = 7;
    const int pos = write_run<TestType>(rope, st, 4000, lens, 17, 100, rng, keys, entries);
    const std::int32_t indptr[2] = {0, 40};
    const relokv::pos_t m = pos + 2;
    const auto q = randn(6 * 128, rng);  // 3 query heads per KV head
    std::vector<float> out(q.size());
    relokv::decode_attention<TestType>(rope, relokv::paged_kv_view<const T>(st.layer(0)),
                                       {entries.data(), indptr, 1}, q.data(), &m, 6, 0.09f,
                                       out.data());
    CHECK(max_err<T>(out, oracle::attend(cfg, keys, q, m, 6, 2, 0.09)) < tolerance<T>());
  };
  for (auto layout : {relokv::rope_layout::kNeoX, relokv::rope_layout::kGPTJ})
    for (bool yarn : {false, true}) {
      INFO("layout " << int(layout) << " yarn " << yarn);
      run(float{}, layout, yarn);
      run(relokv::bf16{}, layout, yarn);
    }
}

TEMPLATE_TEST_CASE("attention: decode spans across block sizes, head dims and head ranges",
                   "[attention]", relokv::pre_rotated, relokv::at_attention,
                   relokv::block_relative) {
  // bf16 decode takes up to four 16-slot chunks per kernel call, from one block or several:
  // blocks of 16, 48 and 64 slots (a span ends inside a block), short and causally cut
  // blocks, a gap in the positions, head dims 64/128/256, three query heads per KV head (a
  // P.V set and a leftover head), and the KV heads split over two calls.
  const auto run = [](int bs, int D, relokv::rope_layout layout) {
    using T = relokv::bf16;
    std::mt19937 rng(static_cast<unsigned>(bs * 1000 + D));
    const auto cfg = config(layout, D);
    const relokv::rope_table rope(cfg, 2048);
    relokv::host_kv_storage<T> st(relokv::kv_shape{1, 8, 3, bs, D});
    std::vector<oracle::key_token> keys;
    std::vector<block_entry> entries;
    // A gap before block 3: the query rotation of that block is not chained.
    const int pos = write_run<TestType>(rope, st, 40, {bs, bs - 5, 3, bs, 1, bs - 1}, 3, 37, rng,
                                        keys, entries);
    const std::int32_t indptr[2] = {0, 6};
    const relokv::paged_kv_view<const T> kv(st.layer(0));
    // After every key, and inside block 3 (the causal limit cuts it).
    for (const relokv::pos_t m : {pos + 3, entries[3].pos0 + bs / 2}) {
      const auto q = randn(static_cast<std::size_t>(9 * D), rng);
      std::vector<float> whole(q.size()), split(q.size());
      relokv::decode_attention<TestType>(rope, kv, {entries.data(), indptr, 1}, q.data(), &m, 9,
                                         0.09f, whole.data());
      std::vector<oracle::key_token> seen;
      for (const auto& k : keys)
        if (k.pos <= m) seen.push_back(k);
      INFO("block size " << bs << " head dim " << D << " layout " << int(layout) << " m " << m);
      CHECK(max_err<T>(whole, oracle::attend(cfg, seen, q, m, 9, 3, 0.09)) < tolerance<T>());
      for (const relokv::kv_head_range r : {relokv::kv_head_range{0, 1}, {1, 3}})
        relokv::decode_attention<TestType>(rope, kv, {entries.data(), indptr, 1}, q.data(), &m, 9,
                                           0.09f, split.data(), r);
      CHECK(split == whole);  // the same arithmetic per head
    }
  };
  for (int bs : {16, 48, 64})
    for (int D : {64, 128, 256})
      for (auto layout : {relokv::rope_layout::kNeoX, relokv::rope_layout::kGPTJ})
        run(bs, D, layout);
}

TEST_CASE("attention: YaRN magnitude and partial rotary through the kernels", "[attention]") {
  std::mt19937 rng(9);
  auto cfg = config(relokv::rope_layout::kGPTJ);
  cfg.rotary_dim = 32;
  cfg.scaling = relokv::rope_scaling::kYaRN;
  cfg.factor = 4;
  cfg.original_max_position = 512;
  const relokv::rope_table rope(cfg, 256);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 2, 1, 16, 64});
  auto d = write_block<relokv::block_relative>(rope, st, 0, 0, 16, rng);
  std::vector<oracle::key_token> keys = d.tokens;
  for (int j = 0; j < 16; ++j) keys[static_cast<std::size_t>(j)].pos = 300 + j;  // past the table
  const std::vector<block_entry> e = {{0, 300, 16}};
  const std::int32_t indptr[2] = {0, 1};
  const relokv::pos_t m = 400;
  const auto q = randn(64, rng);
  std::vector<float> out(64);
  relokv::decode_attention<relokv::block_relative>(
      rope, relokv::paged_kv_view<const float>(st.layer(0)), {e.data(), indptr, 1}, q.data(), &m, 1,
      0.125f, out.data());
  CHECK(max_err<float>(out, oracle::attend(cfg, keys, q, m, 1, 1, 0.125)) < 1e-5);
}

TEMPLATE_TEST_CASE("attention: calls split over KV heads on threads equal one call", "[attention]",
                   float, relokv::bf16) {
  using T = TestType;
  std::mt19937 rng(17);
  const auto cfg = config(relokv::rope_layout::kNeoX, 128);
  const relokv::rope_table rope(cfg, 512);
  relokv::host_kv_storage<T> st(relokv::kv_shape{1, 6, 4, 16, 128});
  std::vector<block_entry> entries;
  for (int b = 0; b < 6; ++b) {
    write_block<relokv::block_relative>(rope, st, b, 16 * b, b == 5 ? 7 : 16, rng);
    entries.push_back({b, 16 * b, b == 5 ? 7 : 16});
  }
  const std::int32_t indptr[2] = {0, 6};
  const relokv::block_table_view view{entries.data(), indptr, 1};
  const relokv::paged_kv_view<const T> kv(st.layer(0));
  const std::vector<relokv::pos_t> qpos = {3, 40, 86};
  const std::int32_t qind[2] = {0, 3};
  const auto q = randn(3 * 16 * 128, rng);
  for (bool decode : {true, false}) {
    INFO((decode ? "decode" : "prefill"));
    const auto call = [&](std::vector<float>& out, relokv::kv_head_range r) {
      if (decode) {
        relokv::decode_attention<relokv::block_relative>(rope, kv, view, q.data(), &qpos[2], 16,
                                                         0.09f, out.data(), r);
      } else {
        relokv::prefill_attention<relokv::block_relative>(rope, kv, view, q.data(), qpos.data(),
                                                          qind, 16, 0.09f, out.data(), r);
      }
    };
    const std::size_t n = decode ? 16 * 128 : 3 * 16 * 128;
    std::vector<float> whole(n), split(n, -1.0f);
    call(whole, {});
    std::thread t0([&] { call(split, {0, 1}); });
    std::thread t1([&] { call(split, {1, 4}); });
    t0.join();
    t1.join();
    CHECK(split == whole);  // same arithmetic per head: bitwise equal
  }
  // Queries are independent too: an engine may cut a prefill's queries between threads.
  std::vector<float> whole(3 * 16 * 128), parts(whole.size());
  relokv::prefill_attention<relokv::block_relative>(rope, kv, view, q.data(), qpos.data(), qind, 16,
                                                    0.09f, whole.data());
  const std::int32_t first[2] = {0, 1}, rest[2] = {0, 2};
  relokv::prefill_attention<relokv::block_relative>(rope, kv, view, q.data(), qpos.data(), first,
                                                    16, 0.09f, parts.data());
  relokv::prefill_attention<relokv::block_relative>(rope, kv, view, q.data() + 16 * 128,
                                                    qpos.data() + 1, rest, 16, 0.09f,
                                                    parts.data() + 16 * 128);
  CHECK(parts == whole);
  std::vector<float> out(16 * 128);
  CHECK_THROWS_AS(relokv::decode_attention<relokv::block_relative>(
                      rope, kv, view, q.data(), &qpos[2], 16, 0.09f, out.data(), {3, 2}),
                  relokv::error);
  CHECK_THROWS_AS(relokv::decode_attention<relokv::block_relative>(
                      rope, kv, view, q.data(), &qpos[2], 16, 0.09f, out.data(), {-1, 2}),
                  relokv::error);
}

/// Largest log-sum-exp error relative to max(1, |want|); a row without visible keys must be
/// -inf in both.
double lse_err(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (!(std::isinf(want[i]) && std::isinf(got[i]) && got[i] < 0 && want[i] < 0)) return 1e30;
      continue;
    }
    err = std::max(err, std::fabs(got[i] - want[i]) / std::max(1.0, std::fabs(want[i])));
  }
  return err;
}

TEMPLATE_TEST_CASE("attention: calls over parts of the blocks merge into one call", "[attention]",
                   relokv::pre_rotated, relokv::at_attention, relokv::block_relative) {
  // Split over a sequence's blocks: decode and prefill over disjoint ranges of the block table,
  // each with its log-sum-exp, folded together by merge_attention_states, equal one call over
  // every block and the oracle. GQA (4 query heads per KV head) and MQA (8 over one), fp32,
  // bf16 (spans) and fp16; a gap in the positions; parts that are empty, or that lie wholly
  // after a query (no visible key: lse -inf, nothing merged).
  const auto run = [](auto zero, int num_kv_heads) {
    using T = decltype(zero);
    constexpr int D = 128, Hq = 8;
    std::mt19937 rng(static_cast<unsigned>(23 + num_kv_heads));
    const auto cfg = config(relokv::rope_layout::kNeoX, D);
    const relokv::rope_table rope(cfg, 2048);
    relokv::host_kv_storage<T> st(relokv::kv_shape{1, 10, num_kv_heads, 16, D});
    std::vector<oracle::key_token> keys;
    std::vector<block_entry> entries;
    const int pos = write_run<TestType>(rope, st, 100, {16, 16, 16, 5, 16, 16, 16, 16, 16, 9}, 4,
                                        30, rng, keys, entries);
    const relokv::paged_kv_view<const T> kv(st.layer(0));
    const float scale = 0.09f;
    // Queries: after every key, inside block 6 (blocks 7.. unseen), inside block 1.
    const std::vector<relokv::pos_t> qpos = {pos + 1, entries[6].pos0 + 3, entries[1].pos0 + 7};
    const auto nt = static_cast<std::int32_t>(qpos.size());
    const auto q = randn(qpos.size() * Hq * D, rng);
    const std::size_t rows = qpos.size() * Hq;
    std::vector<double> want(rows * D), want_lse(rows);
    for (std::size_t t = 0; t < qpos.size(); ++t) {
      const std::vector<float> qt(q.begin() + static_cast<std::ptrdiff_t>(t * Hq * D),
                                  q.begin() + static_cast<std::ptrdiff_t>((t + 1) * Hq * D));
      std::vector<double> l;
      const auto o = oracle::attend(cfg, keys, qt, qpos[t], Hq, num_kv_heads, scale, &l);
      std::copy(o.begin(), o.end(), want.begin() + static_cast<std::ptrdiff_t>(t * Hq * D));
      std::copy(l.begin(), l.end(), want_lse.begin() + static_cast<std::ptrdiff_t>(t * Hq));
    }
    // One call over blocks [b0, b1): prefill, or decode with each query its own sequence over
    // those blocks.
    const auto call = [&](bool decode, int b0, int b1, float* out, float* lse) {
      if (decode) {
        std::vector<block_entry> tab;
        std::vector<std::int32_t> indptr = {0};
        for (std::int32_t t = 0; t < nt; ++t) {
          tab.insert(tab.end(), entries.begin() + b0, entries.begin() + b1);
          indptr.push_back(static_cast<std::int32_t>(tab.size()));
        }
        relokv::decode_attention<TestType>(rope, kv, {tab.data(), indptr.data(), nt}, q.data(),
                                           qpos.data(), Hq, scale, out, {}, lse);
      } else {
        const std::int32_t indptr[2] = {0, b1 - b0}, qind[2] = {0, nt};
        relokv::prefill_attention<TestType>(rope, kv, {entries.data() + b0, indptr, 1}, q.data(),
                                            qpos.data(), qind, Hq, scale, out, {}, lse);
      }
    };
    const double tol = tolerance<T>();
    for (bool decode : {true, false}) {
      std::vector<float> whole(rows * D), whole_lse(rows);
      call(decode, 0, 10, whole.data(), whole_lse.data());
      INFO((decode ? "decode" : "prefill") << " kv heads " << num_kv_heads);
      CHECK(max_err<T>(whole, want) < tol);
      CHECK(lse_err(whole_lse, want_lse) < tol);
      for (const auto& cuts : std::vector<std::vector<int>>{
               {0, 5, 10}, {0, 3, 7, 10}, {0, 0, 10}, {0, 8, 10}, {0, 1, 2, 4, 6, 9, 10}}) {
        // The accumulator starts as "no key seen": zeros, lse -inf.
        std::vector<float> acc(rows * D, 0.0f),
            acc_lse(rows, -std::numeric_limits<float>::infinity());
        std::vector<float> part(rows * D, -1.0f), part_lse(rows, 7.0f);
        for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
          call(decode, cuts[k], cuts[k + 1], part.data(), part_lse.data());
          relokv::merge_attention_states(rows, D, acc.data(), acc_lse.data(), part.data(),
                                         part_lse.data());
        }
        INFO("parts " << cuts.size() - 1);
        CHECK(max_err<T>(acc, want) < tol);
        CHECK(lse_err(acc_lse, want_lse) < tol);
        if constexpr (std::is_same_v<T, float>) {
          const std::vector<double> w(whole.begin(), whole.end());
          CHECK(max_err<T>(acc, w) < 1e-5);
        }
      }
      // Two halves on two threads, merged after the join: what an engine does for MQA.
      std::vector<float> a(rows * D), a_lse(rows), b(rows * D), b_lse(rows);
      std::thread t0([&] { call(decode, 0, 5, a.data(), a_lse.data()); });
      std::thread t1([&] { call(decode, 5, 10, b.data(), b_lse.data()); });
      t0.join();
      t1.join();
      relokv::merge_attention_states(rows, D, a.data(), a_lse.data(), b.data(), b_lse.data());
      CHECK(max_err<T>(a, want) < tol);
      CHECK(lse_err(a_lse, want_lse) < tol);
    }
  };
  for (int num_kv_heads : {2, 1}) {
    run(float{}, num_kv_heads);
    run(relokv::bf16{}, num_kv_heads);
    run(relokv::fp16{}, num_kv_heads);
  }
}

TEST_CASE("attention: a mutable pool's layer view is accepted as it is", "[attention]") {
  std::mt19937 rng(4);
  const auto cfg = config(relokv::rope_layout::kNeoX);
  const relokv::rope_table rope(cfg, 128);
  relokv::host_kv_storage<relokv::bf16> st(relokv::kv_shape{1, 2, 1, 16, 64});
  write_block<relokv::at_attention>(rope, st, 0, 0, 16, rng);
  const std::vector<block_entry> e = {{0, 0, 16}};
  const std::int32_t indptr[2] = {0, 1}, qind[2] = {0, 1};
  const relokv::pos_t m = 20;
  const auto q = randn(2 * 64, rng);
  std::vector<float> a(q.size()), b(q.size()), c(q.size()), d(q.size());
  relokv::decode_attention<relokv::at_attention>(rope, st.layer(0), {e.data(), indptr, 1}, q.data(),
                                                 &m, 2, 0.125f, a.data());
  relokv::decode_attention<relokv::at_attention>(
      rope, relokv::paged_kv_view<const relokv::bf16>(st.layer(0)), {e.data(), indptr, 1}, q.data(),
      &m, 2, 0.125f, b.data());
  relokv::prefill_attention<relokv::at_attention>(rope, st.layer(0), {e.data(), indptr, 1},
                                                  q.data(), &m, qind, 2, 0.125f, c.data());
  relokv::prefill_attention<relokv::at_attention>(
      rope, relokv::paged_kv_view<const relokv::bf16>(st.layer(0)), {e.data(), indptr, 1}, q.data(),
      &m, qind, 2, 0.125f, d.data());
  CHECK(a == b);
  CHECK(c == d);
}

TEST_CASE("attention: merging attention states", "[attention]") {
  const float ninf = -std::numeric_limits<float>::infinity();
  // Row 0: both parts saw keys; row 1: only b; row 2: only a; row 3: neither.
  std::vector<float> out = {1, 2, 5, 5, 3, 4, 0, 0}, lse = {0.0f, ninf, 1.5f, ninf};
  const std::vector<float> ob = {3, 6, 7, 8, 9, 9, 0, 0}, lb = {std::log(3.0f), 2.0f, ninf, ninf};
  relokv::merge_attention_states(4, 2, out.data(), lse.data(), ob.data(), lb.data());
  // Row 0: weights 1 and 3 of 4.
  CHECK(out[0] == Approx(0.25 * 1 + 0.75 * 3));
  CHECK(out[1] == Approx(0.25 * 2 + 0.75 * 6));
  CHECK(lse[0] == Approx(std::log(4.0)));
  CHECK(out[2] == 7.0f);
  CHECK(out[3] == 8.0f);
  CHECK(lse[1] == 2.0f);
  CHECK(out[4] == 3.0f);
  CHECK(out[5] == 4.0f);
  CHECK(lse[2] == 1.5f);
  CHECK(out[6] == 0.0f);
  CHECK(out[7] == 0.0f);
  CHECK(lse[3] == ninf);
  // Far apart log-sum-exps neither overflow nor lose the larger part.
  std::vector<float> o1 = {1}, l1 = {-200.0f};
  const std::vector<float> o2 = {2}, l2 = {300.0f};
  relokv::merge_attention_states(1, 1, o1.data(), l1.data(), o2.data(), l2.data());
  CHECK(o1[0] == 2.0f);
  CHECK(l1[0] == 300.0f);
  // Order of merging does not matter (up to rounding).
  std::mt19937 rng(3);
  const auto pa = randn(64, rng), pb = randn(64, rng), pc = randn(64, rng);
  const std::vector<float> la = {0.3f, -1.0f}, lbb = {2.0f, ninf}, lc = {-0.5f, 0.7f};
  std::vector<float> x = pa, xl = la, y = pc, yl = lc;
  relokv::merge_attention_states(2, 32, x.data(), xl.data(), pb.data(), lbb.data());
  relokv::merge_attention_states(2, 32, x.data(), xl.data(), pc.data(), lc.data());
  relokv::merge_attention_states(2, 32, y.data(), yl.data(), pb.data(), lbb.data());
  relokv::merge_attention_states(2, 32, y.data(), yl.data(), pa.data(), la.data());
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(x[i] == Approx(y[i]).margin(1e-6));
  CHECK(xl[0] == Approx(yl[0]));
  CHECK(xl[1] == Approx(yl[1]));
  // Bad input: a NaN log-sum-exp, a non-positive head_dim, null arrays.
  std::vector<float> nan_l = {std::numeric_limits<float>::quiet_NaN()};
  CHECK_THROWS_AS(
      relokv::merge_attention_states(1, 1, o1.data(), l1.data(), o2.data(), nan_l.data()),
      relokv::error);
  CHECK(o1[0] == 2.0f);  // nothing written before the error
  CHECK_THROWS_AS(relokv::merge_attention_states(1, 0, o1.data(), l1.data(), o2.data(), l2.data()),
                  relokv::error);
  CHECK_THROWS_AS(relokv::merge_attention_states(1, 1, nullptr, l1.data(), o2.data(), l2.data()),
                  relokv::error);
  relokv::merge_attention_states(0, 1, nullptr, nullptr, nullptr, nullptr);  // nothing to do
}

TEST_CASE("attention: shape errors are reported", "[attention]") {
  const auto cfg = config(relokv::rope_layout::kNeoX);
  const relokv::rope_table rope(cfg, 16);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 1, 3, 16, 64});
  const std::int32_t indptr[2] = {0, 0};
  std::vector<float> q(4 * 64), out(4 * 64);
  const relokv::pos_t m = 0;
  CHECK_THROWS_AS(relokv::decode_attention<relokv::at_attention>(
                      rope, relokv::paged_kv_view<const float>(st.layer(0)), {nullptr, indptr, 1},
                      q.data(), &m, 4, 1.0f, out.data()),
                  relokv::error);
  CHECK_THROWS_AS(
      relokv::append_kv<relokv::at_attention>(rope, st.layer(0), 1, 0, 0, q.data(), q.data()),
      relokv::error);
}

TEST_CASE("attention: the KV path checks shapes and block ids at its entry points", "[attention]") {
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = 64;
  const relokv::rope_table rope(cfg, 64);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 4, 2, 16, 64});
  std::vector<float> k(2 * 2048, 1.0f), q(4 * 64, 1.0f), out(4 * 64);
  // A view whose head_dim is above the kernels' staging buffers (and the rope's): an error,
  // not a stack overflow.
  auto wide = st.layer(0);
  wide.head_dim = 2048;
  wide.block_size = 1;
  CHECK_THROWS_AS(relokv::append_kv<relokv::pre_rotated>(rope, wide, 0, 0, 0, k.data(), k.data()),
                  relokv::error);
  CHECK_THROWS_AS(relokv::relocate_block(rope, wide, 0, 1, 5, 1), relokv::error);
  CHECK_THROWS_AS(relokv::relocate_block(rope, st.layer(0), 0, 4, 5, 16), relokv::error);
  CHECK_THROWS_AS(relokv::relocate_block(rope, st.layer(0), 0, 1, 5, 17), relokv::error);
  CHECK_THROWS_AS(st.copy_block(0, 9), relokv::error);
  // A shape whose element count overflows 64 bits, or whose head_dim no kernel takes.
  CHECK_THROWS_AS(
      relokv::host_kv_storage<float>(relokv::kv_shape{1 << 30, 1 << 30, 1 << 30, 1 << 12, 1 << 10}),
      relokv::error);
  CHECK_THROWS_AS(relokv::host_kv_storage<float>(relokv::kv_shape{1, 1, 1, 16, 2048}),
                  relokv::error);
  // A block table naming a block beyond the storage, or a length beyond the block.
  const relokv::pos_t m = 40;
  const std::int32_t indptr[2] = {0, 2};
  for (const relokv::block_entry bad :
       {relokv::block_entry{4, 16, 16}, relokv::block_entry{-1, 16, 16},
        relokv::block_entry{1, 16, 17}}) {
    const relokv::block_entry table[2] = {{0, 0, 16}, bad};
    CHECK_THROWS_AS(relokv::decode_attention<relokv::at_attention>(
                        rope, st.layer(0), {table, indptr, 1}, q.data(), &m, 4, 1.0f, out.data()),
                    relokv::error);
    const relokv::pos_t qp[1] = {m};
    const std::int32_t qi[2] = {0, 1};
    CHECK_THROWS_AS(
        relokv::prefill_attention<relokv::at_attention>(rope, st.layer(0), {table, indptr, 1},
                                                        q.data(), qp, qi, 4, 1.0f, out.data()),
        relokv::error);
  }
}

TEST_CASE("attention: params struct, can_implement and the positional overloads agree",
          "[attention]") {
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = 64;
  const relokv::rope_table rope(cfg, 64);
  relokv::host_kv_storage<float> st(relokv::kv_shape{1, 4, 2, 16, 64});
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (relokv::block_id b = 0; b < 4; ++b)
    for (std::int32_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < st.layer(0).tile_elems(); ++i) {
        st.layer(0).k(b, h)[i] = nd(rng);
        st.layer(0).v(b, h)[i] = nd(rng);
      }
  const relokv::block_entry table[2] = {{2, 0, 16}, {0, 16, 9}};
  const std::int32_t indptr[2] = {0, 2};
  std::vector<float> q(3 * 4 * 64), out_a(q.size()), out_b(q.size());
  for (auto& x : q) x = nd(rng);
  const relokv::pos_t qp[3] = {3, 17, 24};
  const std::int32_t qi[2] = {0, 3};

  relokv::attention_params<float> p;
  p.rope = &rope;
  p.kv = st.layer(0);
  p.table = {table, indptr, 1};
  p.q = q.data();
  p.q_pos = qp;
  p.q_indptr = qi;
  p.num_tokens = 3;
  p.num_q_heads = 4;
  p.scale = 0.125f;
  p.out = out_a.data();
  REQUIRE(relokv::can_implement(p));
  relokv::paged_attention<relokv::block_relative>(p);
  relokv::prefill_attention<relokv::block_relative>(rope, st.layer(0), {table, indptr, 1}, q.data(),
                                                    qp, qi, 4, 0.125f, out_b.data());
  CHECK(out_a == out_b);

  // Decode through the params: q_indptr null, one token per sequence.
  auto d = p;
  d.q_indptr = nullptr;
  d.num_tokens = 1;
  d.q_pos = qp + 2;
  REQUIRE(relokv::can_implement(d));
  relokv::paged_attention<relokv::block_relative>(d);
  relokv::decode_attention<relokv::block_relative>(rope, st.layer(0), {table, indptr, 1}, q.data(),
                                                   qp + 2, 4, 0.125f, out_b.data());
  CHECK(std::equal(out_a.begin(), out_a.begin() + 4 * 64, out_b.begin()));

  // Every check says why, and paged_attention throws it before writing anything.
  const auto reason = [](const relokv::attention_params<float>& bad) {
    const auto s = relokv::can_implement(bad);
    CHECK_FALSE(s.ok);
    return s.reason;
  };
  using Catch::Matchers::Contains;
  auto bad = p;
  bad.rope = nullptr;
  CHECK_THAT(reason(bad), Contains("null rope"));
  bad = p;
  bad.num_tokens = 4;  // q_indptr ends at 3
  CHECK_THAT(reason(bad), Contains("q_indptr ends at 3"));
  bad = d;
  bad.num_tokens = 2;  // decode: one token per sequence
  CHECK_THAT(reason(bad), Contains("one query per sequence"));
  bad = p;
  bad.q = nullptr;
  CHECK_THAT(reason(bad), Contains("null q"));
  bad = p;
  const std::int32_t backwards[2] = {0, -1};
  bad.q_indptr = backwards;
  CHECK_THAT(reason(bad), Contains("q_indptr decreases"));
  bad = p;
  bad.heads = {3, 5};
  CHECK_THAT(reason(bad), Contains("kv_head_range"));
  bad = p;
  bad.num_q_heads = 3;
  CHECK_THAT(reason(bad), Contains("multiple of num_kv_heads"));
  const relokv::block_entry beyond[2] = {{2, 0, 16}, {4, 16, 9}};
  bad = p;
  bad.table = {beyond, indptr, 1};
  CHECK_THAT(reason(bad), Contains("entry 1 {block 4"));
  std::fill(out_a.begin(), out_a.end(), -7.0f);
  bad.out = out_a.data();
  CHECK_THROWS_AS(relokv::paged_attention<relokv::block_relative>(bad), relokv::error);
  CHECK(std::all_of(out_a.begin(), out_a.end(), [](float x) { return x == -7.0f; }));
}

TEMPLATE_TEST_CASE("attention: bf16 prefill on AMX tiles agrees with the fp32 kernels",
                   "[attention]", relokv::pre_rotated, relokv::at_attention,
                   relokv::block_relative) {
  // The same bf16 blocks (unused slots NaN) through the AMX kernels and, switched off, through
  // the fp32 group kernel: both read the stored bf16 exactly, so they differ only by the
  // tiles' hi + lo splits (~2^-16 a product) and summation order, far inside bf16's 6e-2.
  // 37 queries at scattered positions: two tiles of 16 rows and one of 5; GQA 6 / 2; block
  // sizes 16 and 32 (two key tiles a block); head dims 64 and 128 (two passes of 64).
  using relokv::detail::amx::switched_on;
  INFO("AMX " << (relokv::detail::amx::enabled() ? "on" : "not on this host or build"));
  const auto run = [](int head_dim, int block_size, relokv::rope_layout layout) {
    std::mt19937 rng(29);
    const auto cfg = config(layout, head_dim);
    const relokv::rope_table rope(cfg, 512);
    relokv::host_kv_storage<relokv::bf16> st(relokv::kv_shape{1, 8, 2, block_size, head_dim});
    for (std::size_t i = 0; i < st.shape().total_elems(); ++i)
      st.data()[i] = relokv::bf16::from_float(std::numeric_limits<float>::quiet_NaN());
    std::vector<oracle::key_token> keys;
    std::vector<block_entry> entries;
    const int end =
        block_size == 16
            ? back_to_back<TestType>(rope, st, {16, 9, 16, 13, 16, 16}, rng, keys, entries)
            : back_to_back<TestType>(rope, st, {32, 21, 32}, rng, keys, entries);
    std::vector<relokv::pos_t> qpos;
    for (int t = 0; t < 37; ++t) qpos.push_back((t * 41 + 3) % end);
    const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(entries.size())};
    const std::int32_t qind[2] = {0, 37};
    auto q = randn(37 * 6 * static_cast<std::size_t>(head_dim), rng);
    q[7] = 40.0f;  // a large score: the two passes' maximum must hold it
    std::vector<float> amx(q.size()), f32(q.size());
    const relokv::paged_kv_view<const relokv::bf16> kv(st.layer(0));
    relokv::prefill_attention<TestType>(rope, kv, {entries.data(), indptr, 1}, q.data(),
                                        qpos.data(), qind, 6, 0.1f, amx.data());
    switched_on().store(false);
    relokv::prefill_attention<TestType>(rope, kv, {entries.data(), indptr, 1}, q.data(),
                                        qpos.data(), qind, 6, 0.1f, f32.data());
    switched_on().store(true);
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < amx.size(); ++i) {
      REQUIRE(std::isfinite(amx[i]));
      err = std::max(err, double(std::fabs(amx[i] - f32[i])));
      scale = std::max(scale, double(std::fabs(f32[i])));
    }
    INFO("head_dim " << head_dim << " block " << block_size << " layout " << int(layout)
                     << ": max difference over max |out| " << err / scale);
    CHECK(err / scale < 2e-5);
  };
  for (int head_dim : {64, 128})
    for (int block_size : {16, 32}) run(head_dim, block_size, relokv::rope_layout::kNeoX);
  run(64, 16, relokv::rope_layout::kGPTJ);
}
