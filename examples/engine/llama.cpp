// Llama forward pass on relokv (see llama.hpp).
#include "llama.hpp"
#include "lanes.hpp"
#include "layer_attention.hpp"

#include <cblas.h>

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

namespace relokv_engine {
namespace {

using detail::attention;
using detail::grouped_reader;
using detail::kv_map;
using detail::mass_probe;
using detail::probe_mass;

/// One product of matmuls(): Y[n][w.rows] = X W^T (+ bias when given and not empty).
struct product {
  const qmatrix* w;
  float* y;
  const std::vector<float>* bias = nullptr;
};

/// Products of the same X[n][in] (Q, K and V; gate and up; one alone) from the weights in their
/// own types (qgemm.hpp), in one handover to the two lanes, each product's output features
/// split between them. `decode`: the integer kernels may serve (X quantized once, to int8).
/// Prefill runs the int16 tiles where the type has them (X quantized once, to int16, its rows
/// split between the lanes first), fp32 panels elsewhere.
void matmuls(const float* x, int n, int in, std::initializer_list<product> ps, bool decode) {
  bool any_integer = false, any_tiles = false;
  std::int32_t bound = 1;
  const auto integer = [&](const qmatrix& w) { return decode && integer_product(w, n); };
  const auto tiles = [&](const qmatrix& w) {
    return !decode && n > kIntegerMaxRows && has_tile_kernel(w.type);
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

/// One product: Y[n][out] = X[n][in] W[out][in]^T (+ bias).
void matmul(const float* x, int n, int in, const qmatrix& w, int out, float* y,
            const std::vector<float>* bias = nullptr, bool decode = false) {
  if (w.rows != out)
    throw std::logic_error("matmul: a matrix of " + std::to_string(w.rows) + " rows for " +
                           std::to_string(out) + " outputs");
  matmuls(x, n, in, {product{&w, y, bias}}, decode);
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

std::vector<float> tensor_as(const gguf_file& f, const std::string& name,
                             std::vector<std::uint64_t> dims) {
  const gguf_tensor& t = f.tensor(name);
  if (t.dims != dims) {
    std::string want, got;
    for (auto d : dims) want += std::to_string(d) + " ";
    for (auto d : t.dims) got += std::to_string(d) + " ";
    throw gguf_error(f.name(), t.offset,
                     "tensor '" + name + "' has shape [ " + got + "], expected [ " + want + "]");
  }
  return f.dequantize(t);
}

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

/// The layer loop, shared by the relokv engine and the plain baseline. Computes the tokens at
/// `positions` (ascending; their K/V are written where `map` says, except where `no_write`),
/// attends over every block of `map`, and leaves the last token's hidden state in last_hidden.
/// With a dynamic strategy the set shrinks layer by layer (mask/reused per position).
template <class P, class T>
void run_layers(const llama_model& m, const relokv::rope_table& rope,
                relokv::host_kv_storage<T>& kv, const kv_map& map,
                std::vector<std::int32_t> positions, const std::vector<relokv::token_t>& tokens,
                std::int32_t no_write, std::vector<std::uint8_t>* mask,
                const std::vector<std::uint8_t>* reused,
                const relokv::recompute::any_strategy* strategy, std::vector<float>& last_hidden,
                prefill_stats* trace = nullptr, const std::vector<std::uint8_t>* pinned = nullptr,
                bool decode = false, const mass_probe* probe = nullptr,
                const grouped_reader* reader = nullptr) {
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
    m.tok_emb.dequantize_row(static_cast<std::int32_t>(t),
                             x.data() + static_cast<std::size_t>(i) * D);
  }
  const bool dynamic = strategy != nullptr && strategy->dynamic() && mask && reused;
  int step = 0;
  fk.resize(static_cast<std::size_t>(Hk) * hd);
  const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(map.table.size())};
  const relokv::block_table_view view{map.table.data(), indptr, 1};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto qrow = static_cast<std::size_t>(H) * hd;
  std::array<relokv::attention_group, 3> groups{};
  std::int32_t query_start = 0;
  if (reader) {
    groups = reader->ape.groups(reader->layout, static_cast<std::int32_t>(map.table.size()));
    query_start = relokv::recompute::ape::query_start(reader->layout);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const llama_layer& L = m.layers[static_cast<std::size_t>(l)];
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
            {{&L.wq, q.data(), &L.bq}, {&L.wk, k.data(), &L.bk}, {&L.wv, v.data(), &L.bv}}, decode);
    auto layer_kv = kv.layer(l);
    if (dynamic && step < strategy->steps() && strategy->check_layer(step) == l) {
      // Deviation of the fresh K/V (in storage form) from the cached ones, before they are
      // overwritten; the mask for the next layer follows.
      std::vector<float> dev(mask->size(), 0.0f);
      for (int i = 0; i < n; ++i) {
        const auto pos = positions[static_cast<std::size_t>(i)];
        if (!(*reused)[static_cast<std::size_t>(pos)]) continue;
        const auto b = map.block_of[static_cast<std::size_t>(pos)];
        const auto s = map.slot_of[static_cast<std::size_t>(pos)];
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
    for (int i = 0; i < n; ++i) {
      const auto pos = positions[static_cast<std::size_t>(i)];
      if (pos == no_write) continue;
      relokv::append_kv<P>(rope, layer_kv, map.block_of[static_cast<std::size_t>(pos)],
                           map.slot_of[static_cast<std::size_t>(pos)], pos,
                           &k[static_cast<std::size_t>(i) * Hk * hd],
                           &v[static_cast<std::size_t>(i) * Hk * hd]);
    }
    if (probe && probe->strategy->counts_layer(l, c.n_layers))
      probe_mass<P>(rope, relokv::paged_kv_view<const T>(layer_kv), map.table, q.data(), positions,
                    H, scale, *probe);
    if (refined) {
      // Every candidate's K/V of the check layer are written; the rows dropped there need no
      // attention or MLP (nothing reads their hidden state again).
      n = compact_rows(x, &q, positions, *mask, n, D, qrow);
      N = static_cast<std::size_t>(n);
    }
    att.resize(N * H * hd);
    attention<P>(rope, relokv::paged_kv_view<const T>(layer_kv), view, q.data(), positions.data(),
                 n, H, scale, att.data(), reader ? &groups : nullptr, query_start);
    o.resize(N * D);
    matmul(att.data(), n, H * hd, L.wo, D, o.data(), nullptr, decode);
    float* const xr = x.data();  // x may have shrunk (compact_rows): its data again
    const float* const op = o.data();
    rows_on_lanes(n, [&](int b, int e) {
      for (auto i = static_cast<std::size_t>(b) * D; i < static_cast<std::size_t>(e) * D; ++i)
        xr[i] += op[i];
      for (int i = b; i < e; ++i) rmsnorm(xr + i * D, L.ffn_norm, D, c.rms_eps, hp + i * D);
    });
    g.resize(N * F);
    u.resize(N * F);
    matmuls(h.data(), n, D, {{&L.w_gate, g.data()}, {&L.w_up, u.data()}}, decode);
    float* const gp = g.data();
    const float* const up = u.data();
    rows_on_lanes(n, [&](int b, int e) {
      const std::size_t i0 = static_cast<std::size_t>(b) * F, i1 = static_cast<std::size_t>(e) * F;
      silu_mul(gp + i0, up + i0, i1 - i0);
    });
    matmul(g.data(), n, F, L.w_down, D, o.data(), nullptr, decode);
    rows_on_lanes(n, [&](int b, int e) {
      for (auto i = static_cast<std::size_t>(b) * D; i < static_cast<std::size_t>(e) * D; ++i)
        xr[i] += op[i];
    });
    if (trace) trace->token_layers += n;
    if (dynamic) n = compact_rows(x, nullptr, positions, *mask, n, D, qrow);  // next layer's rows
  }
  last_hidden.assign(x.end() - D, x.end());
}

std::vector<float> head(const llama_model& m, const std::vector<float>& hidden, bool decode) {
  std::vector<float> hn(hidden.size()), out(static_cast<std::size_t>(m.cfg.vocab));
  rmsnorm(hidden.data(), m.out_norm, m.cfg.dim, m.cfg.rms_eps, hn.data());
  matmul(hn.data(), 1, m.cfg.dim, m.lm_head(), m.cfg.vocab, out.data(), nullptr, decode);
  return out;
}

}  // namespace

void check_tokens(const llama_model& m, std::span<const relokv::token_t> tokens,
                  const char* where) {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= m.cfg.vocab)
      throw std::out_of_range(std::string(where) + ": token " + std::to_string(i) + " = " +
                              std::to_string(tokens[i]) + " outside the vocabulary [0, " +
                              std::to_string(m.cfg.vocab) + ")");
}

llama_model llama_model::from_gguf(const gguf_file& f) {
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen2")
    throw gguf_error(f.name(), 0,
                     "architecture '" + arch + "' is not supported (llama and qwen2 are)");
  const bool qwen2 = arch == "qwen2";
  const std::string a = arch + ".";  // hyperparameter keys are prefixed by the architecture
  llama_model m;
  llama_config& c = m.cfg;
  c.arch = arch;
  c.name = f.has("general.name") ? f.get_string("general.name") : arch;
  // Every hyperparameter is checked where it is read, with the key and the value it had.
  auto bad = [&](const std::string& key, const std::string& value, const std::string& want) {
    throw gguf_error(f.name(), 0, key + " = " + value + ": " + want);
  };
  auto int_key = [&](const std::string& key, std::int64_t lo, std::int64_t hi,
                     std::optional<std::int64_t> fallback = std::nullopt) {
    const std::int64_t v = fallback ? f.get_int(key, *fallback) : f.get_int(key);
    if (v < lo || v > hi)
      bad(key, std::to_string(v),
          "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return static_cast<std::int32_t>(v);
  };
  auto float_key = [&](const std::string& key, double fallback, double above) {
    const double v = f.get_float(key, fallback);
    if (!std::isfinite(v) || !(v > above))
      bad(key, std::to_string(v), "must be finite and > " + std::to_string(above));
    return v;
  };
  constexpr std::int64_t kMaxDim = 1 << 16;
  c.n_layers = int_key(a + "block_count", 1, 4096);
  c.dim = int_key(a + "embedding_length", 1, kMaxDim);
  c.n_heads = int_key(a + "attention.head_count", 1, 4096);
  c.n_kv_heads = int_key(a + "attention.head_count_kv", 1, c.n_heads, c.n_heads);
  c.ffn = int_key(a + "feed_forward_length", 1, 1 << 20);
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads)
    throw gguf_error(f.name(), 0,
                     "inconsistent attention head counts: embedding_length " +
                         std::to_string(c.dim) + ", head_count " + std::to_string(c.n_heads) +
                         ", head_count_kv " + std::to_string(c.n_kv_heads));
  c.head_dim = c.dim / c.n_heads;
  if (c.head_dim > relokv::kMaxHeadDim)
    bad(a + "embedding_length / llama.attention.head_count", std::to_string(c.head_dim),
        "head dimension above relokv::kMaxHeadDim");
  c.rms_eps = static_cast<float>(float_key(a + "attention.layer_norm_rms_epsilon", 1e-5, 0.0));
  const auto& emb = f.tensor("token_embd.weight");
  if (emb.dims.size() != 2 || emb.dims[1] == 0 || emb.dims[1] > (1u << 24))
    throw gguf_error(f.name(), emb.offset,
                     "token_embd.weight must be [dim, vocab], vocab in [1, 2^24]");
  c.vocab = static_cast<std::int32_t>(emb.dims[1]);
  c.rope.head_dim = c.head_dim;
  c.rope.rotary_dim = int_key(a + "rope.dimension_count", 2, c.head_dim, c.head_dim);
  if (c.rope.rotary_dim % 2 != 0)
    bad(a + "rope.dimension_count", std::to_string(c.rope.rotary_dim), "must be even");
  c.rope.theta = float_key(a + "rope.freq_base", 10000.0, 1.0);
  // GGUF llama checkpoints permute Q and K at conversion so that pairs are adjacent; qwen2
  // keeps the checkpoint's layout, whose pairs are half a rotary dimension apart.
  c.rope.layout = qwen2 ? relokv::rope_layout::kNeoX : relokv::rope_layout::kGPTJ;
  if (f.has(a + "rope.scaling.type")) {
    const std::string t = f.get_string(a + "rope.scaling.type");
    if (t == "linear" || t == "yarn")
      c.rope.factor = float_key(a + "rope.scaling.factor", 1.0, 0.0);
    if (t == "linear") {
      c.rope.scaling = relokv::rope_scaling::kLinear;
    } else if (t == "yarn") {
      c.rope.scaling = relokv::rope_scaling::kYaRN;
      c.rope.original_max_position =
          int_key(a + "rope.scaling.original_context_length", 1, 1 << 24, 4096);
    } else if (t != "none") {
      bad(a + "rope.scaling.type", "'" + t + "'", "is not none, linear or yarn");
    }
  }
  try {
    c.rope.validate();
  } catch (const relokv::error& e) {
    throw gguf_error(f.name(), 0, e.what());
  }
  const auto D = static_cast<std::uint64_t>(c.dim), F = static_cast<std::uint64_t>(c.ffn);
  const auto Q = static_cast<std::uint64_t>(c.n_heads * c.head_dim);
  const auto K = static_cast<std::uint64_t>(c.n_kv_heads * c.head_dim);
  const auto V = static_cast<std::uint64_t>(c.vocab);
  // Matrices stay in the file's mapping and types; norms and biases are read as fp32.
  const auto mat = [&](const std::string& name, std::vector<std::uint64_t> dims) {
    const gguf_tensor& t = f.tensor(name);
    if (t.dims != dims) (void)tensor_as(f, name, dims);  // throws, naming both shapes
    return qmatrix::view(f, t, f.keep_alive());
  };
  m.tok_emb = mat("token_embd.weight", {D, V});
  if (f.has_tensor("output.weight")) m.output = mat("output.weight", {D, V});
  m.out_norm = tensor_as(f, "output_norm.weight", {D});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    llama_layer L;
    L.attn_norm = tensor_as(f, p + "attn_norm.weight", {D});
    L.wq = mat(p + "attn_q.weight", {D, Q});
    L.wk = mat(p + "attn_k.weight", {D, K});
    L.wv = mat(p + "attn_v.weight", {D, K});
    if (qwen2) {
      L.bq = tensor_as(f, p + "attn_q.bias", {Q});
      L.bk = tensor_as(f, p + "attn_k.bias", {K});
      L.bv = tensor_as(f, p + "attn_v.bias", {K});
    }
    L.wo = mat(p + "attn_output.weight", {Q, D});
    L.ffn_norm = tensor_as(f, p + "ffn_norm.weight", {D});
    L.w_gate = mat(p + "ffn_gate.weight", {D, F});
    L.w_up = mat(p + "ffn_up.weight", {D, F});
    L.w_down = mat(p + "ffn_down.weight", {F, D});
    m.layers.push_back(std::move(L));
  }
  // The weights' identity for the store fingerprint: every tensor's name, type and bytes.
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  for (const gguf_tensor& t : f.tensors()) {
    XXH3_64bits_update(h, t.name.data(), t.name.size());
    const auto type = static_cast<std::uint32_t>(t.type);
    XXH3_64bits_update(h, &type, sizeof type);
    XXH3_64bits_update(h, t.data, t.bytes);
  }
  c.weights_id = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return m;
}

llama_model llama_model::synthetic(const llama_config& cfg_in, std::uint32_t seed) {
  llama_model m;
  m.cfg = cfg_in;
  llama_config& c = m.cfg;
  c.rope.head_dim = c.head_dim;
  c.rope.rotary_dim = c.head_dim;
  // arch "qwen2": NeoX pairs and Q/K/V biases, as from_gguf reads a qwen2 file.
  const bool qwen2 = c.arch == "qwen2";
  c.rope.layout = qwen2 ? relokv::rope_layout::kNeoX : relokv::rope_layout::kGPTJ;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  auto vec = [&](int out, int in, float gain = 1.0f) {
    std::vector<float> w(static_cast<std::size_t>(out) * in);
    const float s = 1.0f / std::sqrt(static_cast<float>(in));
    for (auto& x : w) x = nd(rng) * s;
    if (gain != 1.0f)
      for (auto& x : w) x *= gain;
    return w;
  };
  auto mat = [&](int out, int in, float gain = 1.0f) {
    return qmatrix::owned(vec(out, in, gain), out, in);
  };
  auto ones = [](int n) { return std::vector<float>(static_cast<std::size_t>(n), 1.0f); };
  m.tok_emb = mat(c.vocab, c.dim);  // rows of norm ~1: the attention output is not drowned
  m.out_norm = ones(c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    llama_layer L;
    L.attn_norm = ones(c.dim);
    // Sharper attention than random init gives, so that context (and reusing KV computed in
    // another context) visibly changes the output.
    L.wq = mat(c.n_heads * c.head_dim, c.dim, 3.0f);
    L.wk = mat(c.n_kv_heads * c.head_dim, c.dim, 3.0f);
    L.wv = mat(c.n_kv_heads * c.head_dim, c.dim);
    if (qwen2) {
      L.bq = vec(1, c.n_heads * c.head_dim);
      L.bk = vec(1, c.n_kv_heads * c.head_dim);
      L.bv = vec(1, c.n_kv_heads * c.head_dim);
    }
    L.wo = mat(c.dim, c.n_heads * c.head_dim);
    L.ffn_norm = ones(c.dim);
    L.w_gate = mat(c.ffn, c.dim);
    L.w_up = mat(c.ffn, c.dim);
    L.w_down = mat(c.dim, c.ffn);
    m.layers.push_back(std::move(L));
  }
  const std::uint64_t shape[] = {seed,
                                 std::uint64_t(c.n_layers),
                                 std::uint64_t(c.dim),
                                 std::uint64_t(c.n_heads),
                                 std::uint64_t(c.n_kv_heads),
                                 std::uint64_t(c.head_dim),
                                 std::uint64_t(c.ffn),
                                 std::uint64_t(c.vocab),
                                 std::uint64_t(qwen2)};
  c.weights_id = XXH3_64bits(shape, sizeof shape);
  return m;
}

template <class P, class T>
struct llama_engine<P, T>::live_request {
  // The request's KV in the library's words: fetches, copies, (position, block, slot) of each
  // computed token, the last-token rule, decode's blocks, commit and release.
  std::optional<relokv::request_kv<cache_type, T>> req;
  kv_map map;  // position -> (block, slot) for the layer loop, indexed from req->blocks()
  std::vector<relokv::token_t> tokens;
  std::optional<grouped_reader> reader;  // APE requests: prefill's and decode's reader rows
};

namespace {
template <class P, class T>
typename llama_engine<P, T>::cache_type make_cache(const llama_model& m,
                                                   const relokv::host_kv_storage<T>& kv,
                                                   std::int32_t num_blocks, std::int32_t block_size,
                                                   relokv::any_store store) {
  using cache_t = typename llama_engine<P, T>::cache_type;
  if (!store) return cache_t(relokv::lru_block_pool(num_blocks), block_size);
  const relokv::store_options so{relokv::store_fingerprint(m.cfg.weights_id, m.cfg.rope, P::kind),
                                 kv.block_layout()};
  return cache_t(relokv::lru_block_pool(num_blocks), block_size, relokv::xxh3_128(),
                 relokv::recompute::any_strategy(), std::move(store), so);
}
}  // namespace

template <class P, class T>
llama_engine<P, T>::llama_engine(std::shared_ptr<const llama_model> model, std::int32_t num_blocks,
                                 std::int32_t block_size, relokv::any_store store)
    : model_(std::move(model)),
      rope_(model_->cfg.rope, 8192),
      kv_(relokv::kv_shape{model_->cfg.n_layers, num_blocks, model_->cfg.n_kv_heads, block_size,
                           model_->cfg.head_dim}),
      cache_(make_cache<P, T>(*model_, kv_, num_blocks, block_size, std::move(store))) {}

template <class P, class T>
std::uint64_t llama_engine<P, T>::store_fingerprint() const noexcept {
  return relokv::store_fingerprint(model_->cfg.weights_id, model_->cfg.rope, P::kind);
}

template <class P, class T>
llama_engine<P, T>::~llama_engine() = default;

template <class P, class T>
std::vector<float> llama_engine<P, T>::prefill(const relokv::request_layout& layout,
                                               const relokv::recompute::any_strategy& strategy,
                                               prefill_stats* stats) {
  if (live_) throw std::logic_error("llama_engine: end() the live request first");
  check_tokens(*model_, layout.tokens, "llama_engine::prefill");
  auto r = std::make_unique<live_request>();
  auto plan = cache_.plan(layout, strategy);
  if (!plan.ok())
    throw std::runtime_error("llama_engine: out of KV blocks (" +
                             std::to_string(plan.blocks_short) + " more needed)");
  // Writes the store's blocks, then performs the copies (which may read them).
  r->req.emplace(cache_, kv_, rope_, layout, std::move(plan));
  const relokv::reuse_plan& pl = r->req->plan();
  r->map.table.assign(r->req->blocks().begin(), r->req->blocks().end());
  r->map.index();
  r->tokens = layout.tokens;
  auto mask = pl.compute;
  const auto reused = pl.reused_mask();
  // The tokens to compute, by position. The library adds the last token when the plan reuses
  // it (its hidden state gives the logits) with write == false: its K/V are cached already,
  // in a block that may be shared.
  std::vector<std::int32_t> positions;
  std::int32_t no_write = -1;
  for (const relokv::token_slot& t : r->req->prefill_tokens()) {
    positions.push_back(t.pos());
    if (!t.writes()) no_write = t.pos();
  }
  if (stats) {
    stats->tokens = layout.num_tokens();
    stats->computed = static_cast<std::int32_t>(positions.size());
    stats->exact_hits = pl.exact_hits;
    stats->relocated_hits = pl.relocated_hits;
    stats->misses = pl.misses;
    stats->store_hits = pl.store_hits;
    stats->pool_blocks = stats->store_blocks = stats->computed_blocks = 0;
    for (const auto& pb : pl.blocks) {
      stats->pool_blocks += pb.tier == relokv::block_tier::kPool;
      stats->store_blocks += pb.tier == relokv::block_tier::kStore;
      stats->computed_blocks += pb.tier == relokv::block_tier::kComputed;
    }
  }
  std::vector<float> hidden;
  if (stats) {
    stats->token_layers = 0;
    stats->check_deviation.clear();
    stats->check_kept.clear();
  }
  // Tokens a combined strategy computes at every layer (EPIC's first k of first_k_and_topk).
  std::vector<std::uint8_t> pinned(mask.size(), 0);
  std::vector<relokv::block_status> status;
  for (const auto& pb : pl.blocks) status.push_back(pb.status);
  strategy.pin(layout, status, pinned);
  if (strategy.probes()) {
    // question_topk: the question first, over the spans as cached (the probe), then the
    // tokens its attention chose with everything computed anyway, as a static mask. The
    // probe's work counts: its tokens are computed twice.
    const auto keep = [&](const std::vector<std::uint8_t>& m) {
      std::vector<std::int32_t> out;
      for (std::size_t i = 0; i < positions.size(); ++i)
        if (m[static_cast<std::size_t>(positions[i])] || i + 1 == positions.size())
          out.push_back(positions[i]);
      return out;
    };
    std::vector<std::uint8_t> base(mask.size()), rows(mask.size(), 0);
    for (std::size_t t = 0; t < mask.size(); ++t)
      base[t] = mask[t] && (!reused[t] || pinned[t]) ? 1 : 0;
    strategy.query_rows(layout, rows);
    std::vector<float> mass(mask.size(), 0.0f);
    const mass_probe probe{&rows, &mass, &strategy};
    run_layers<P, T>(*model_, rope_, kv_, r->map, keep(base), r->tokens, no_write, nullptr, nullptr,
                     nullptr, hidden, stats, nullptr, false, &probe);
    strategy.choose(mass, reused, mask, pinned);
    positions = keep(mask);
    if (stats) {
      stats->computed = static_cast<std::int32_t>(positions.size());
      stats->check_deviation = mass;
      stats->check_kept = mask;
    }
    run_layers<P, T>(*model_, rope_, kv_, r->map, std::move(positions), r->tokens, no_write,
                     nullptr, nullptr, nullptr, hidden, stats);
  } else {
    if (const auto* a = strategy.grouped()) r->reader.emplace(grouped_reader{*a, layout});
    run_layers<P, T>(*model_, rope_, kv_, r->map, std::move(positions), r->tokens, no_write, &mask,
                     &reused, &strategy, hidden, stats, &pinned, false, nullptr,
                     r->reader ? &*r->reader : nullptr);
  }
  live_ = std::move(r);
  return head(*model_, hidden, /*decode=*/false);
}

template <class P, class T>
std::vector<float> llama_engine<P, T>::decode(relokv::token_t token) {
  if (!live_) throw std::logic_error("llama_engine: decode needs a prefilled request");
  check_tokens(*model_, {&token, 1}, "llama_engine::decode");
  live_request& r = *live_;
  const auto slot = r.req->append_token();  // the open block, or a new one (cache.extend)
  if (!slot) throw std::runtime_error("llama_engine: out of KV blocks during decode");
  const relokv::pos_t pos = slot->pos();
  r.tokens.push_back(token);
  r.map.table.assign(r.req->blocks().begin(), r.req->blocks().end());
  r.map.index();
  std::vector<float> hidden;
  run_layers<P, T>(*model_, rope_, kv_, r.map, {pos}, r.tokens, -1, nullptr, nullptr, nullptr,
                   hidden, nullptr, nullptr, /*decode=*/true, nullptr,
                   r.reader ? &*r.reader : nullptr);
  return head(*model_, hidden, /*decode=*/true);
}

template <class P, class T>
std::vector<relokv::token_t> llama_engine<P, T>::generate(const std::vector<float>& first_logits,
                                                          std::int32_t max_tokens,
                                                          relokv::token_t stop) {
  std::vector<relokv::token_t> out;
  relokv::token_t t = argmax(first_logits);
  for (std::int32_t i = 0; i < max_tokens; ++i) {
    out.push_back(t);
    if (t == stop) break;
    if (i + 1 < max_tokens) t = argmax(decode(t));
  }
  return out;
}

template <class P, class T>
void llama_engine<P, T>::end(bool commit) {
  if (!live_) return;
  if (commit) live_->req->commit();  // and writes new blocks to the store, when there is one
  live_.reset();                     // ~request_kv releases the request
}

template class llama_engine<relokv::pre_rotated, relokv::bf16>;
template class llama_engine<relokv::at_attention, relokv::bf16>;
template class llama_engine<relokv::block_relative, relokv::bf16>;
template class llama_engine<relokv::pre_rotated, float>;
template class llama_engine<relokv::at_attention, float>;
template class llama_engine<relokv::block_relative, float>;

template <class T>
struct contiguous_prefill<T>::state {
  std::shared_ptr<const llama_model> model;
  std::int32_t max_tokens;
  relokv::rope_table rope;
  relokv::host_kv_storage<T> kv;
  kv_map map;
  std::vector<std::int32_t> positions;
  std::vector<float> hidden;
  state(std::shared_ptr<const llama_model> m, std::int32_t n)
      : model(std::move(m)),
        max_tokens(n),
        rope(model->cfg.rope, n),
        kv(relokv::kv_shape{model->cfg.n_layers, 1, model->cfg.n_kv_heads, n,
                            model->cfg.head_dim}) {}
};

template <class T>
contiguous_prefill<T>::contiguous_prefill(std::shared_ptr<const llama_model> m,
                                          std::int32_t max_tokens) {
  if (!m) throw std::invalid_argument("contiguous_prefill: no model");
  if (max_tokens < 1)
    throw std::invalid_argument("contiguous_prefill: max_tokens must be at least 1");
  s_ = std::make_unique<state>(std::move(m), max_tokens);
}
template <class T>
contiguous_prefill<T>::~contiguous_prefill() = default;
template <class T>
contiguous_prefill<T>::contiguous_prefill(contiguous_prefill&&) noexcept = default;
template <class T>
contiguous_prefill<T>& contiguous_prefill<T>::operator=(contiguous_prefill&&) noexcept = default;

template <class T>
std::vector<float> contiguous_prefill<T>::operator()(const std::vector<relokv::token_t>& tokens) {
  if (!s_) throw std::logic_error("contiguous_prefill: used after move");
  state& s = *s_;
  check_tokens(*s.model, tokens, "contiguous_prefill");
  const auto n = static_cast<std::int32_t>(tokens.size());
  if (n < 1 || n > s.max_tokens)
    throw std::invalid_argument("contiguous_prefill: " + std::to_string(n) + " tokens, not 1 to " +
                                std::to_string(s.max_tokens));
  // One block, as long as this prompt, in the buffer allocated for the longest.
  s.map.table = {{0, 0, n}};
  s.map.index();
  s.positions.resize(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) s.positions[static_cast<std::size_t>(i)] = i;
  run_layers<relokv::pre_rotated, T>(*s.model, s.rope, s.kv, s.map, s.positions, tokens, -1,
                                     nullptr, nullptr, nullptr, s.hidden);
  return head(*s.model, s.hidden, /*decode=*/false);
}

template class contiguous_prefill<relokv::bf16>;
template class contiguous_prefill<float>;

std::vector<float> plain_prefill(const llama_model& m, const std::vector<relokv::token_t>& tokens) {
  // The model is borrowed for the call: an aliasing pointer that owns nothing.
  const std::shared_ptr<const llama_model> borrowed(std::shared_ptr<const llama_model>{}, &m);
  contiguous_prefill<float> run(
      borrowed, std::max<std::int32_t>(static_cast<std::int32_t>(tokens.size()), 1));
  return run(tokens);
}

std::size_t llama_model::weight_bytes() const {
  std::size_t n = tok_emb.bytes() + output.bytes();
  for (const llama_layer& L : layers)
    for (const qmatrix* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      n += w->bytes();
  return n;
}

relokv::token_t argmax(const std::vector<float>& logits) {
  return static_cast<relokv::token_t>(std::max_element(logits.begin(), logits.end()) -
                                      logits.begin());
}

}  // namespace relokv_engine
