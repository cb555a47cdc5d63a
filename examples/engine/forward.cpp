// The forward pass of the example engine (forward.hpp): products in the weights' own types,
// norms, the layer loop over paged KV, batched decode rows and the logits head.
#include "forward.hpp"
#include "isa.hpp"
#include "lanes.hpp"
#include "layer_attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

#include <relokv/attention/detail/kernel_common.hpp>  // exp_nonpositive (SiLU)
#include <relokv/attention/detail/simd.hpp>
#include <relokv/attention/host_attention.hpp>
#include <relokv/attention/kv_append.hpp>
#include <relokv/attention/params.hpp>
#include <relokv/attention/state.hpp>
#include <relokv/engine/request_kv.hpp>
#include <relokv/recompute/deviation.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>
#include <relokv/store/block_format.hpp>

namespace relokv_engine::detail {

/// Products of the same X[n][in] (Q, K and V; gate and up; one alone) from the weights in their
/// own types (qgemm.hpp), in one handover to the two lanes, each product's output features
/// split between them. `decode`: the integer kernels may serve (X quantized once, to int8).
/// Prefill runs the int16 tiles where the type has them (X quantized once, to int16, its rows
/// split between the lanes first), fp32 panels elsewhere, for any number of rows: a prompt's
/// row must come out the same bits whether 3 or 300 rows are computed with it (exact cache
/// hits leave a few rows to compute). `logits`: the one row of the prompt's logits, whose
/// product takes the same path in every prefill whatever it follows (fp32 panels: unpacking
/// the vocabulary's matrix to tiles for one row would cost more than the row).
void matmuls(const float* x, int n, int in, std::span<const product> ps, bool decode, bool logits) {
  if (decode && n > kIntegerMaxRows) {
    // A batch of decode rows (a server's step): groups of at most kIntegerMaxRows, so that
    // every row takes the integer kernels it takes when its sequence is decoded alone.
    std::vector<product> sub(ps.begin(), ps.end());
    for (int r0 = 0; r0 < n; r0 += kIntegerMaxRows) {
      for (std::size_t i = 0; i < ps.size(); ++i)
        sub[i].y = ps[i].y + static_cast<std::size_t>(r0) * static_cast<std::size_t>(ps[i].w->rows);
      matmuls(x + static_cast<std::size_t>(r0) * static_cast<std::size_t>(in),
              std::min(kIntegerMaxRows, n - r0), in, std::span<const product>(sub), true, logits);
    }
    return;
  }
  bool any_integer = false, any_tiles = false;
  std::int32_t bound = 1;
  const auto integer = [&](const qmatrix& w) { return decode && integer_product(w, n); };
  const auto tiles = [&](const qmatrix& w) {
    return !decode && !logits && has_tile_kernel(w.type);
  };
  for (const product& p : ps) {
    if (p.w->cols != in)
      throw std::logic_error("matmul: a [" + std::to_string(p.w->rows) + "][" +
                             std::to_string(p.w->cols) + "] matrix for inputs of " +
                             std::to_string(in));
    any_integer = any_integer || integer(*p.w);
    if (tiles(*p.w)) {
      any_tiles = true;
      bound = std::max(bound, tile_weight_bound(p.w->type));
    }
  }
  // Quantized once by the caller's thread (or both lanes), read by both lanes: the lanes must
  // read the caller's buffers, not their own thread's (a thread_local named in the lambda
  // would be the helper's).
  thread_local q8_activations q8;
  thread_local q16_activations q16;
  thread_local bf16_activations xbf;
  const q8_activations* xq = &q8;
  q16_activations* x16 = &q16;
  bf16_activations* xb = &xbf;
  const bool amx = any_tiles && has_amx_tiles();
  if (any_integer) q8.quantize(x, n, in);
  if (any_tiles) {
    if (amx)
      xb->size(n, in);
    else
      x16->size(n, in, bound);
    const int half = n / 2;
    lanes::get().run([&](int lane) {
      const int i0 = lane == 0 ? 0 : half, i1 = lane == 0 ? half : n;
      if (amx)
        xb->convert_rows(x, i0, i1);
      else
        x16->quantize_rows(x, i0, i1);
    });
  }
  lanes::get().run([&](int lane) {
    for (const product& p : ps) {
      const int out = p.w->rows, mid = std::min(out, (out / 2 + 15) / 16 * 16);
      const int o0 = lane == 0 ? 0 : mid, o1 = lane == 0 ? mid : out;
      if (o1 <= o0) continue;
      if (tiles(*p.w) && amx)
        amx_matmul_rows(*p.w, *xb, p.y, out, o0, o1);
      else if (tiles(*p.w))
        tile_matmul_rows(*p.w, *x16, p.y, out, o0, o1);
      else
        qmatmul_rows(*p.w, x, integer(*p.w) ? xq : nullptr, n, p.y, out, o0, o1);
      if (p.bias != nullptr && !p.bias->empty())
        for (int r = 0; r < n; ++r)
          for (int o = o0; o < o1; ++o)
            p.y[static_cast<std::size_t>(r) * out + o] += (*p.bias)[static_cast<std::size_t>(o)];
    }
  });
}

namespace {

/// One product: Y[n][out] = X[n][in] W[out][in]^T (+ bias).
void matmul(const float* x, int n, int in, const qmatrix& w, int out, float* y,
            const std::vector<float>* bias = nullptr, bool decode = false, bool logits = false) {
  if (w.rows != out)
    throw std::logic_error("matmul: a matrix of " + std::to_string(w.rows) + " rows for " +
                           std::to_string(out) + " outputs");
  matmuls(x, n, in, {product{&w, y, bias}}, decode, logits);
}

/// g[i] = silu(g[i]) * u[i] for i < n, silu(x) = x * sigmoid(x) from e = e^-|x| (the library's
/// branch-free exp, within 2e-7), a vector at a time where the build has AVX-512 or AVX2
/// (std::exp is a call per element: SiLU was a tenth of prefill).
void silu_mul(float* g, const float* u, std::size_t n) {
  std::size_t i = 0;
#if RELOKV_HOST_SIMD
  using relokv::detail::simd::vf;
  constexpr std::size_t kLanes = relokv::detail::simd::kLanes;
  for (; i + kLanes <= n; i += kLanes) {
    vf x, up;
    std::memcpy(&x, g + i, sizeof x);
    std::memcpy(&up, u + i, sizeof up);
    vf e = x < 0.0f ? x : -x;  // -|x|
    relokv::detail::simd::exp_nonpositive(e);
    const vf y = (x >= 0.0f ? x : x * e) / (1.0f + e) * up;
    std::memcpy(g + i, &y, sizeof y);
  }
#endif
  for (; i < n; ++i) {
    const float e = relokv::detail::exp_nonpositive(-std::abs(g[i]));
    g[i] = (g[i] >= 0.0f ? g[i] : g[i] * e) / (1.0f + e) * u[i];
  }
}

/// g[i] = gelu(g[i]) * u[i] for i < n (Gemma's MLP), GELU in its tanh form,
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh from e = e^-2|y| as
/// sign(y) (1 - e) / (1 + e) by the library's branch-free exp (within 2e-7), a vector at a
/// time where the build has AVX-512 or AVX2.
void gelu_mul(float* g, const float* u, std::size_t n) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  std::size_t i = 0;
#if RELOKV_HOST_SIMD
  using relokv::detail::simd::vf;
  constexpr std::size_t kLanes = relokv::detail::simd::kLanes;
  for (; i + kLanes <= n; i += kLanes) {
    vf x, up;
    std::memcpy(&x, g + i, sizeof x);
    std::memcpy(&up, u + i, sizeof up);
    const vf y = kC * (x + 0.044715f * x * x * x);
    vf e = y < 0.0f ? 2.0f * y : -2.0f * y;  // -2|y|
    relokv::detail::simd::exp_nonpositive(e);
    const vf t = (1.0f - e) / (1.0f + e);  // tanh|y|
    const vf th = y < 0.0f ? -t : t;
    const vf r = 0.5f * x * (1.0f + th) * up;
    std::memcpy(g + i, &r, sizeof r);
  }
#endif
  for (; i < n; ++i) {
    const float x = g[i], y = kC * (x + 0.044715f * x * x * x);
    const float e = relokv::detail::exp_nonpositive(-2.0f * std::abs(y));
    const float t = (1.0f - e) / (1.0f + e);
    g[i] = 0.5f * x * (1.0f + (y < 0.0f ? -t : t)) * u[i];
  }
}

/// The MLP's gate activation times up: GELU-tanh for Gemma, SiLU otherwise.
void act_mul(const llama_model& m, float* g, const float* u, std::size_t n) {
  if (m.cfg.gemma())
    gelu_mul(g, u, n);
  else
    silu_mul(g, u, n);
}

/// Gemma: each head's query or key row normalized by its RMS norm, in place ([rows][heads][hd]).
void head_norms(const std::vector<float>& w, float* x, std::size_t rows, int heads, int hd,
                float eps) {
  if (w.empty()) return;
  for (std::size_t r = 0; r < rows * static_cast<std::size_t>(heads); ++r)
    rmsnorm(x + r * static_cast<std::size_t>(hd), w, hd, eps, x + r * static_cast<std::size_t>(hd));
}

/// f(begin, end) over rows [0, n): split between the two lanes when there are enough rows
/// for the handover to pay (prefill's norms, SiLU and residual adds), on the caller otherwise.
template <class F>
void rows_on_lanes(int n, F&& f) {
  if (n < 64 || !lanes::get().two()) {
    f(0, n);
    return;
  }
  lanes::get().run([&](int lane) { lane == 0 ? f(0, n / 2) : f(n / 2, n); });
}

}  // namespace

