// Sliding-window attention (attention_params::window) against the fp64 oracle: windows that cut
// a block, a span and a relocated span, on every host path (portable, SIMD fp32, bf16), every
// placement and storage type, decode and prefill.
#include <relokv/attention/host_attention.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/attention_oracle.hpp"
#include "support/catch.hpp"
#include "support/test_data.hpp"

namespace {

using relokv::block_entry;
using relokv_test::randn;

template <class T>
double tolerance() {  // as host_attention_test.cpp derives them
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  if constexpr (std::is_same_v<T, relokv::bf16>) return 6e-2;
  return 4e-3;
}

double max_err(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]))
      return std::numeric_limits<double>::infinity();  // std::max drops NaN
    err = std::max(err, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return err / scale;
}

/// A request of relocated spans: three "documents" computed elsewhere (at positions 500..,
/// 900.., 1300..) in blocks of `bs` (their last block padded short), read back in another order
/// at new positions with a gap of 3 unfilled positions before the last one (a separator that
/// holds no key), then a suffix computed in place. The oracle's keys are at their new positions.
template <class P, class T>
struct windowed_request {
  relokv::rope_config cfg;
  relokv::rope_table rope;
  relokv::host_kv_storage<T> st;
  std::vector<oracle::key_token> keys;
  std::vector<block_entry> table;
  int end = 0;

  windowed_request(int head_dim, int bs, int kv_heads, std::mt19937& rng)
      : cfg(make_config(head_dim)),
        rope(cfg, 4096),
        st(relokv::kv_shape{1, 64, kv_heads, bs, head_dim}) {
    for (std::size_t i = 0; i < st.shape().total_elems(); ++i)  // unused slots: NaN
      st.data()[i] = relokv::from_f32<T>(std::numeric_limits<float>::quiet_NaN());
    const int D = head_dim, H = kv_heads;
    relokv::block_id next = 0;
    // doc d: its token count and where it was computed
    const int doc_len[3] = {2 * bs + 5, bs + 3, 3 * bs};
    const int orig[3] = {500, 900, 1300};
    std::vector<std::vector<block_entry>> doc_blocks(3);
    std::vector<std::vector<oracle::key_token>> doc_tokens(3);
    for (int d = 0; d < 3; ++d) {
      for (int t0 = 0; t0 < doc_len[d]; t0 += bs) {
        const int len = std::min(bs, doc_len[d] - t0);
        const relokv::block_id b = next++;
        for (int j = 0; j < len; ++j) {
          oracle::key_token t{};
          t.k = randn(static_cast<std::size_t>(H * D), rng);
          t.v = randn(static_cast<std::size_t>(H * D), rng);
          relokv::append_kv<P>(rope, st.layer(0), b, j, orig[d] + t0 + j, t.k.data(), t.v.data());
          doc_tokens[static_cast<std::size_t>(d)].push_back(std::move(t));
        }
        doc_blocks[static_cast<std::size_t>(d)].push_back({b, orig[d] + t0, len});
      }
    }
    // Read as doc 2, doc 0, (gap of 3), doc 1, then a suffix of bs + 2 tokens computed here.
    int pos = 0;
    for (int d : {2, 0, 1}) {
      if (d == 1) pos += 3;
      int t = 0;
      for (const block_entry& src : doc_blocks[static_cast<std::size_t>(d)]) {
        relokv::block_id b = src.block;
        if constexpr (P::relocation_rotates_keys) {  // a private, delta-rotated copy
          const relokv::block_id copy = next++;
          relokv::relocate_block(rope, st.layer(0), b, copy, pos - src.pos0, bs);
          b = copy;
        }
        table.push_back({b, pos, src.len});
        for (int j = 0; j < src.len; ++j, ++t) {
          auto k = doc_tokens[static_cast<std::size_t>(d)][static_cast<std::size_t>(t)];
          k.pos = pos + j;
          keys.push_back(std::move(k));
        }
        pos += src.len;
      }
    }
    for (int t0 = 0; t0 < bs + 2; t0 += bs) {
      const int len = std::min(bs, bs + 2 - t0);
      const relokv::block_id b = next++;
      for (int j = 0; j < len; ++j) {
        oracle::key_token t{};
        t.k = randn(static_cast<std::size_t>(H * D), rng);
        t.v = randn(static_cast<std::size_t>(H * D), rng);
        relokv::append_kv<P>(rope, st.layer(0), b, j, pos + j, t.k.data(), t.v.data());
        t.pos = pos + j;
        keys.push_back(std::move(t));
      }
      table.push_back({b, pos, len});
      pos += len;
    }
    end = pos;
  }
  static relokv::rope_config make_config(int head_dim) {
    relokv::rope_config c;
    c.head_dim = c.rotary_dim = head_dim;
    c.theta = 10000.0;
    return c;
  }
};

