// relokv_cuda_report: device figures, one `name value` line each (run where a GPU is present).
//   decode_bw_fraction_device   decode attention over a 32k-token bf16 context (32 query heads
//                               over 8 KV heads, head_dim 128), K/V bytes per second divided by
//                               a streaming read of the same bytes in the same run
//   rotate_overhead_*_device    decode time divided by the same kernel on pre-rotated keys
//   decode_split_speedup_device decode with the split-KV workspace (the kernel chooses the
//                               splits) over one CTA per KV head (no workspace)
//   decode_splits_device        the splits it chose
// Exits 77 (skipped) without a device.
#include <relokv/cuda/paged_attention.cuh>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/rope/at_attention.hpp>
#include <relokv/rope/block_relative.hpp>
#include <relokv/rope/pre_rotated.hpp>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

constexpr int kContext = 32768, kBlock = 16, kHq = 32, kHkv = 8, kDim = 128;

__global__ void stream_read(const uint4* p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

template <class F>
float median_ms(F&& f, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("relokv_cuda_report: no CUDA device; skipped\n");
    return 77;
  }
  relokv::rope_config cfg;
  cfg.head_dim = cfg.rotary_dim = kDim;
  cfg.theta = 500000;
  const relokv::rope_table host_rope(cfg, kContext + 1);
  const relokv::cuda::device_rope_table rope(host_rope);
  const relokv::kv_shape shape{1, kContext / kBlock, kHkv, kBlock, kDim};
  const std::size_t bytes = shape.layer_elems() * sizeof(relokv::bf16);
  relokv::bf16* pool = nullptr;
  cudaMalloc(&pool, bytes);
  cudaMemset(pool, 0x3c, bytes);  // finite bf16 values
  std::vector<relokv::block_entry> entries;
  for (int b = 0; b < shape.num_blocks; ++b) entries.push_back({b, b * kBlock, kBlock});
  const std::int32_t indptr[2] = {0, shape.num_blocks};
  const relokv::pos_t m = kContext;
  relokv::block_entry* dentries = nullptr;
  std::int32_t* dindptr = nullptr;
  relokv::pos_t* dpos = nullptr;
  float *dq = nullptr, *dout = nullptr;
  unsigned* sink = nullptr;
  cudaMalloc(&dentries, entries.size() * sizeof(relokv::block_entry));
  cudaMalloc(&dindptr, sizeof indptr);
  cudaMalloc(&dpos, sizeof m);
  cudaMalloc(&dq, kHq * kDim * sizeof(float));
  cudaMalloc(&dout, kHq * kDim * sizeof(float));
  cudaMalloc(&sink, sizeof(unsigned));
  cudaMemcpy(dentries, entries.data(), entries.size() * sizeof(relokv::block_entry),
             cudaMemcpyHostToDevice);
  cudaMemcpy(dindptr, indptr, sizeof indptr, cudaMemcpyHostToDevice);
  cudaMemcpy(dpos, &m, sizeof m, cudaMemcpyHostToDevice);
  cudaMemset(dq, 0, kHq * kDim * sizeof(float));

  relokv::cuda::attention_params<relokv::bf16> p;
  p.rope = rope.view();
  p.kv = {pool, shape.num_blocks, kHkv, kBlock, kDim};
  p.table = {dentries, dindptr, 1};
  p.q = dq;
  p.q_pos = dpos;
  p.num_tokens = 1;
  p.num_q_heads = kHq;
  p.scale = 0.088f;
  p.out = dout;
  const std::size_t ws_floats =
      relokv::cuda::split_workspace_floats(1, kHq, kDim, relokv::cuda::kMaxSplits);
  float* ws = nullptr;
  cudaMalloc(&ws, ws_floats * sizeof(float));
  auto decode = [&](auto placement) {
    using P = decltype(placement);
    return median_ms([&] { (void)relokv::cuda::paged_attention<P>(p, nullptr); }, 21);
  };
  const float t_single = decode(relokv::block_relative{});
  p.workspace = ws;
  p.workspace_floats = ws_floats;
  const int splits = relokv::cuda::choose_splits<relokv::block_relative>(p);
  const float t_stream = median_ms(
      [&] { stream_read<<<1024, 256>>>(reinterpret_cast<const uint4*>(pool), bytes / 16, sink); },
      21);
  const float t_pre = decode(relokv::pre_rotated{});
  const float t_at = decode(relokv::at_attention{});
  const float t_rel = decode(relokv::block_relative{});
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    std::fprintf(stderr, "relokv_cuda_report: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::printf("decode_bw_fraction_device %.3g\n", t_stream / t_rel);
  std::printf("decode_gbps_device %.4g\n", static_cast<double>(bytes) / (t_rel * 1e6));
  std::printf("stream_gbps_device %.4g\n", static_cast<double>(bytes) / (t_stream * 1e6));
  std::printf("rotate_overhead_at_attention_device %.3g\n", t_at / t_pre);
  std::printf("rotate_overhead_block_relative_device %.3g\n", t_rel / t_pre);
  std::printf("decode_split_speedup_device %.3g\n", t_single / t_rel);
  std::printf("decode_splits_device %d\n", splits);
  for (void* ptr : {static_cast<void*>(pool), static_cast<void*>(dentries),
                    static_cast<void*>(dindptr), static_cast<void*>(dpos), static_cast<void*>(dq),
                    static_cast<void*>(dout), static_cast<void*>(sink), static_cast<void*>(ws)})
    cudaFree(ptr);
  return 0;
}
