// [gpu] tests: every CUDA kernel against its host oracle on random inputs. Without a CUDA
// device the binary prints why and exits with 77, which ctest reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <relokv/attention/grouped.hpp>
#include <relokv/attention/host_attention.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "device_kernels.hpp"
#include "support/catch.hpp"
#include "support/test_data.hpp"

namespace {

using relokv_test::randn;

template <class T>
std::vector<float> as_floats(const std::vector<std::uint8_t>& bytes) {
  std::vector<float> f(bytes.size() / sizeof(T));
  for (std::size_t i = 0; i < f.size(); ++i) {
    T x;
    std::memcpy(&x, bytes.data() + i * sizeof(T), sizeof(T));
    f[i] = relokv::to_f32(x);
  }
  return f;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, s = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    e = std::max(e, double(std::fabs(a[i] - b[i])));
    s = std::max(s, double(std::fabs(b[i])));
  }
  return e / s;
}

/// Host pool written at original positions, read through a table that relocates its blocks.
/// `scaled`: YaRN (a magnitude on cos and sin), GPT-J pairs, half the dimensions rotated.
template <class P, class T>
void attention_case(int head_dim, int block_size, bool prefill, int heads, bool scaled = false,
                    std::int32_t window = 0) {
  INFO("head_dim " << head_dim << ", block " << block_size << ", heads " << heads
                   << (scaled ? ", YaRN, GPT-J, half rotated" : "") << ", window " << window);
  std::mt19937 rng(17);
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = head_dim;
  if (scaled) {
    cfg.rotary_dim = head_dim / 2;
    cfg.layout = relokv::rope_layout::kGPTJ;
    cfg.scaling = relokv::rope_scaling::kYaRN;
    cfg.factor = 4.0;
    cfg.original_max_position = 256;
  }
  const relokv::rope_table rope(cfg, 4096);
  const relokv::kv_shape shape{1, 16, 2, block_size, head_dim};
  relokv::host_kv_storage<T> pool(shape);
  for (int b = 0; b < 6; ++b)
    for (int j = 0; j < block_size; ++j) {
      const auto k = randn(static_cast<std::size_t>(2 * head_dim), rng);
      const auto v = randn(k.size(), rng);
      relokv::append_kv<P>(rope, pool.layer(0), b, j, 500 + b * block_size + j, k.data(), v.data());
    }
  // Two sequences; sequence 1 reads block 2 at a different position than sequence 0.
  std::vector<relokv::block_entry> entries = {{3, 0, block_size},
                                              {2, block_size, block_size - 3},
                                              {5, 2 * block_size - 3, block_size},
                                              {2, 0, block_size},
                                              {0, block_size, block_size}};
  if constexpr (P::relocation_rotates_keys) {  // pre_rotated reads delta-rotated copies
    for (std::size_t i = 0; i < entries.size(); ++i) {
      auto& e = entries[i];
      const relokv::block_id copy = 8 + static_cast<relokv::block_id>(i);
      relokv::relocate_block(rope, pool.layer(0), e.block, copy,
                             e.pos0 - (500 + e.block * block_size), block_size);
      e.block = copy;
    }
  }
  const std::vector<std::int32_t> indptr = {0, 3, 5};
  relokv_test::device_attention_args a;
  a.placement = P::kind;
  a.type = relokv::dtype_of_v<T>;
  a.rope = cfg;
  a.shape = shape;
  a.pool.resize(pool.bytes());
  std::memcpy(a.pool.data(), pool.data(), pool.bytes());
  a.entries = entries;
  a.indptr = indptr;
  a.num_q_heads = heads;
  a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  a.window = window;
  const relokv::block_table_view table{entries.data(), indptr.data(), 2};
  std::vector<float> want, want_lse;
  if (prefill) {
    a.q_pos = {0, 5, 2 * block_size, 3 * block_size - 4, 3, 2 * block_size - 1};  // scattered
    a.q_indptr = {0, 4, 6};
  } else {
    a.q_pos = {3 * block_size - 4, 2 * block_size - 1};
  }
  a.q = randn(a.q_pos.size() * static_cast<std::size_t>(heads) * static_cast<std::size_t>(head_dim),
              rng);
  want.resize(a.q.size());
  want_lse.resize(a.q_pos.size() * static_cast<std::size_t>(heads));
  // The host kernel (itself checked against the fp64 oracle, windows included) is the oracle.
  relokv::attention_params<T> hp;
  hp.rope = &rope;
  hp.kv = relokv::paged_kv_view<const T>(pool.layer(0));
  hp.table = table;
  hp.q = a.q.data();
  hp.q_pos = a.q_pos.data();
  hp.q_indptr = prefill ? a.q_indptr.data() : nullptr;
  hp.num_tokens = static_cast<std::int32_t>(a.q_pos.size());
  hp.num_q_heads = heads;
  hp.scale = a.scale;
  hp.out = want.data();
  hp.lse = want_lse.data();
  hp.window = window;
  relokv::paged_attention<P>(hp);
  // One CTA per (token, KV head); split over the blocks as the kernel chooses; three splits
  // (a sequence of two entries leaves one split empty, which the merge must ignore); 200
  // splits, more than a merge CTA has threads, nearly all of them empty.
  for (const std::int32_t splits : {-1, 0, 3, 200}) {
    INFO("num_splits " << splits);
    a.num_splits = splits;
    std::vector<float> got_lse;
    const auto got = relokv_test::device_attention(a, &got_lse);
    CHECK(rel_err(got, want) < 1e-4);
    // Log-sum-exps: the host's bf16 path rounds queries and weights (see the host tests'
    // tolerances); the scores here are O(1), so an absolute bound.
    REQUIRE(got_lse.size() == want_lse.size());
    for (std::size_t i = 0; i < got_lse.size(); ++i) {
      INFO("row " << i);
      if (std::isinf(want_lse[i])) {  // no visible key
        CHECK(got_lse[i] == want_lse[i]);
        continue;
      }
      CHECK(std::fabs(got_lse[i] - want_lse[i]) < 2e-2f * std::max(1.0f, std::fabs(want_lse[i])));
    }
  }
}

