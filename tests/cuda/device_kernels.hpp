#pragma once
// Plain host functions (compiled by nvcc in device_kernels.cu) that run relokv's CUDA kernels
// on host data, so that the Catch2 tests stay in a .cpp compiled by the host compiler.
#include <relokv/attention_group.hpp>
#include <relokv/cache/reuse_plan.hpp>
#include <relokv/concepts/rope_placement.hpp>
#include <relokv/dtype.hpp>
#include <relokv/memory/host_kv_storage.hpp>
#include <relokv/recompute/deviation.hpp>
#include <relokv/rope/rope_config.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace relokv_test {

/// Number of CUDA devices (0 when there is none or no driver); `why` says what was found.
int cuda_device_count(std::string& why);

struct device_attention_args {
  relokv::placement_kind placement = relokv::placement_kind::kAtAttention;
  relokv::dtype type = relokv::dtype::kBF16;
  relokv::rope_config rope;
  std::int32_t max_position = 4096;
  relokv::kv_shape shape;          // one layer
  std::vector<std::uint8_t> pool;  // bytes of the layer, host layout
  std::vector<relokv::block_entry> entries;
  std::vector<std::int32_t> indptr;
  std::vector<float> q;
  std::vector<relokv::pos_t> q_pos;
  std::vector<std::int32_t> q_indptr;  // empty: decode
  std::int32_t num_q_heads = 0;
  float scale = 1.0f;
  std::int32_t window = 0;       // sliding window (0: none)
  std::int32_t num_splits = -1;  // -1: no workspace (one CTA per token and KV head); 0: the
                                 // kernel chooses; n: n splits
};

/// relokv::cuda::kMaxSplits (the .cuh is not included by the host-compiled tests).
std::int32_t max_splits();

/// Runs the device paged attention; throws with the CUDA error text on failure. lse (when
/// given) receives the rows' log-sum-exps.
std::vector<float> device_attention(const device_attention_args& a,
                                    std::vector<float>* lse = nullptr);

/// Runs the device grouped attention (APE) of one sequence (a.indptr = {0, blocks}).
std::vector<float> device_grouped_attention(const device_attention_args& a,
                                            const std::vector<relokv::attention_group>& groups);

/// Runs device kv-append on a zeroed pool; returns the pool bytes.
std::vector<std::uint8_t> device_append(relokv::placement_kind placement, relokv::dtype type,
                                        const relokv::rope_config& rope,
                                        const relokv::kv_shape& shape, const std::vector<float>& k,
                                        const std::vector<float>& v,
                                        const std::vector<relokv::block_id>& blocks,
                                        const std::vector<std::int32_t>& slots,
                                        const std::vector<relokv::pos_t>& positions);

/// Runs device relocation (pre_rotated delta rotation) or plain copies on a pool.
std::vector<std::uint8_t> device_copies(relokv::dtype type, const relokv::rope_config& rope,
                                        const relokv::kv_shape& shape,
                                        std::vector<std::uint8_t> pool,
                                        const std::vector<relokv::block_copy>& copies, bool rotate);

/// Device deviation (bf16 cached rows) and top-k selection.
std::vector<float> device_deviation(relokv::deviation_metric metric,
                                    const std::vector<relokv::bf16>& ck,
                                    const std::vector<relokv::bf16>& cv,
                                    const std::vector<float>& fk, const std::vector<float>& fv,
                                    std::int32_t n, std::int32_t width);
std::vector<std::uint8_t> device_topk(const std::vector<float>& score,
                                      const std::vector<std::uint8_t>& eligible, std::int32_t k);

}  // namespace relokv_test