void rmsnorm(const float* x, const std::vector<float>& w, int dim, float eps, float* out) {
  // Sixteen partial sums (one vector; the loop vectorizes without reassociating), then double.
  constexpr int kParts = 16;
  float part[kParts] = {};
  int i0 = 0;
  for (; i0 + kParts <= dim; i0 += kParts)
    for (int j = 0; j < kParts; ++j) part[j] += x[i0 + j] * x[i0 + j];
  double ss = 0;
  for (int i = i0; i < dim; ++i) ss += double(x[i]) * x[i];
  for (const float v : part) ss += v;
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps);
  for (int i = 0; i < dim; ++i) out[i] = x[i] * inv * w[static_cast<std::size_t>(i)];
}

namespace {

struct layer_workspace {
  std::vector<float> x, h, q, k, v, att, o, g, u, fk;
};

/// Keeps the rows the mask still computes (and the last one, whose hidden state gives the
/// logits): their residual in x, and their queries in q when given (between the K/V write and
/// attention). Returns the new row count.
int compact_rows(std::vector<float>& x, std::vector<float>* q, std::vector<std::int32_t>& positions,
                 const std::vector<std::uint8_t>& mask, int n, int D, std::size_t qrow) {
  int w = 0;
  for (int i = 0; i < n; ++i) {
    const auto pos = positions[static_cast<std::size_t>(i)];
    if (!mask[static_cast<std::size_t>(pos)] && i != n - 1) continue;
    positions[static_cast<std::size_t>(w)] = pos;
    if (w != i) {
      std::copy_n(&x[static_cast<std::size_t>(i) * D], D, &x[static_cast<std::size_t>(w) * D]);
      if (q) std::copy_n(&(*q)[i * qrow], qrow, &(*q)[w * qrow]);
    }
    ++w;
  }
  positions.resize(static_cast<std::size_t>(w));
  x.resize(static_cast<std::size_t>(w) * D);
  return w;
}

/// A deep adapter's rows (links.hpp): their learned key and value at layer l in place of the
/// computed ones (before the deviation check and the write, so both see what the pool holds).
void deep_rows(const llama_model& m, int l, const std::vector<std::int32_t>& positions,
               const std::vector<relokv::token_t>& tokens, float* k, float* v) {
  const link_adapter& a = *m.links;
  const auto kvd = static_cast<std::size_t>(a.kv_dim);
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const relokv::token_t t = tokens[static_cast<std::size_t>(positions[i])];
    if (t < m.cfg.vocab) continue;
    const float* src = a.kv_row(t - m.cfg.vocab, l);
    std::copy_n(src, kvd, k + i * kvd);
    std::copy_n(src + kvd, kvd, v + i * kvd);
  }
}

