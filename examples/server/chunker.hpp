#pragma once
// Spans found in plain prompts (relokv_server --spans auto): the prompt's own tokens cut where
// the text says a passage ends, so that a client that pastes its retrieved passages into the
// message text gets them reused wherever they come back. See docs/server.md "Spans in plain
// prompts".
//
// The cuts are made in the whole prompt's tokens (never by tokenizing pieces apart), so the
// tokens served are the tokens the prompt has without relokv: full recompute is exact. Where
// a tokenizer merges across a cut (a passage's last punctuation with the newlines after it),
// the same passage in another context ends in another token: its last block is a miss, never
// a wrong hit (its content key differs).
#include <cstdint>
#include <string>
#include <vector>

namespace relokv_server {

struct chunk_options {
  /// A chunk this long or longer is a relocatable span; shorter ones (labels, delimiter lines,
  /// the newlines between passages) are computed in every request (dependent segments).
  std::int32_t min_span = 32;
  /// A run this long without a separator is cut at content-defined anchors: a rolling hash of
  /// the last `anchor_window` token ids whose low bits are zero (one in `anchor_every`), at
  /// least `min_span` tokens after the previous cut. 0: no anchors.
  std::int32_t anchor_after = 512;
  std::int32_t anchor_window = 8;
  std::int32_t anchor_every = 128;
};

enum class chunk_kind : std::uint8_t { kPrefix, kSpan, kDependent, kQuestion };

struct chunk {
  chunk_kind kind;
  std::int32_t begin, end;  ///< token offsets, [begin, end)
};

/// Cuts a prompt's tokens (`pieces[i]` the bytes token i stands for) into chunks: the first is
/// the prefix, the last the question, the rest spans or dependent segments. A cut falls
/// before a token that starts a line (never a newline itself) when the text before it ends
///   - a blank line (two or more newlines in the whitespace before the token);
///   - a delimiter line (three or more of - = * _ ~ # + and nothing else);
///   - or when the line it starts is a delimiter line or a list item ("- ", "* ", "+ ", "• ",
///     "12. ", "3) ", "[4]");
/// and at content-defined anchors inside longer runs. The whitespace tokens that end a chunk
/// are a segment of their own (the newlines between passages differ between templates, the
/// passages do not). `forced` cuts come first: where a message's text starts (the template
/// before it is the prefix, and a span's key depends on what it was computed behind: the
/// prefix must not hold a passage). Returns one chunk (the prefix: exact reuse only) when no
/// span is found.
std::vector<chunk> find_chunks(const std::vector<std::int32_t>& ids,
                               const std::vector<std::string>& pieces,
                               const chunk_options& opt = {},
                               const std::vector<std::int32_t>& forced = {});

}  // namespace relokv_server
