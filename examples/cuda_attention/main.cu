// Engine-side CUDA usage: an engine's own .cu explicitly instantiates the relokv kernels it
// needs (here: block_relative placement, bf16 KV) and launches them on its stream.
// Writes a 1k-token context with kv-append, relocates nothing (block_relative relocation is
// free: only pos0 in the block table changes), runs decode, checks against the host kernel.
#include <relokv/attention/host_attention.hpp>
#include <relokv/cuda/kv_ops.cuh>
#include <relokv/cuda/paged_attention.cuh>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/block_relative.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

// The instantiations this engine uses.
template cudaError_t relokv::cuda::paged_attention<relokv::block_relative, relokv::bf16>(
    const relokv::cuda::attention_params<relokv::bf16>&, cudaStream_t);
template cudaError_t relokv::cuda::append_kv<relokv::block_relative, relokv::bf16>(
    const relokv::cuda::append_params<relokv::bf16>&, cudaStream_t);

#define CHECK_CUDA(x)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (x);                                            \
    if (e_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_)); \
      return 1;                                                            \
    }                                                                      \
  } while (0)

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_attention: no CUDA device here; nothing to run (exit 77: skipped)\n");
    return 77;
  }
  constexpr int kTokens = 1024, kBlock = 16, kHkv = 8, kHq = 32, kDim = 128;
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = kDim;
  cfg.theta = 500000;
  const relokv::rope_table host_rope(cfg, 2 * kTokens);
  const relokv::cuda::device_rope_table rope(host_rope);
  const relokv::kv_shape shape{1, kTokens / kBlock, kHkv, kBlock, kDim};

  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<std::size_t>(kTokens) * kHkv * kDim), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  std::vector<relokv::block_id> blocks(kTokens);
  std::vector<std::int32_t> slots(kTokens);
  std::vector<relokv::pos_t> pos(kTokens);
  for (int t = 0; t < kTokens; ++t) {
    blocks[static_cast<std::size_t>(t)] = t / kBlock;
    slots[static_cast<std::size_t>(t)] = t % kBlock;
    pos[static_cast<std::size_t>(t)] = t;
  }

  relokv::bf16* pool = nullptr;
  float *dk = nullptr, *dv = nullptr, *dq = nullptr, *dout = nullptr;
  relokv::block_id* dblocks = nullptr;
  std::int32_t *dslots = nullptr, *dindptr = nullptr;
  relokv::pos_t *dpos = nullptr, *dqpos = nullptr;
  relokv::block_entry* dentries = nullptr;
  CHECK_CUDA(cudaMalloc(&pool, shape.layer_elems() * sizeof(relokv::bf16)));
  CHECK_CUDA(cudaMalloc(&dk, k.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dv, v.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dblocks, blocks.size() * sizeof(relokv::block_id)));
  CHECK_CUDA(cudaMalloc(&dslots, slots.size() * sizeof(std::int32_t)));
  CHECK_CUDA(cudaMalloc(&dpos, pos.size() * sizeof(relokv::pos_t)));
  CHECK_CUDA(cudaMemcpy(dk, k.data(), k.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dblocks, blocks.data(), blocks.size() * sizeof(relokv::block_id),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dslots, slots.data(), slots.size() * sizeof(std::int32_t),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(
      cudaMemcpy(dpos, pos.data(), pos.size() * sizeof(relokv::pos_t), cudaMemcpyHostToDevice));

  relokv::cuda::append_params<relokv::bf16> ap;
  ap.rope = rope.view();
  ap.kv = {pool, shape.num_blocks, kHkv, kBlock, kDim};
  ap.k = dk;
  ap.v = dv;
  ap.blocks = dblocks;
  ap.slots = dslots;
  ap.positions = dpos;
  ap.n = kTokens;
  CHECK_CUDA(relokv::cuda::append_kv<relokv::block_relative>(ap, nullptr));

  // The same blocks, read at a shifted position (as if the span were relocated by 300).
  std::vector<relokv::block_entry> entries;
  for (int b = 0; b < shape.num_blocks; ++b) entries.push_back({b, 300 + b * kBlock, kBlock});
  const std::int32_t indptr[2] = {0, shape.num_blocks};
  std::vector<float> q(kHq * kDim);
  for (auto& x : q) x = nd(rng);
  const relokv::pos_t m = 300 + kTokens;
  CHECK_CUDA(cudaMalloc(&dentries, entries.size() * sizeof(relokv::block_entry)));
  CHECK_CUDA(cudaMalloc(&dindptr, sizeof indptr));
  CHECK_CUDA(cudaMalloc(&dq, q.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dqpos, sizeof m));
  CHECK_CUDA(cudaMalloc(&dout, q.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(dentries, entries.data(), entries.size() * sizeof(relokv::block_entry),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dindptr, indptr, sizeof indptr, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dq, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dqpos, &m, sizeof m, cudaMemcpyHostToDevice));

  relokv::cuda::attention_params<relokv::bf16> p;
  p.rope = rope.view();
  p.kv = {pool, shape.num_blocks, kHkv, kBlock, kDim};
  p.table = {dentries, dindptr, 1};
  p.q = dq;
  p.q_pos = dqpos;
  p.num_tokens = 1;
  p.num_q_heads = kHq;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  p.out = dout;
  if (auto s = relokv::cuda::can_implement(p); !s) {
    std::fprintf(stderr, "cannot run: %s\n", s.reason.c_str());
    return 1;
  }
  CHECK_CUDA(relokv::cuda::paged_attention<relokv::block_relative>(p, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> out(q.size());
  CHECK_CUDA(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost));

  // Host oracle on the same pool bytes.
  relokv::host_kv_storage<relokv::bf16> host(shape);
  CHECK_CUDA(cudaMemcpy(host.data(), pool, host.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> want(q.size());
  relokv::decode_attention<relokv::block_relative>(
      host_rope, relokv::paged_kv_view<const relokv::bf16>(host.layer(0)),
      {entries.data(), indptr, 1}, q.data(), &m, kHq, p.scale, want.data());
  double err = 0;
  for (std::size_t i = 0; i < out.size(); ++i) err = std::fmax(err, std::fabs(out[i] - want[i]));
  std::printf("cuda_attention: decode over %d relocated tokens, max |device - host| = %.2e\n",
              kTokens, err);
  for (void* ptr :
       {static_cast<void*>(pool), static_cast<void*>(dk), static_cast<void*>(dv),
        static_cast<void*>(dblocks), static_cast<void*>(dslots), static_cast<void*>(dpos),
        static_cast<void*>(dentries), static_cast<void*>(dindptr), static_cast<void*>(dq),
        static_cast<void*>(dqpos), static_cast<void*>(dout)})
    cudaFree(ptr);
  return err < 1e-3 ? 0 : 1;
}
