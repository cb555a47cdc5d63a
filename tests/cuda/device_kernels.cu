// Host wrappers around relokv's CUDA kernels for the [gpu] tests (see device_kernels.hpp).
#include <relokv/cuda/deviation.cuh>
#include <relokv/cuda/grouped_attention.cuh>
#include <relokv/cuda/kv_ops.cuh>
#include <relokv/cuda/paged_attention.cuh>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <stdexcept>

#include "device_kernels.hpp"

namespace relokv_test {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// A device buffer holding a copy of a host vector.
template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::size_t count) : n(count) {
    if (n) check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  }
  explicit dbuf(const std::vector<T>& h) : dbuf(h.size()) {
    if (n) check(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), "H2D");
  }
  ~dbuf() { cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    if (n) check(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
    return h;
  }
};

template <class F>
void with_placement(relokv::placement_kind k, F&& f) {
  switch (k) {
    case relokv::placement_kind::kPreRotated:
      return f(relokv::pre_rotated{});
    case relokv::placement_kind::kAtAttention:
      return f(relokv::at_attention{});
    case relokv::placement_kind::kBlockRelative:
      return f(relokv::block_relative{});
  }
}
template <class F>
void with_dtype(relokv::dtype t, F&& f) {
  switch (t) {
    case relokv::dtype::kF32:
      return f(float{});
    case relokv::dtype::kBF16:
      return f(relokv::bf16{});
    case relokv::dtype::kF16:
      return f(relokv::fp16{});
  }
}

template <class T>
relokv::paged_kv_view<T> view(T* p, const relokv::kv_shape& s) {
  return {p, s.num_blocks, s.num_kv_heads, s.block_size, s.head_dim};
}

}  // namespace

int cuda_device_count(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    why = cudaGetErrorString(e);
    return 0;
  }
  why = std::to_string(n) + " device(s)";
  return n;
}

std::vector<float> device_attention(const device_attention_args& a, std::vector<float>* lse) {
  std::vector<float> out;
  with_placement(a.placement, [&](auto placement) {
    using P = decltype(placement);
    with_dtype(a.type, [&](auto tag) {
      using T = decltype(tag);
      const relokv::rope_table host_rope(a.rope, a.max_position);
      const relokv::cuda::device_rope_table rope(host_rope);
      dbuf<std::uint8_t> pool(a.pool);
      dbuf<relokv::block_entry> entries(a.entries);
      dbuf<std::int32_t> indptr(a.indptr), q_indptr(a.q_indptr);
      dbuf<float> q(a.q);
      dbuf<relokv::pos_t> q_pos(a.q_pos);
      const auto tokens = static_cast<std::int32_t>(a.q_pos.size());
      dbuf<float> o(static_cast<std::size_t>(tokens) * a.num_q_heads * a.shape.head_dim);
      relokv::cuda::attention_params<T> p;
      p.rope = rope.view();
      p.kv = view(reinterpret_cast<const T*>(pool.p), a.shape);
      p.table = {entries.p, indptr.p, static_cast<std::int32_t>(a.indptr.size()) - 1};
      p.q = q.p;
      p.q_pos = q_pos.p;
      p.q_indptr = a.q_indptr.empty() ? nullptr : q_indptr.p;
      p.num_tokens = tokens;
      p.num_q_heads = a.num_q_heads;
      p.scale = a.scale;
      p.out = o.p;
      dbuf<float> l(lse != nullptr ? static_cast<std::size_t>(tokens) * a.num_q_heads : 0);
      p.lse = l.p;
      p.window = a.window;
      dbuf<float> ws(a.num_splits < 0
                         ? 0
                         : relokv::cuda::split_workspace_floats(
                               tokens, a.num_q_heads, a.shape.head_dim,
                               a.num_splits > 0 ? a.num_splits : relokv::cuda::kMaxSplits));
      if (a.num_splits >= 0) {
        p.workspace = ws.p;
        p.workspace_floats = relokv::cuda::split_workspace_floats(
            tokens, a.num_q_heads, a.shape.head_dim,
            a.num_splits > 0 ? a.num_splits : relokv::cuda::kMaxSplits);
        p.num_splits = a.num_splits;
      }
      if (auto s = relokv::cuda::can_implement(p); !s) throw std::runtime_error(s.reason);
      check(relokv::cuda::paged_attention<P, T>(p, nullptr), "paged_attention");
      check(cudaDeviceSynchronize(), "paged_attention (sync)");
      out = o.get();
      if (lse != nullptr) *lse = l.get();
    });
  });
  return out;
}

std::int32_t max_splits() { return relokv::cuda::kMaxSplits; }