/// An adapter's low-rank correction (links.hpp) of the span tokens among the rows at layer l:
/// k += (h a) b_k, v += (h a) b_v, h the rows' attention input [n][dim].
void lowrank_correct(const link_adapter& a, int l, const std::vector<std::int32_t>& positions,
                     const std::vector<std::uint8_t>& span_rows, const float* h, float* k,
                     float* v) {
  const auto D = static_cast<std::size_t>(a.dim), r = static_cast<std::size_t>(a.lowrank);
  const auto kvd = static_cast<std::size_t>(a.kv_dim);
  const float* A = a.lowrank_a_at(l);
  const float* B = a.lowrank_b_at(l);
  std::vector<float> t(r);
  for (std::size_t i = 0; i < positions.size(); ++i) {
    if (!span_rows[static_cast<std::size_t>(positions[i])]) continue;
    std::fill(t.begin(), t.end(), 0.0f);
    const float* hi = h + i * D;
    for (std::size_t d = 0; d < D; ++d)
      for (std::size_t j = 0; j < r; ++j) t[j] += hi[d] * A[d * r + j];
    float* ki = k + i * kvd;
    float* vi = v + i * kvd;
    for (std::size_t j = 0; j < r; ++j) {
      const float* bj = B + j * 2 * kvd;
      for (std::size_t e = 0; e < kvd; ++e) {
        ki[e] += t[j] * bj[e];
        vi[e] += t[j] * bj[kvd + e];
      }
    }
  }
}

}  // namespace

