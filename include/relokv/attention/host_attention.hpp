#pragma once
/// @file
/// Host paged attention that applies RoPE where the placement says: decode (one query per
/// sequence) and prefill (many queries at arbitrary, possibly scattered positions), causal by
/// logical position; GQA/MQA; fp32, bf16 and fp16 storage with fp32 accumulation; online
/// softmax. These kernels serve CPU engines and are the oracle for the CUDA kernels.
///
/// Loop structure per query: blocks outer, KV heads inner, the query heads of a GQA group
/// innermost, so every key and value is read once per query position and group, not once per
/// query head. The inner loops (conversion, rotation, dot products, exp, V accumulation) are
/// written with fixed-width lane arrays so that they vectorize without -ffast-math. Decode on
/// the bf16 fast path goes in spans of up to 64 slots (bf16_decode_spans): scores of the span
/// for every KV head of the call, one online-softmax step per query head, then P.V, with the
/// span's values and the next span's keys prefetched meanwhile.
///
/// Threads: the kernels own none. Calls over disjoint kv_head_ranges write disjoint rows;
/// calls over disjoint parts of a sequence's blocks return each row's log-sum-exp (`lse`) and
/// merge_attention_states folds them (the split for MQA and for long single sequences).
///
/// Numerics on AVX512_BF16 hosts with bf16 storage (opt out with RELOKV_NO_BF16_DOT): products
/// of bf16 values with fp32 sums; the query and the softmax weights are rounded to bf16, and
/// at_attention (NeoX over the whole head) rotates each key by its offset in the block with
/// bf16 (cos, sin) pairs and the query by R(m - pos0) once per block, in fp32.
///
/// Layout: params.hpp (attention_params, can_implement, paged_attention: the entry point),
/// decode.hpp and prefill.hpp (positional overloads forwarding to it), state.hpp (merging
/// parts of a sequence), softmax.hpp (the online-softmax state arithmetic, shared with the
/// CUDA kernels), kv_head_range.hpp. detail/attend_group.hpp's with_path picks a path once per
/// call, as a tag type (portable_path in detail/portable.hpp, simd_f32_path in
/// detail/simd_f32.hpp, avx512_bf16_path in detail/avx512_bf16.hpp), which share
/// detail/kernel_common.hpp (scratch, exp, rotations) and detail/prefetch.hpp.
#include "relokv/attention/decode.hpp"
#include "relokv/attention/kv_head_range.hpp"
#include "relokv/attention/params.hpp"
#include "relokv/attention/prefill.hpp"
#include "relokv/attention/state.hpp"
