#pragma once
// The calls of an engine of live sequences, below both engines (llama_engine.hpp, relokv's own;
// examples/llama_cpp/llama_cpp_engine.hpp, relokv inside llama.cpp) and above what drives them
// (the server's serving loop, the QA job): open a request, compute its prompt in steps, commit
// it for reuse, append and decode tokens of many sequences in one forward, close. What a
// prefill did (prefill_stats) and a pool that cannot hold a request now (out_of_blocks) are
// part of it.
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <relokv/hash/block_keys.hpp>
#include <relokv/layout/request_layout.hpp>
#include <relokv/recompute/any_strategy.hpp>
#include <relokv/types.hpp>

namespace relokv_engine {

/// What one prefill did.
struct prefill_stats {
  std::int32_t tokens = 0;
  std::int32_t computed = 0;      ///< tokens computed at the first layer
  std::int64_t token_layers = 0;  ///< tokens computed, summed over the layers (the work done)
  /// Dynamic strategies, per logical position: the deviation measured at the first check
  /// layer (0 where not measured), and the tokens still computed after that check.
  std::vector<float> check_deviation;
  std::vector<std::uint8_t> check_kept;
  std::int32_t exact_hits = 0, relocated_hits = 0, misses = 0;
  std::int32_t store_hits = 0;  ///< hits fetched from the store (within exact + relocated)
  /// Blocks by where their K and V came from (reuse_plan's tiers): the pool, the store, or
  /// computed by this request (misses, and hits recomputed whole).
  std::int32_t pool_blocks = 0, store_blocks = 0, computed_blocks = 0;
};

/// The pool cannot hold what a request asks for now: a scheduler waits for blocks to come
/// back (or preempts a sequence) and asks again; nothing of the request was kept.
struct out_of_blocks : std::runtime_error {
  out_of_blocks(const std::string& what, std::int32_t more)
      : std::runtime_error(what), blocks_short(more) {}
  std::int32_t blocks_short;  ///< blocks missing (0: unknown)
};

/// An engine of live sequences. One thread drives it (it owns its cache).
///
/// The virtual calls are what an engine implements; prefill(), decode(), generate() and end()
/// are the one-request loop over them (the QA job's, the tests', Python's relokv.Engine), the
/// same on every engine.
class sequence_engine {
 public:
  using seq_id = std::int32_t;
  virtual ~sequence_engine() = default;

  /// Plans a request (reuse by `strategy`, keys salted by `extras`, sent by `principal`) and
  /// loads its reused blocks; it is live until close(). `stats`, when given, gets the plan's
  /// counts (prefill_step adds the work).
  /// @throws out_of_blocks when the pool cannot hold it now (nothing kept)
  virtual seq_id open(const relokv::request_layout& layout,
                      const relokv::recompute::any_strategy& strategy, prefill_stats* stats,
                      const relokv::extra_keys& extras, std::uint64_t principal) = 0;
  /// Computes up to `max_rows` more prompt rows; the last token's logits once the prompt is
  /// done, else an empty vector.
  virtual std::vector<float> prefill_step(seq_id s, std::int32_t max_rows,
                                          prefill_stats* stats) = 0;
  /// Registers a prefilled sequence's prompt for reuse while it decodes. Idempotent.
  virtual void commit(seq_id s) = 0;
  /// Reserves the next position of a prefilled sequence for `token`; false when the pool has
  /// no block for it now (nothing changed).
  [[nodiscard]] virtual bool append(seq_id s, relokv::token_t token) = 0;
  /// The appended token of every sequence in `seqs` in one forward: their logits, in order.
  virtual std::vector<std::vector<float>> decode_step(std::span<const seq_id> seqs) = 0;
  /// Ends a sequence (`commit`: its blocks stay for later requests). Unknown ids are ignored.
  virtual void close(seq_id s, bool commit) = 0;
  /// Live sequences.
  [[nodiscard]] virtual std::int32_t live() const noexcept = 0;
  /// The model's layers (a prefill's work is counted in tokens times layers).
  [[nodiscard]] virtual std::int32_t n_layers() const noexcept = 0;

  // The one-request loop: a live sequence of its own, opened by prefill() and closed by end().

  /// open() and the whole prompt in one prefill_step(): the logits of its last token. The
  /// request stays live for decode() until end().
  /// @throws std::logic_error while the loop's request is live (end() it first); what open()
  ///         and prefill_step() throw (the sequence is closed, uncommitted, then)
  std::vector<float> prefill(const relokv::request_layout& layout,
                             const relokv::recompute::any_strategy& strategy,
                             prefill_stats* stats = nullptr, const relokv::extra_keys& extras = {},
                             std::uint64_t principal = 0);
  /// append() and decode_step() of the loop's request: the next logits.
  /// @throws std::logic_error without a live request; out_of_blocks when no block is free for
  ///         the token (the request stays live: end() it, or free blocks and call again)
  std::vector<float> decode(relokv::token_t token);
  /// Greedy generation from `first_logits`: up to max_tokens, stopping after `stop` (if >= 0).
  std::vector<relokv::token_t> generate(const std::vector<float>& first_logits,
                                        std::int32_t max_tokens, relokv::token_t stop = -1);
  /// close() of the loop's request (`commit`: its blocks stay for later requests); nothing
  /// when none is live.
  void end(bool commit = true);
  /// The loop's live sequence, or -1.
  [[nodiscard]] seq_id current() const noexcept { return current_; }

 protected:
  sequence_engine() = default;
  sequence_engine(const sequence_engine&) = default;
  sequence_engine& operator=(const sequence_engine&) = default;

 private:
  seq_id current_ = -1;
};

/// Index of the largest logit.
relokv::token_t argmax(const std::vector<float>& logits);

}  // namespace relokv_engine