template <class P>
void placement_cases() {
  for (bool prefill : {false, true}) {
    INFO("prefill " << prefill);
    // GQA groups 4, 4, 7, 1, 3 and 2 over two KV heads: every group width the kernel has (1,
    // 2, 4, 8; 3 and 7 rounded up, with masked query heads).
    attention_case<P, relokv::bf16>(128, 16, prefill, 8);
    attention_case<P, relokv::fp16>(64, 32, prefill, 8);
    attention_case<P, relokv::bf16>(128, 32, prefill, 14);
    attention_case<P, relokv::fp16>(64, 16, prefill, 2);
    attention_case<P, relokv::bf16>(64, 16, prefill, 6);
    attention_case<P, relokv::bf16>(128, 16, prefill, 4);
    attention_case<P, relokv::bf16>(128, 16, prefill, 8, true);
    attention_case<P, relokv::fp16>(64, 32, prefill, 2, true);
    // Sliding windows: one that cuts a block, a span and the relocated block 2, a
    // block-aligned one, and one that leaves some queries no key of a block at all.
    attention_case<P, relokv::bf16>(128, 16, prefill, 8, false, 21);
    attention_case<P, relokv::bf16>(256, 16, prefill, 4, false, 16);
    attention_case<P, relokv::fp16>(64, 32, prefill, 2, true, 5);
  }
}

}  // namespace

TEST_CASE("cuda: paged attention matches the host kernel", "[gpu]") {
  SECTION("pre_rotated") { placement_cases<relokv::pre_rotated>(); }
  SECTION("at_attention") { placement_cases<relokv::at_attention>(); }
  SECTION("block_relative") { placement_cases<relokv::block_relative>(); }
}