std::vector<float> device_grouped_attention(const device_attention_args& a,
                                            const std::vector<relokv::attention_group>& groups) {
  std::vector<float> out;
  with_placement(a.placement, [&](auto placement) {
    using P = decltype(placement);
    with_dtype(a.type, [&](auto tag) {
      using T = decltype(tag);
      const relokv::rope_table host_rope(a.rope, a.max_position);
      const relokv::cuda::device_rope_table rope(host_rope);
      dbuf<std::uint8_t> pool(a.pool);
      dbuf<relokv::block_entry> entries(a.entries);
      dbuf<std::int32_t> indptr(a.indptr), q_indptr(a.q_indptr);
      dbuf<float> q(a.q);
      dbuf<relokv::pos_t> q_pos(a.q_pos);
      const auto tokens = static_cast<std::int32_t>(a.q_pos.size());
      const auto rows = static_cast<std::size_t>(tokens) * a.num_q_heads;
      dbuf<float> o(rows * a.shape.head_dim), part(rows * a.shape.head_dim), part_lse(rows),
          acc_lse(rows);
      dbuf<std::int32_t> ind(2 * groups.size());
      relokv::cuda::attention_params<T> p;
      p.rope = rope.view();
      p.kv = view(reinterpret_cast<const T*>(pool.p), a.shape);
      p.table = {entries.p, indptr.p, 1};
      p.q = q.p;
      p.q_pos = q_pos.p;
      p.q_indptr = a.q_indptr.empty() ? nullptr : q_indptr.p;
      p.num_tokens = tokens;
      p.num_q_heads = a.num_q_heads;
      p.scale = a.scale;
      p.out = o.p;
      const relokv::cuda::grouped_scratch s{part.p, part_lse.p, acc_lse.p, ind.p};
      check(relokv::cuda::grouped_attention<P, T>(p, groups, a.indptr.back(), s, nullptr),
            "grouped_attention");
      check(cudaDeviceSynchronize(), "grouped_attention (sync)");
      out = o.get();
    });
  });
  return out;
}

std::vector<std::uint8_t> device_append(relokv::placement_kind placement, relokv::dtype type,
                                        const relokv::rope_config& rope_cfg,
                                        const relokv::kv_shape& shape, const std::vector<float>& k,
                                        const std::vector<float>& v,
                                        const std::vector<relokv::block_id>& blocks,
                                        const std::vector<std::int32_t>& slots,
                                        const std::vector<relokv::pos_t>& positions) {
  std::vector<std::uint8_t> out;
  with_placement(placement, [&](auto pl) {
    using P = decltype(pl);
    with_dtype(type, [&](auto tag) {
      using T = decltype(tag);
      const relokv::rope_table host_rope(rope_cfg, 4096);
      const relokv::cuda::device_rope_table rope(host_rope);
      dbuf<std::uint8_t> pool(shape.layer_elems() * sizeof(T));
      check(cudaMemset(pool.p, 0, pool.n), "memset");
      dbuf<float> dk(k), dv(v);
      dbuf<relokv::block_id> db(blocks);
      dbuf<std::int32_t> ds(slots);
      dbuf<relokv::pos_t> dp(positions);
      relokv::cuda::append_params<T> p;
      p.rope = rope.view();
      p.kv = view(reinterpret_cast<T*>(pool.p), shape);
      p.k = dk.p;
      p.v = dv.p;
      p.blocks = db.p;
      p.slots = ds.p;
      p.positions = dp.p;
      p.n = static_cast<std::int32_t>(blocks.size());
      check(relokv::cuda::append_kv<P, T>(p, nullptr), "append_kv");
      check(cudaDeviceSynchronize(), "append_kv (sync)");
      out = pool.get();
    });
  });
  return out;
}

std::vector<std::uint8_t> device_copies(relokv::dtype type, const relokv::rope_config& rope_cfg,
                                        const relokv::kv_shape& shape,
                                        std::vector<std::uint8_t> pool_bytes,
                                        const std::vector<relokv::block_copy>& copies,
                                        bool rotate) {
  std::vector<std::uint8_t> out;
  with_dtype(type, [&](auto tag) {
    using T = decltype(tag);
    const relokv::rope_table host_rope(rope_cfg, 4096);
    const relokv::cuda::device_rope_table rope(host_rope);
    dbuf<std::uint8_t> pool(pool_bytes);
    dbuf<relokv::block_copy> dc(copies);
    const auto kv = view(reinterpret_cast<T*>(pool.p), shape);
    if (rotate) {
      relokv::cuda::relocate_params<T> p{rope.view(), kv, dc.p,
                                         static_cast<std::int32_t>(copies.size())};
      check(relokv::cuda::relocate_blocks<T>(p, nullptr), "relocate_blocks");
    } else {
      check(
          relokv::cuda::copy_blocks<T>(kv, dc.p, static_cast<std::int32_t>(copies.size()), nullptr),
          "copy_blocks");
    }
    check(cudaDeviceSynchronize(), "copies (sync)");
    out = pool.get();
  });
  return out;
}

std::vector<float> device_deviation(relokv::deviation_metric metric,
                                    const std::vector<relokv::bf16>& ck,
                                    const std::vector<relokv::bf16>& cv,
                                    const std::vector<float>& fk, const std::vector<float>& fv,
                                    std::int32_t n, std::int32_t width) {
  dbuf<relokv::bf16> dck(ck), dcv(cv);
  dbuf<float> dfk(fk), dfv(fv), out(static_cast<std::size_t>(n));
  check(relokv::cuda::token_deviation(metric, dck.p, dcv.p, dfk.p, dfv.p, n, width, out.p, nullptr),
        "token_deviation");
  check(cudaDeviceSynchronize(), "token_deviation (sync)");
  return out.get();
}

std::vector<std::uint8_t> device_topk(const std::vector<float>& score,
                                      const std::vector<std::uint8_t>& eligible, std::int32_t k) {
  const auto n = static_cast<std::int32_t>(score.size());
  dbuf<float> ds(score);
  dbuf<std::uint8_t> de(eligible), mask(score.size());
  check(cudaMemset(mask.p, 0, mask.n), "memset");
  const std::size_t bytes = relokv::cuda::select_topk_workspace(n);
  dbuf<std::uint8_t> ws(bytes);
  check(relokv::cuda::select_topk(ds.p, de.p, n, k, mask.p, ws.p, bytes, nullptr), "select_topk");
  check(cudaDeviceSynchronize(), "select_topk (sync)");
  return mask.get();
}

}  // namespace relokv_test
