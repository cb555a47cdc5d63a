#pragma once
// relokv_server's executor: the only caller of the engine (its sequence calls,
// examples/engine/sequence.hpp, and the server's serving_engine.hpp). It opens a
// request the scheduler admitted (fetching its store entries off the loop's thread first,
// compiling its spans alone under --compile-spans alone), computes prompt chunks and decode
// rows, and closes sequences; it counts what each request's prefill cost into its job.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <relokv/recompute/any_strategy.hpp>
#include <relokv/recompute/full.hpp>

#include "metrics.hpp"
#include "request_state.hpp"
#include "serving_engine.hpp"

namespace relokv_server {

class executor {
 public:
  executor(serving_engine& eng, metrics& m, std::int32_t prefill_chunk, bool compile_alone);

  /// What opening a request came to.
  struct open_result {
    enum class kind {
      opened,    ///< open in the engine: prefilling from the next chunk
      fetching,  ///< its store entries are on their way (their arrival wakes the loop)
      no_room,   ///< the pool cannot hold it now
      failed,    ///< refused (status 400) or the engine failed (500): `message` says why
    } k = kind::opened;
    int status = 0;
    std::string message;
  };
  /// Opens `r` (its plain prompt, or its full prompt with full recompute once escalated; its
  /// answer so far continuing the question after a preemption). `wake` runs on the fetching
  /// thread when a fetch it started is ready.
  open_result open(request_state& r, const std::function<void()>& wake);
  /// One chunk of at most `rows` prompt rows of `r`; its first token's logits when the prompt is
  /// done, else empty.
  std::vector<float> prefill(request_state& r, std::int32_t rows);
  /// Registers `r`'s prefilled prompt for reuse while it decodes.
  void commit_prompt(request_state& r) { seqs_.commit(r.seq); }
  /// Feeds r.next; false when no block holds it (nothing changed).
  [[nodiscard]] bool append(request_state& r) { return seqs_.append(r.seq, r.next); }
  /// One decode row of every request in `rows` (each appended), in one forward.
  std::vector<std::vector<float>> decode(std::span<request_state* const> rows);
  /// Closes `r`'s sequence if it is open (`commit`: its blocks stay for later requests).
  void close(request_state& r, bool commit);
  [[nodiscard]] std::int32_t live() const { return seqs_.live(); }
  [[nodiscard]] std::int32_t max_live() const { return eng_.max_live(); }
  [[nodiscard]] cache_snapshot snapshot() const { return eng_.snapshot(); }

 private:
  /// --compile-spans alone: the prompt's spans compiled alone (and committed) before it opens;
  /// returns the token-layers computed. Stops at the first that cannot open.
  std::int64_t compile_alone(const built_prompt& p, const job& j);

  serving_engine& eng_;
  relokv_engine::sequence_engine& seqs_;  ///< the engine's sequence calls
  metrics& metrics_;
  std::int32_t prefill_chunk_;
  bool compile_alone_;
  const relokv::recompute::any_strategy full_{relokv::recompute::full{}};
};

}  // namespace relokv_server