TEST_CASE("cuda: APE's grouped attention matches the host form", "[gpu]") {
  using P = relokv::block_relative;
  using T = relokv::bf16;
  std::mt19937 rng(23);
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = 64;
  const relokv::rope_table rope(cfg, 4096);
  const relokv::kv_shape shape{1, 8, 2, 16, 64};
  relokv::host_kv_storage<T> pool(shape);
  std::vector<relokv::block_entry> entries;
  for (int b = 0; b < 5; ++b) {
    for (int j = 0; j < 16; ++j) {
      const auto k = randn(128, rng), v = randn(128, rng);
      relokv::append_kv<P>(rope, pool.layer(0), b, j, 16 * b + j, k.data(), v.data());
    }
    entries.push_back({b, 16 * b, 16});
  }
  const std::vector<relokv::attention_group> groups = {
      {0, 1, 1.0f, 1.0f}, {1, 3, 0.8f, 1.2f}, {4, 1, 1.0f, 1.0f}};
  for (bool prefill : {false, true}) {
    INFO("prefill " << prefill);
    relokv_test::device_attention_args a;
    a.placement = P::kind;
    a.type = relokv::dtype_of_v<T>;
    a.rope = cfg;
    a.shape = shape;
    a.pool.resize(pool.bytes());
    std::memcpy(a.pool.data(), pool.data(), pool.bytes());
    a.entries = entries;
    a.indptr = {0, 5};
    a.num_q_heads = 4;
    a.scale = 0.125f;
    a.q_pos = prefill ? std::vector<relokv::pos_t>{66, 70, 79} : std::vector<relokv::pos_t>{79};
    if (prefill) a.q_indptr = {0, 3};
    a.q = randn(a.q_pos.size() * 4 * 64, rng);
    std::vector<float> want(a.q.size());
    relokv::attention_params<T> h;
    h.rope = &rope;
    h.kv = relokv::paged_kv_view<const T>(pool.layer(0));
    h.table = {entries.data(), a.indptr.data(), 1};
    h.q = a.q.data();
    h.q_pos = a.q_pos.data();
    h.q_indptr = prefill ? a.q_indptr.data() : nullptr;
    h.num_tokens = static_cast<std::int32_t>(a.q_pos.size());
    h.num_q_heads = 4;
    h.scale = a.scale;
    h.out = want.data();
    relokv::grouped_attention<P>(h, groups);
    CHECK(rel_err(relokv_test::device_grouped_attention(a, groups), want) < 1e-4);
  }
}

TEST_CASE("cuda: unsupported shapes are rejected with a reason", "[gpu]") {
  relokv_test::device_attention_args a;
  a.rope.head_dim = a.rope.rotary_dim = 96;
  a.shape = relokv::kv_shape{1, 1, 1, 16, 96};
  a.pool.resize(a.shape.layer_elems() * 2);
  a.indptr = {0, 0};
  a.q_pos = {0};
  a.q.resize(96);
  a.num_q_heads = 1;
  CHECK_THROWS_WITH(relokv_test::device_attention(a), Catch::Contains("head_dim: 96"));
  a.rope.head_dim = a.rope.rotary_dim = 128;
  a.shape = relokv::kv_shape{1, 1, 1, 16, 128};
  a.pool.resize(a.shape.layer_elems() * 2);
  a.q.resize(128);
  a.num_splits = relokv_test::max_splits() + 1;
  CHECK_THROWS_WITH(relokv_test::device_attention(a), Catch::Contains("num_splits"));
}

