#pragma once
// relokv_server's output processor: samples a request's next token from its logits, grows its
// text one token at a time, watches for stop tokens, stop strings and the length limit, and
// publishes to the job what the client may read (whole UTF-8 characters, never a prefix of a
// stop string). It calls no engine and builds no response: the HTTP side reads the job.
#include <optional>
#include <string>
#include <vector>

#include "metrics.hpp"
#include "request_state.hpp"
#include "tokenizer.hpp"

namespace relokv_server {

class output_processor {
 public:
  output_processor(const relokv_engine::tokenizer& tok, metrics& m);
  /// Samples `r`'s next token from `logits` and takes it: the reason the request ends ("stop":
  /// a stop token or string, "length"), or none (then r.next is the token, fed at the next
  /// decode, and the text so far is published).
  std::optional<std::string> accept(request_state& r, const std::vector<float>& logits);
  /// The request's end, published (its sequence closed before, so that a client that reads
  /// its answer and asks again finds the documents committed).
  void finish(request_state& r, const std::string& reason);
  /// The request's failure, published (`status`: the HTTP status it answers with).
  void fail(request_state& r, int status, const std::string& message);
  /// The token `logits` gives `r` at its temperature and top_p, drawn with its own generator.
  [[nodiscard]] static relokv::token_t sample(request_state& r, const std::vector<float>& logits);

 private:
  /// `text`: the answer so far, decoded once per token by the caller.
  void publish(request_state& r, const std::string& text, bool final);

  const relokv_engine::tokenizer& tok_;
  metrics& metrics_;
  std::vector<relokv::token_t> stops_;  // end of turn, end of text
};

}  // namespace relokv_server
