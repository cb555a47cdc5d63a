#pragma once
// The engine's attention calls on its two lanes (forward.cpp's layer loop): the lane split of a
// prefill or decode call with APE's grouped rows, and question_topk's probe of the attention
// each key receives.
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include <relokv/attention/attention_mass.hpp>
#include <relokv/attention/grouped.hpp>
#include <relokv/attention/params.hpp>
#include <relokv/attention/state.hpp>
#include <relokv/layout/request_layout.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/rope/rotate.hpp>

#include "lanes.hpp"

namespace relokv_engine::detail {

/// Attention of `call`'s queries (its q, q_pos, num_tokens, num_q_heads, scale and out set on
/// top of the request's part: relokv::request_kv::attention) on the two lanes; q_indptr, lse
/// and heads are this function's. A prefill's queries are independent, so many are cut where
/// the causal work (each query's visible positions) is halved, and a few split the KV heads.
/// Decode's one query splits the keys instead: each lane attends over half of the blocks, and
/// the two states are merged by their log-sum-exp. No prefill row's result depends on the rows
/// computed with it, so an exact hit is exact (one prefill row alone takes the prefill kernels
/// too: `decode` says which call this is). `groups`: APE's reader rows (positions from
/// query_start on) attend by groups.
template <class P, class T>
void attention(const relokv::attention_params<T>& call, bool decode,
               const std::array<relokv::attention_group, 3>* groups = nullptr,
               std::int32_t query_start = 0) {
  const relokv::paged_kv_view<const T>& kv = call.kv;
  const relokv::block_table_view view = call.table;
  const float* q = call.q;
  const std::int32_t* pos = call.q_pos;
  const int n = call.num_tokens, num_q_heads = call.num_q_heads;
  float* out = call.out;
  const std::size_t row = static_cast<std::size_t>(num_q_heads) * kv.head_dim;
  // The call over rows [begin, end) into o (lse: their log-sum-exp) on `v`'s blocks.
  const auto rows_call = [&](relokv::block_table_view v, int begin, int end, float* o, float* lse,
                             relokv::kv_head_range heads, const std::int32_t* qind) {
    relokv::attention_params<T> p = call;
    p.table = v;
    p.q = q + static_cast<std::size_t>(begin) * row;
    p.q_pos = pos + begin;
    // Decode's one query takes the decode kernels (bf16 spans); a prefill row takes prefill's
    // groups even alone (a prompt's last chunk, an exact hit's one row), as it does among many.
    p.q_indptr = decode ? nullptr : qind;
    p.num_tokens = end - begin;
    p.out = o + static_cast<std::size_t>(begin) * row;
    p.lse = lse;
    p.heads = heads;
    return p;
  };
  if (groups != nullptr && n > 0 && pos[n - 1] >= query_start) {
    // APE: the reader's rows (a suffix: positions ascend) attend by groups; rows before
    // them plainly. Few rows: the KV heads split between the lanes.
    int i0 = 0;
    while (pos[i0] < query_start) ++i0;
    if (i0 > 0) {
      relokv::attention_params<T> before = call;
      before.num_tokens = i0;
      attention<P>(before, decode);
    }
    const std::int32_t qind[2] = {0, n - i0};
    const auto grouped = [&](relokv::kv_head_range heads) {
      relokv::grouped_attention<P>(rows_call(view, i0, n, out, nullptr, heads, qind), *groups);
    };
    if (lanes::get().two() && kv.num_kv_heads >= 2) {
      const std::int32_t mid = kv.num_kv_heads / 2;
      lanes::get().run([&](int lane) {
        lane == 0 ? grouped({0, mid}) : grouped({mid, kv.num_kv_heads});
      });
    } else {
      grouped({});
    }
    return;
  }
  const auto run = [&](relokv::block_table_view v, int begin, int end, float* o, float* lse,
                       relokv::kv_head_range heads = {}) {
    if (end <= begin) return;
    const std::int32_t qind[2] = {0, end - begin};
    relokv::paged_attention<P>(rows_call(v, begin, end, o, lse, heads, qind));
  };
  const std::int32_t blocks = view.indptr[1] - view.indptr[0];
  if (!lanes::get().two() || (n < 64 && blocks < 2)) {
    run(view, 0, n, out, nullptr);
    return;
  }
  // A short prefill splits the KV heads: calls over disjoint head ranges equal one call bit
  // for bit (kv_head_range.hpp).
  // Decode's one query splits the keys. A prefill never does: each of its rows must come out
  // the same whatever other rows are computed with it (an exact hit is then exact), and a
  // key split merges two partial softmax states, which rounds differently from one pass.
  if (decode) {
    const std::int32_t half = blocks / 2;
    const relokv::block_entry* e = view.entries + view.indptr[0];
    const std::int32_t ind_a[2] = {0, half}, ind_b[2] = {0, blocks - half};
    const auto rows = static_cast<std::size_t>(n) * static_cast<std::size_t>(num_q_heads);
    thread_local std::vector<float> other, lse_a, lse_b;  // the caller's, read after the run
    std::vector<float>* ob = &other;
    other.resize(rows * static_cast<std::size_t>(kv.head_dim));
    lse_a.resize(rows);
    lse_b.resize(rows);
    float* la = lse_a.data();
    float* lb = lse_b.data();
    lanes::get().run([&](int lane) {
      if (lane == 0)
        run({e, ind_a, 1}, 0, n, out, la);
      else
        run({e + half, ind_b, 1}, 0, n, ob->data(), lb);
    });
    relokv::merge_attention_states(rows, kv.head_dim, out, la, ob->data(), lb);
    return;
  }
  if (n < 64 && kv.num_kv_heads >= 2) {
    const std::int32_t mid = kv.num_kv_heads / 2;
    lanes::get().run([&](int lane) {
      lane == 0 ? run(view, 0, n, out, nullptr, {0, mid})
                : run(view, 0, n, out, nullptr, {mid, kv.num_kv_heads});
    });
    return;
  }
  double total = 0;
  for (int i = 0; i < n; ++i) total += double(pos[i]) + 1;
  int cut = 0;
  for (double acc = 0; cut < n && acc < total / 2; ++cut) acc += double(pos[cut]) + 1;
  lanes::get().run([&](int lane) {
    lane == 0 ? run(view, 0, cut, out, nullptr) : run(view, cut, n, out, nullptr);
  });
}

/// A probe pass's request (question_topk): at every layer, the attention the `rows` tokens
/// give each key is added into `mass` (per logical position).
struct mass_probe {
  const std::vector<std::uint8_t>* rows = nullptr;
  std::vector<float>* mass = nullptr;
  const relokv::recompute::any_strategy* strategy = nullptr;  ///< which layers count
};

/// APE's reader (recompute::ape): positions from query_start on attend by the groups of
/// ape::groups over the request's table.
struct grouped_reader {
  relokv::recompute::ape ape;
  relokv::request_layout layout;
};

/// Adds the attention of the computed rows that `probe` names to its mass, at one layer (the
/// request's part of the call: relokv::request_kv::attention): the KV heads split in two
/// fixed halves (one per lane when there are two), summed in one order, so that the ranking
/// does not depend on the lane count.
template <class P, class T>
void probe_mass(const relokv::attention_params<T>& layer, const float* q,
                const std::vector<std::int32_t>& positions, int H, float scale,
                const mass_probe& probe) {
  const relokv::paged_kv_view<const T>& kv = layer.kv;
  const std::size_t qrow = static_cast<std::size_t>(H) * kv.head_dim;
  thread_local std::vector<float> qs;
  thread_local std::vector<std::int32_t> ps;
  qs.clear();
  ps.clear();
  for (std::size_t i = 0; i < positions.size(); ++i)
    if ((*probe.rows)[static_cast<std::size_t>(positions[i])]) {
      qs.insert(qs.end(), q + i * qrow, q + (i + 1) * qrow);
      ps.push_back(positions[i]);
    }
  if (ps.empty()) return;
  std::vector<float>& mass = *probe.mass;
  std::vector<float> other(mass.size(), 0.0f);
  const std::int32_t mid = kv.num_kv_heads / 2;
  // The helper lane gets pointers and a count: a thread_local named inside the lambda would be
  // the helper's own.
  const float* qp = qs.data();
  const std::int32_t* pp = ps.data();
  const auto rows = static_cast<std::int32_t>(ps.size());
  const auto run = [&](int half) {
    relokv::attention_mass_params<T> a;
    a.rope = layer.rope;
    a.kv = kv;
    a.blocks = {layer.table.entries + layer.table.indptr[0],
                static_cast<std::size_t>(layer.table.indptr[1] - layer.table.indptr[0])};
    a.q = qp;
    a.q_pos = pp;
    a.num_tokens = rows;
    a.num_q_heads = H;
    a.scale = scale;
    a.window = layer.window;
    a.heads =
        half == 0 ? relokv::kv_head_range{0, mid} : relokv::kv_head_range{mid, kv.num_kv_heads};
    a.mass = half == 0 ? std::span<float>(mass) : std::span<float>(other);
    relokv::attention_mass<P>(a);
  };
  if (lanes::get().two())
    lanes::get().run(run);
  else {
    run(0);
    run(1);
  }
  for (std::size_t t = 0; t < mass.size(); ++t) mass[t] += other[t];
}

}  // namespace relokv_engine::detail