template <class P, class T>
void run_layers(layer_pass<T> pass, std::vector<float>& last_hidden) {
  const llama_model& m = *pass.model;
  pass_kv<T>& kv = *pass.kv;
  const std::vector<relokv::token_t>& tokens = *pass.tokens;
  std::vector<std::int32_t>& positions = pass.positions;
  const relokv::recompute::any_strategy* strategy = pass.strategy;
  std::vector<std::uint8_t>* mask = pass.mask;
  const std::vector<std::uint8_t>* reused = pass.reused;
  const std::vector<std::uint8_t>* pinned = pass.pinned;
  prefill_stats* trace = pass.trace;
  const mass_probe* probe = pass.probe;
  const grouped_reader* reader = pass.reader;
  const llama_config& c = m.cfg;
  const int D = c.dim, H = c.n_heads, Hk = c.n_kv_heads, hd = c.head_dim, F = c.ffn;
  auto n = static_cast<int>(positions.size());
  // Activations live in a per-thread workspace that keeps its capacity across calls, so a
  // prefill does not allocate (and fault in) fresh multi-MiB buffers.
  thread_local layer_workspace ws;
  auto& [x, h, q, k, v, att, o, g, u, fk] = ws;
  x.resize(static_cast<std::size_t>(n) * D);
  for (int i = 0; i < n; ++i) {
    const auto t = static_cast<std::size_t>(
        tokens[static_cast<std::size_t>(positions[static_cast<std::size_t>(i)])]);
    m.embed(static_cast<relokv::token_t>(t), x.data() + static_cast<std::size_t>(i) * D);
  }
  const bool dynamic = strategy != nullptr && strategy->dynamic() && mask && reused;
  int step = 0;
  fk.resize(static_cast<std::size_t>(Hk) * hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto qrow = static_cast<std::size_t>(H) * hd;
  std::array<relokv::attention_group, 3> groups{};
  std::int32_t query_start = 0;
  if (reader) {
    const relokv::block_table_view t = kv.attention(0).table;
    groups = reader->ape.groups(reader->layout, t.indptr[1] - t.indptr[0]);
    query_start = relokv::recompute::ape::query_start(reader->layout);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const llama_layer& L = m.layers[static_cast<std::size_t>(l)];
    // The layer's call over the request's blocks: its own RoPE base (Gemma 3) and window.
    relokv::attention_params<T> call = kv.attention(l);
    const relokv::rope_table& rope = *call.rope;
    auto N = static_cast<std::size_t>(n);
    bool refined = false;
    h.resize(N * D);
    // The lanes get the caller's buffers as pointers: a thread_local (or a binding to one)
    // named inside a lambda that runs on the helper would be the helper's.
    float* const xp = x.data();
    float* const hp = h.data();
    rows_on_lanes(n, [&](int b, int e) {
      for (int i = b; i < e; ++i) rmsnorm(xp + i * D, L.attn_norm, D, c.rms_eps, hp + i * D);
    });
    q.resize(N * H * hd);
    k.resize(N * Hk * hd);
    v.resize(N * Hk * hd);
    matmuls(h.data(), n, D,
            {{&L.wq, q.data(), &L.bq}, {&L.wk, k.data(), &L.bk}, {&L.wv, v.data(), &L.bv}},
            /*decode=*/false);
    head_norms(L.q_norm, q.data(), N, H, hd, c.rms_eps);
    head_norms(L.k_norm, k.data(), N, Hk, hd, c.rms_eps);
    if (m.links && m.links->deep) deep_rows(m, l, positions, tokens, k.data(), v.data());
    if (m.links && m.links->lowrank > 0 && l >= m.links->lowrank_from) {
      if (pass.span_rows == nullptr)
        throw std::logic_error("run_layers: the adapter's correction needs the pass's span rows");
      lowrank_correct(*m.links, l, positions, *pass.span_rows, h.data(), k.data(), v.data());
    }
    const relokv::paged_kv_view<const T>& layer_kv = call.kv;
    if (dynamic && step < strategy->steps() && strategy->check_layer(step) == l) {
      // Deviation of the fresh K/V (in storage form) from the cached ones, before they are
      // overwritten; the mask for the next layer follows.
      std::vector<float> dev(mask->size(), 0.0f);
      for (int i = 0; i < n; ++i) {
        const auto pos = positions[static_cast<std::size_t>(i)];
        if (!(*reused)[static_cast<std::size_t>(pos)]) continue;
        const auto [b, s] = kv.where(pos);
        for (int hh = 0; hh < Hk; ++hh) {
          std::copy_n(&k[(static_cast<std::size_t>(i) * Hk + hh) * hd], hd,
                      &fk[static_cast<std::size_t>(hh) * hd]);
          if constexpr (P::kind != relokv::placement_kind::kAtAttention)
            rope.rotate(&fk[static_cast<std::size_t>(hh) * hd], P::stored_position(pos, s));
        }
        float d_head = 0.0f, total = 0.0f;
        for (int hh = 0; hh < Hk; ++hh) {
          relokv::token_deviation(strategy->metric(), layer_kv.k(b, hh) + s * hd,
                                  layer_kv.v(b, hh) + s * hd,
                                  &fk[static_cast<std::size_t>(hh) * hd],
                                  &v[(static_cast<std::size_t>(i) * Hk + hh) * hd], 1, hd, &d_head);
          total += d_head;
        }
        dev[static_cast<std::size_t>(pos)] = total;
      }
      strategy->refine(
          step, dev, *reused, *mask,
          pinned ? std::span<const std::uint8_t>(*pinned) : std::span<const std::uint8_t>());
      if (trace && step == 0) {
        trace->check_deviation = dev;
        trace->check_kept = *mask;
      }
      ++step;
      refined = true;
    }
    for (int i = 0; i < n; ++i)  // a reused token (the last-token rule) is not written
      kv.write(l, positions[static_cast<std::size_t>(i)], &k[static_cast<std::size_t>(i) * Hk * hd],
               &v[static_cast<std::size_t>(i) * Hk * hd]);
    if (probe && probe->strategy->counts_layer(l, c.n_layers))
      probe_mass<P>(call, q.data(), positions, H, scale, *probe);
    if (refined) {
      // Every candidate's K/V of the check layer are written; the rows dropped there need no
      // attention or MLP (nothing reads their hidden state again).
      n = compact_rows(x, &q, positions, *mask, n, D, qrow);
      N = static_cast<std::size_t>(n);
    }
    att.resize(N * H * hd);
    call.q = q.data();
    call.q_pos = positions.data();
    call.num_tokens = n;
    call.num_q_heads = H;
    call.scale = scale;
    call.out = att.data();
    attention<P>(call, /*decode=*/false, reader ? &groups : nullptr, query_start);
    o.resize(N * D);
    matmul(att.data(), n, H * hd, L.wo, D, o.data());
    float* const xr = x.data();  // x may have shrunk (compact_rows): its data again
    float* const op = o.data();
    rows_on_lanes(n, [&](int b, int e) {
      if (!L.post_attn_norm.empty())  // Gemma: the attention output normed before the add
        for (int i = b; i < e; ++i) rmsnorm(op + i * D, L.post_attn_norm, D, c.rms_eps, op + i * D);
      for (auto i = static_cast<std::size_t>(b) * D; i < static_cast<std::size_t>(e) * D; ++i)
        xr[i] += op[i];
      for (int i = b; i < e; ++i) rmsnorm(xr + i * D, L.ffn_norm, D, c.rms_eps, hp + i * D);
    });
    g.resize(N * F);
    u.resize(N * F);
    matmuls(h.data(), n, D, {{&L.w_gate, g.data()}, {&L.w_up, u.data()}}, /*decode=*/false);
    float* const gp = g.data();
    const float* const up = u.data();
    rows_on_lanes(n, [&](int b, int e) {
      const std::size_t i0 = static_cast<std::size_t>(b) * F, i1 = static_cast<std::size_t>(e) * F;
      act_mul(m, gp + i0, up + i0, i1 - i0);
    });
    matmul(g.data(), n, F, L.w_down, D, o.data());
    rows_on_lanes(n, [&](int b, int e) {
      if (!L.post_ffn_norm.empty())  // Gemma: the MLP output normed before the add
        for (int i = b; i < e; ++i) rmsnorm(op + i * D, L.post_ffn_norm, D, c.rms_eps, op + i * D);
      for (auto i = static_cast<std::size_t>(b) * D; i < static_cast<std::size_t>(e) * D; ++i)
        xr[i] += op[i];
    });
    if (trace) trace->token_layers += n;
    if (dynamic) n = compact_rows(x, nullptr, positions, *mask, n, D, qrow);  // next layer's rows
  }
  last_hidden.assign(x.end() - D, x.end());
}

std::vector<float> head(const llama_model& m, const std::vector<float>& hidden, bool decode,
                        int n) {
  const auto D = static_cast<std::size_t>(m.cfg.dim);
  std::vector<float> hn(static_cast<std::size_t>(n) * D),
      out(static_cast<std::size_t>(n) * static_cast<std::size_t>(m.cfg.vocab));
  for (int i = 0; i < n; ++i)
    rmsnorm(hidden.data() + i * D, m.out_norm, m.cfg.dim, m.cfg.rms_eps, hn.data() + i * D);
  matmul(hn.data(), n, m.cfg.dim, m.lm_head(), m.cfg.vocab, out.data(), nullptr, decode,
         /*logits=*/true);
  if (const float cap = m.cfg.logit_softcap; cap > 0.0f)
    for (float& z : out) z = cap * std::tanh(z / cap);
  return out;
}

template <class P, class T>
void run_decode_rows(const llama_model& m, std::span<const decode_row<T>> rows,
                     std::vector<float>& hidden) {
  const llama_config& c = m.cfg;
  const int D = c.dim, H = c.n_heads, Hk = c.n_kv_heads, hd = c.head_dim, F = c.ffn;
  const int n = static_cast<int>(rows.size());
  const auto N = static_cast<std::size_t>(n);
  const auto Du = static_cast<std::size_t>(D), Fu = static_cast<std::size_t>(F);
  const auto kvrow = static_cast<std::size_t>(Hk) * static_cast<std::size_t>(hd);
  thread_local layer_workspace ws;
  auto& [x, h, q, k, v, att, o, g, u, fk] = ws;
  x.resize(N * Du);
  for (std::size_t i = 0; i < N; ++i) {
    m.embed(rows[i].token, x.data() + i * Du);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto qrow = static_cast<std::size_t>(H) * static_cast<std::size_t>(hd);
  // Each row's reader groups (APE) and table view, as its lone decode makes them.
  std::vector<std::array<relokv::attention_group, 3>> groups(N);
  std::vector<std::int32_t> query_start(N, 0);
  for (std::size_t i = 0; i < N; ++i) {
    const decode_row<T>& r = rows[i];
    if (r.reader) {
      const relokv::block_table_view t = r.kv->attention(0).table;
      groups[i] = r.reader->ape.groups(r.reader->layout, t.indptr[1] - t.indptr[0]);
      query_start[i] = relokv::recompute::ape::query_start(r.reader->layout);
    }
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const llama_layer& L = m.layers[static_cast<std::size_t>(l)];
    h.resize(N * Du);
    for (std::size_t i = 0; i < N; ++i)
      rmsnorm(x.data() + i * Du, L.attn_norm, D, c.rms_eps, h.data() + i * Du);
    q.resize(N * qrow);
    k.resize(N * kvrow);
    v.resize(N * kvrow);
    matmuls(h.data(), n, D,
            {{&L.wq, q.data(), &L.bq}, {&L.wk, k.data(), &L.bk}, {&L.wv, v.data(), &L.bv}},
            /*decode=*/true);
    head_norms(L.q_norm, q.data(), N, H, hd, c.rms_eps);
    head_norms(L.k_norm, k.data(), N, Hk, hd, c.rms_eps);
    att.resize(N * qrow);
    for (std::size_t i = 0; i < N; ++i) {
      const decode_row<T>& r = rows[i];
      r.kv->write(l, r.pos, &k[i * kvrow], &v[i * kvrow]);
      relokv::attention_params<T> call = r.kv->attention(l);
      call.q = &q[i * qrow];
      call.q_pos = &r.pos;
      call.num_tokens = 1;
      call.num_q_heads = H;
      call.scale = scale;
      call.out = &att[i * qrow];
      attention<P>(call, /*decode=*/true, r.reader ? &groups[i] : nullptr, query_start[i]);
    }
    o.resize(N * Du);
    matmul(att.data(), n, H * hd, L.wo, D, o.data(), nullptr, /*decode=*/true);
    if (!L.post_attn_norm.empty())
      for (std::size_t i = 0; i < N; ++i)
        rmsnorm(o.data() + i * Du, L.post_attn_norm, D, c.rms_eps, o.data() + i * Du);
    for (std::size_t i = 0; i < N * Du; ++i) x[i] += o[i];
    for (std::size_t i = 0; i < N; ++i)
      rmsnorm(x.data() + i * Du, L.ffn_norm, D, c.rms_eps, h.data() + i * Du);
    g.resize(N * Fu);
    u.resize(N * Fu);
    matmuls(h.data(), n, D, {{&L.w_gate, g.data()}, {&L.w_up, u.data()}}, /*decode=*/true);
    for (std::size_t i = 0; i < N; ++i)  // row by row: the vector/tail split a lone row has
      act_mul(m, g.data() + i * Fu, u.data() + i * Fu, Fu);
    matmul(g.data(), n, F, L.w_down, D, o.data(), nullptr, /*decode=*/true);
    if (!L.post_ffn_norm.empty())
      for (std::size_t i = 0; i < N; ++i)
        rmsnorm(o.data() + i * Du, L.post_ffn_norm, D, c.rms_eps, o.data() + i * Du);
    for (std::size_t i = 0; i < N * Du; ++i) x[i] += o[i];
  }
  hidden.assign(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(N * Du));
}

#define RELOKV_FORWARD_INSTANTIATE(P, T)                                                  \
  template void run_layers<P, T>(layer_pass<T>, std::vector<float>&);                     \
  template void run_decode_rows<P, T>(const llama_model&, std::span<const decode_row<T>>, \
                                      std::vector<float>&);
RELOKV_FORWARD_INSTANTIATE(relokv::pre_rotated, relokv::bf16)
RELOKV_FORWARD_INSTANTIATE(relokv::at_attention, relokv::bf16)
RELOKV_FORWARD_INSTANTIATE(relokv::block_relative, relokv::bf16)
RELOKV_FORWARD_INSTANTIATE(relokv::pre_rotated, float)
RELOKV_FORWARD_INSTANTIATE(relokv::at_attention, float)
RELOKV_FORWARD_INSTANTIATE(relokv::block_relative, float)
#undef RELOKV_FORWARD_INSTANTIATE

}  // namespace relokv_engine::detail