/// Every query position of the request (prefill) or a few (decode), under each window.
template <class P, class T>
void window_case(int head_dim, int bs, int q_heads, int kv_heads) {
  std::mt19937 rng(static_cast<unsigned>(head_dim * 31 + bs));
  windowed_request<P, T> r(head_dim, bs, kv_heads, rng);
  const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(r.table.size())};
  const relokv::block_table_view view{r.table.data(), indptr, 1};
  const auto kv = relokv::paged_kv_view<const T>(r.st.layer(0));
  const auto row = static_cast<std::size_t>(q_heads * head_dim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // 1: only the query's own key; bs - 3 and bs + 5: cut inside a block; 2 bs: block-aligned;
  // 40: cuts a span and the separator; far: no cut at all.
  for (const int window : {1, bs - 3, bs + 5, 2 * bs, 40, 100000}) {
    std::vector<relokv::pos_t> qpos;
    for (int m = 0; m < r.end; ++m) qpos.push_back(m);
    const auto n = static_cast<std::int32_t>(qpos.size());
    const auto q = randn(static_cast<std::size_t>(n) * row, rng);
    std::vector<float> out(q.size()), lse(static_cast<std::size_t>(n * q_heads));
    const std::int32_t qind[2] = {0, n};
    relokv::attention_params<T> p;
    p.rope = &r.rope;
    p.kv = kv;
    p.table = view;
    p.q = q.data();
    p.q_pos = qpos.data();
    p.q_indptr = qind;
    p.num_tokens = n;
    p.num_q_heads = q_heads;
    p.scale = scale;
    p.out = out.data();
    p.lse = lse.data();
    p.window = window;
    relokv::paged_attention<P>(p);
    double worst = 0;
    for (int t = 0; t < n; ++t) {
      const std::vector<float> qs(q.begin() + static_cast<std::ptrdiff_t>(t * row),
                                  q.begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
      const std::vector<float> got(out.begin() + static_cast<std::ptrdiff_t>(t * row),
                                   out.begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
      std::vector<double> want_lse;
      const auto want = oracle::attend(r.cfg, r.keys, qs, qpos[static_cast<std::size_t>(t)],
                                       q_heads, kv_heads, scale, &want_lse, window);
      if (std::isinf(want_lse[0])) {  // the window holds no key (a separator position)
        CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == 0.0f; }));
        CHECK(std::isinf(lse[static_cast<std::size_t>(t * q_heads)]));
        continue;
      }
      worst = std::max(worst, max_err(got, want));
    }
    INFO("head_dim " << head_dim << " block " << bs << " window " << window);
    CHECK(worst < tolerance<T>());
    // Decode: one query per call at a few positions, the same window.
    for (const relokv::pos_t m : {r.end - 1, r.end / 2, 2 * bs + 1}) {
      const auto qd = randn(row, rng);
      std::vector<float> od(row);
      relokv::attention_params<T> d = p;
      d.q = qd.data();
      d.q_pos = &m;
      d.q_indptr = nullptr;
      d.num_tokens = 1;
      d.out = od.data();
      d.lse = nullptr;
      relokv::paged_attention<P>(d);
      INFO("decode at " << m);
      CHECK(max_err(od, oracle::attend(r.cfg, r.keys, qd, m, q_heads, kv_heads, scale, nullptr,
                                       window)) < tolerance<T>());
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("attention: a sliding window by logical position agrees with the oracle",
                   "[attention][window]", relokv::pre_rotated, relokv::at_attention,
                   relokv::block_relative) {
  // SIMD paths (head_dim 64 and Gemma 3's 256 with one KV head, blocks of 16 and 32) and the
  // portable one (head_dim 32, blocks of 8), each storage type.
  SECTION("fp32, GQA, head_dim 64, blocks of 16") { window_case<TestType, float>(64, 16, 4, 2); }
  SECTION("bf16, GQA, head_dim 64, blocks of 32") {
    window_case<TestType, relokv::bf16>(64, 32, 4, 2);
  }
  SECTION("bf16, MQA, head_dim 256 (Gemma 3)") {
    window_case<TestType, relokv::bf16>(256, 16, 4, 1);
  }
  SECTION("fp16, head_dim 128") { window_case<TestType, relokv::fp16>(128, 16, 2, 2); }
  SECTION("fp32, portable path (head_dim 32, blocks of 8)") {
    window_case<TestType, float>(32, 8, 2, 1);
  }
}

TEST_CASE("attention: a window wider than the request changes no bit of prefill",
          "[attention][window]") {
  std::mt19937 rng(3);
  windowed_request<relokv::at_attention, relokv::bf16> r(128, 16, 2, rng);
  const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(r.table.size())};
  std::vector<relokv::pos_t> qpos;
  for (int m = 0; m < r.end; m += 3) qpos.push_back(m);
  const auto n = static_cast<std::int32_t>(qpos.size());
  const auto q = randn(static_cast<std::size_t>(n) * 4 * 128, rng);
  std::vector<float> a(q.size()), b(q.size());
  const std::int32_t qind[2] = {0, n};
  relokv::attention_params<relokv::bf16> p;
  p.rope = &r.rope;
  p.kv = relokv::paged_kv_view<const relokv::bf16>(r.st.layer(0));
  p.table = {r.table.data(), indptr, 1};
  p.q = q.data();
  p.q_pos = qpos.data();
  p.q_indptr = qind;
  p.num_tokens = n;
  p.num_q_heads = 4;
  p.scale = 0.09f;
  p.out = a.data();
  relokv::paged_attention<relokv::at_attention>(p);
  p.out = b.data();
  p.window = r.end + 1;
  relokv::paged_attention<relokv::at_attention>(p);
  CHECK(a == b);
}

TEST_CASE("attention: a negative window is refused and nothing is written", "[attention][window]") {
  std::mt19937 rng(4);
  windowed_request<relokv::pre_rotated, float> r(64, 16, 1, rng);
  const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(r.table.size())};
  const relokv::pos_t m = 10;
  const auto q = randn(64, rng);
  std::vector<float> out(64, 7.0f);
  relokv::attention_params<float> p;
  p.rope = &r.rope;
  p.kv = relokv::paged_kv_view<const float>(r.st.layer(0));
  p.table = {r.table.data(), indptr, 1};
  p.q = q.data();
  p.q_pos = &m;
  p.num_tokens = 1;
  p.num_q_heads = 1;
  p.out = out.data();
  p.window = -4;
  CHECK_FALSE(relokv::can_implement(p));
  CHECK_THROWS_WITH(relokv::paged_attention<relokv::pre_rotated>(p),
                    Catch::Contains("window must be 0 (none) or positive"));
  CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
}
