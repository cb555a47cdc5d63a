#pragma once
/// @file
/// Vocabulary types shared by every relokv header.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "relokv/config.hpp"

RELOKV_NAMESPACE_BEGIN

/// A token id as the engine's tokenizer produces it.
using token_t = std::int32_t;
/// Index of a physical KV block in a pool.
using block_id = std::int32_t;
/// Logical position of a token in a request (what RoPE sees).
using pos_t = std::int32_t;
/// Handle of a planned request inside a relocatable_cache.
using request_id = std::uint64_t;
/// The id of no request: a failed plan carries it; commit and release reject it.
inline constexpr request_id kNoRequest = 0;

inline constexpr block_id kNoBlock = -1;
/// Largest head dimension any kernel accepts (the host kernels stage a row on the stack).
inline constexpr std::int32_t kMaxHeadDim = 1024;

/// Base of every exception relokv throws for bad input (never for exhausted resources, which
/// are reported as a status that a scheduler can act on).
class error : public std::invalid_argument {
 public:
  explicit error(const std::string& what) : std::invalid_argument("relokv: " + what) {}
};

/// What a can_implement says of a call: ok, or the reason it cannot run (host and CUDA).
struct support {
  bool ok = true;
  std::string reason;
  explicit operator bool() const noexcept { return ok; }
};

RELOKV_NAMESPACE_END
