#pragma once
// The engine's attention calls on its two lanes (llama.cpp's layer loop uses them): where each
// position lives (kv_map), the lane split of a prefill or decode call with APE's grouped rows,
// and question_topk's probe of the attention each key receives.
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

/// Where each logical position of a request lives: its block and slot.
struct kv_map {
  std::vector<relokv::block_entry> table;
  std::vector<relokv::block_id> block_of;
  std::vector<std::int32_t> slot_of;
  void index() {
    block_of.clear();
    slot_of.clear();
    for (const auto& e : table)
      for (std::int32_t j = 0; j < e.len; ++j) {
        const auto pos = static_cast<std::size_t>(e.pos0 + j);
        if (block_of.size() <= pos) {
          block_of.resize(pos + 1, relokv::kNoBlock);
          slot_of.resize(pos + 1, 0);
        }
        block_of[pos] = e.block;
        slot_of[pos] = j;
      }
  }
};

/// Attention of n queries (prefill, or decode's one) on the two lanes. A prefill's queries are
/// independent, so many are cut where the causal work (each query's visible positions) is
/// halved, and a few split the KV heads. Decode's one query splits the keys instead: each lane
/// attends over half of the blocks, and the two states are merged by their log-sum-exp. No
/// prefill row's result depends on the rows computed with it, so an exact hit is exact (one
/// prefill row alone takes the prefill kernels too: `decode` says which call this is).
template <class P, class T>
void attention(const relokv::rope_table& rope, relokv::paged_kv_view<const T> kv,
               relokv::block_table_view view, const float* q, const std::int32_t* pos, int n,
               int num_q_heads, float scale, float* out, bool decode,
               const std::array<relokv::attention_group, 3>* groups = nullptr,
               std::int32_t query_start = 0, std::int32_t window = 0) {
  const std::size_t row = static_cast<std::size_t>(num_q_heads) * kv.head_dim;
  if (groups != nullptr && n > 0 && pos[n - 1] >= query_start) {
    // APE: the reader's rows (a suffix: positions ascend) attend by groups; rows before
    // them plainly. Few rows: the KV heads split between the lanes.
    int i0 = 0;
    while (pos[i0] < query_start) ++i0;
    if (i0 > 0)
      attention<P>(rope, kv, view, q, pos, i0, num_q_heads, scale, out, decode, nullptr, 0, window);
    const int m = n - i0;
    const std::int32_t qind[2] = {0, m};
    const auto call = [&](relokv::kv_head_range heads) {
      relokv::attention_params<T> p;
      p.rope = &rope;
      p.kv = kv;
      p.table = view;
      p.q = q + static_cast<std::size_t>(i0) * row;
      p.q_pos = pos + i0;
      p.q_indptr = decode ? nullptr : qind;
      p.num_tokens = m;
      p.num_q_heads = num_q_heads;
      p.scale = scale;
      p.out = out + static_cast<std::size_t>(i0) * row;
      p.heads = heads;
      p.window = window;
      relokv::grouped_attention<P>(p, *groups);
    };
    if (lanes::get().two() && kv.num_kv_heads >= 2) {
      const std::int32_t mid = kv.num_kv_heads / 2;
      lanes::get().run([&](int lane) {
        lane == 0 ? call({0, mid}) : call({mid, kv.num_kv_heads});
      });
    } else {
      call({});
    }
    return;
  }
  const auto call = [&](relokv::block_table_view v, int begin, int end, float* o, float* lse,
                        relokv::kv_head_range heads = {}) {
    if (end <= begin) return;
    const std::int32_t qind[2] = {0, end - begin};
    relokv::attention_params<T> p;
    p.rope = &rope;
    p.kv = kv;
    p.table = v;
    p.q = q + static_cast<std::size_t>(begin) * row;
    p.q_pos = pos + begin;
    // Decode's one query takes the decode kernels (bf16 spans); a prefill row takes prefill's
    // groups even alone (a prompt's last chunk, an exact hit's one row), as it does among many.
    p.q_indptr = decode ? nullptr : qind;
    p.num_tokens = end - begin;
    p.num_q_heads = num_q_heads;
    p.scale = scale;
    p.out = o + static_cast<std::size_t>(begin) * row;
    p.lse = lse;
    p.heads = heads;
    p.window = window;
    relokv::paged_attention<P>(p);
  };
  const std::int32_t blocks = view.indptr[1] - view.indptr[0];
  if (!lanes::get().two() || (n < 64 && blocks < 2)) {
    call(view, 0, n, out, nullptr);
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
        call({e, ind_a, 1}, 0, n, out, la);
      else
        call({e + half, ind_b, 1}, 0, n, ob->data(), lb);
    });
    relokv::merge_attention_states(rows, kv.head_dim, out, la, ob->data(), lb);
    return;
  }
  if (n < 64 && kv.num_kv_heads >= 2) {
    const std::int32_t mid = kv.num_kv_heads / 2;
    lanes::get().run([&](int lane) {
      lane == 0 ? call(view, 0, n, out, nullptr, {0, mid})
                : call(view, 0, n, out, nullptr, {mid, kv.num_kv_heads});
    });
    return;
  }
  double total = 0;
  for (int i = 0; i < n; ++i) total += double(pos[i]) + 1;
  int cut = 0;
  for (double acc = 0; cut < n && acc < total / 2; ++cut) acc += double(pos[cut]) + 1;
  lanes::get().run([&](int lane) {
    lane == 0 ? call(view, 0, cut, out, nullptr) : call(view, cut, n, out, nullptr);
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

/// Adds the attention of the computed rows that `probe` names to its mass, at one layer: the
/// KV heads split in two fixed halves (one per lane when there are two), summed in one order,
/// so that the ranking does not depend on the lane count.
template <class P, class T>
void probe_mass(const relokv::rope_table& rope, relokv::paged_kv_view<const T> kv,
                const std::vector<relokv::block_entry>& table, const float* q,
                const std::vector<std::int32_t>& positions, int H, float scale,
                const mass_probe& probe, std::int32_t window = 0) {
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
    a.rope = &rope;
    a.kv = kv;
    a.blocks = table;
    a.q = qp;
    a.q_pos = pp;
    a.num_tokens = rows;
    a.num_q_heads = H;
    a.scale = scale;
    a.window = window;
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