TEST_CASE("cuda: kv-append, relocation and copies match the host", "[gpu]") {
  std::mt19937 rng(3);
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = 64;
  const relokv::rope_table rope(cfg, 4096);
  const relokv::kv_shape shape{1, 4, 2, 16, 64};
  const std::vector<relokv::block_id> blocks = {0, 0, 1, 3};
  const std::vector<std::int32_t> slots = {0, 5, 15, 7};
  const std::vector<relokv::pos_t> pos = {0, 5, 1000, 37};
  const auto k = randn(4 * 2 * 64, rng), v = randn(4 * 2 * 64, rng);
  for (auto kind : {relokv::placement_kind::kPreRotated, relokv::placement_kind::kAtAttention,
                    relokv::placement_kind::kBlockRelative}) {
    relokv::host_kv_storage<relokv::bf16> host(shape);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const float* ki = k.data() + i * 128;
      const float* vi = v.data() + i * 128;
      if (kind == relokv::placement_kind::kPreRotated)
        relokv::append_kv<relokv::pre_rotated>(rope, host.layer(0), blocks[i], slots[i], pos[i], ki,
                                               vi);
      else if (kind == relokv::placement_kind::kAtAttention)
        relokv::append_kv<relokv::at_attention>(rope, host.layer(0), blocks[i], slots[i], pos[i],
                                                ki, vi);
      else
        relokv::append_kv<relokv::block_relative>(rope, host.layer(0), blocks[i], slots[i], pos[i],
                                                  ki, vi);
    }
    const auto dev = relokv_test::device_append(kind, relokv::dtype::kBF16, cfg, shape, k, v,
                                                blocks, slots, pos);
    std::vector<std::uint8_t> hb(host.bytes());
    std::memcpy(hb.data(), host.data(), host.bytes());
    CHECK(rel_err(as_floats<relokv::bf16>(dev), as_floats<relokv::bf16>(hb)) < 1e-2);

    const std::vector<relokv::block_copy> copies = {{0, 2, 0, 300}, {1, 3, 16, 7}};
    auto host_rel = host;
    for (const auto& c : copies)
      relokv::relocate_block(rope, host_rel.layer(0), c.src, c.dst, c.dst_pos0 - c.src_pos0, 16);
    std::vector<std::uint8_t> hr(host_rel.bytes());
    std::memcpy(hr.data(), host_rel.data(), host_rel.bytes());
    const auto dr = relokv_test::device_copies(relokv::dtype::kBF16, cfg, shape, hb, copies, true);
    CHECK(rel_err(as_floats<relokv::bf16>(dr), as_floats<relokv::bf16>(hr)) < 1e-2);
    auto host_copy = host;
    for (const auto& c : copies) host_copy.copy_block(c.src, c.dst);
    const auto dc = relokv_test::device_copies(relokv::dtype::kBF16, cfg, shape, hb, copies, false);
    CHECK(std::memcmp(dc.data(), host_copy.data(), host_copy.bytes()) == 0);
  }
}

TEST_CASE("cuda: deviation and top-k match the host", "[gpu]") {
  std::mt19937 rng(5);
  const int n = 300, width = 256;
  const auto fk = randn(static_cast<std::size_t>(n * width), rng);
  const auto fv = randn(fk.size(), rng);
  std::vector<relokv::bf16> ck(fk.size()), cv(fk.size());
  for (std::size_t i = 0; i < fk.size(); ++i) {
    ck[i] = relokv::bf16::from_float(fk[i] + 0.1f * static_cast<float>(i % 7));
    cv[i] = relokv::bf16::from_float(fv[i]);
  }
  for (auto metric : {relokv::deviation_metric::kL2, relokv::deviation_metric::kCosine}) {
    std::vector<float> want(static_cast<std::size_t>(n));
    relokv::token_deviation(metric, ck.data(), cv.data(), fk.data(), fv.data(), n, width,
                            want.data());
    CHECK(rel_err(relokv_test::device_deviation(metric, ck, cv, fk, fv, n, width), want) < 1e-4);
  }
  std::vector<float> score(1000);
  std::vector<std::uint8_t> eligible(1000);
  for (std::size_t i = 0; i < score.size(); ++i) {
    score[i] = static_cast<float>(rng() % 50);  // many ties
    eligible[i] = (i % 3) != 0;
  }
  std::vector<std::uint8_t> want(1000, 0);
  relokv::select_topk(score, eligible, 77, want);
  CHECK(relokv_test::device_topk(score, eligible, 77) == want);
  // NaN deviations rank first on the device as on the host.
  for (std::size_t i : {5u, 100u, 101u, 640u}) score[i] = std::numeric_limits<float>::quiet_NaN();
  score[333] = -std::numeric_limits<float>::quiet_NaN();
  std::fill(want.begin(), want.end(), std::uint8_t{0});
  relokv::select_topk(score, eligible, 77, want);
  CHECK(relokv_test::device_topk(score, eligible, 77) == want);
}

int main(int argc, char** argv) {
  std::string why;
  if (relokv_test::cuda_device_count(why) <= 0) {
    std::printf("SKIPPED: no CUDA device (%s): the [gpu] tests did not run\n", why.c_str());
    return 77;
  }
  std::printf("CUDA: %s\n", why.c_str());
  return Catch::Session().run(argc, argv);
}
