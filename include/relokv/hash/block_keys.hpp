#pragma once
/// @file
/// KVBoost dual keys: an exact context key and a relocatable content key per block.
///
/// Definitions (H = the hash scheme; all integers little-endian):
///  - root      = digest(le64 model_fingerprint || le64 adapter_id || le64 tenant_salt, kRoot)
///  - tokens(b) = digest(le32 token..., kTokens, tag(b)), where tag(b) = segment kind
///                | 0x100 if b starts its segment | dep_window << 9; so the segment structure,
///                not only the tokens, is part of every key
///  - context(b) = combine(b == 0 ? root : context(b-1), tokens(b), kContext)
///  - content(b):
///      prefix block, or a dependent segment bound to everything:   context(b)
///      first block of a span:     combine(ctx_id, tokens(b), kContent), where ctx_id is the
///                                 context key of the prefix's last block (root if none), or,
///                                 when the layout names a span_context, the context key the
///                                 last block of a prefix of those tokens would have
///      first block of a dependent segment bound to the last n tokens:
///                                 combine(win_id, tokens(b), kContent), where
///                                 win_id = combine(root, digest(le32 last n tokens, kWindow),
///                                                  kWindow)
///      any later block of a segment: combine(content(b-1), tokens(b), kContent)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "relokv/concepts/hash_scheme.hpp"
#include "relokv/layout/request_layout.hpp"

RELOKV_NAMESPACE_BEGIN

/// Keys that separate otherwise equal token streams: like vLLM's extra keys. Requests with
/// different extra keys never share a block.
struct extra_keys {
  std::uint64_t model_fingerprint = 0;
  std::uint64_t adapter_id = 0;
  std::uint64_t tenant_salt = 0;
  friend bool operator==(const extra_keys&, const extra_keys&) = default;
};

/// Keys of every block of one request.
template <hash_scheme H>
struct block_keys {
  using key_type = typename H::key_type;
  std::vector<key_type> context;  ///< exact keys, one per block
  std::vector<key_type> content;  ///< relocatable keys, one per block
  /// Per segment: the key of the context a span (or windowed dependent segment) is computed
  /// in; equal to root for other segments.
  std::vector<key_type> segment_context;
  key_type root{};
};

/// A block's segment structure as one integer: kind, whether it starts its segment, window.
[[nodiscard]] constexpr std::uint32_t block_tag(const segment& s, bool first) noexcept {
  return static_cast<std::uint32_t>(s.kind) | (first ? 0x100u : 0u) |
         (static_cast<std::uint32_t>(s.dep_window) << 9);
}

/// The root key: extra keys only.
template <hash_scheme H>
[[nodiscard]] typename H::key_type root_key(const H& h, const extra_keys& x) {
  const std::uint64_t w[3] = {x.model_fingerprint, x.adapter_id, x.tenant_salt};
  return h.digest(std::as_bytes(std::span<const std::uint64_t>(w)), hash_domain::kRoot);
}

/// Derives both keys of every block of `layout` into `out` (resized; capacity reused).
template <hash_scheme H>
void derive_block_keys(const H& h, const request_layout& layout, const extra_keys& extras,
                       block_keys<H>& out) {
  using key = typename H::key_type;
  const auto nb = static_cast<std::size_t>(layout.num_blocks());
  out.context.resize(nb);
  out.content.resize(nb);
  out.segment_context.assign(layout.segments.size(), key{});
  out.root = root_key(h, extras);

  // Pass 1: block digests are independent of each other, so they pipeline. The tokens are
  // hashed where they lie; the segment structure enters as the digest's tweak.
  // (out.content holds the block digests until pass 2 overwrites them.)
  for (std::size_t si = 0; si < layout.segments.size(); ++si) {
    const segment& s = layout.segments[si];
    for (std::int32_t j = 0; j < s.num_blocks; ++j) {
      const auto b = static_cast<std::size_t>(s.first_block + j);
      const block_extent& e = layout.blocks[b];
      const std::span<const token_t> toks(layout.tokens.data() + e.pos0,
                                          static_cast<std::size_t>(e.len));
      out.content[b] = h.digest(std::as_bytes(toks), hash_domain::kTokens, block_tag(s, j == 0));
    }
  }
  // Pass 2: the two chains. They do not depend on each other, so their links overlap.
  key prefix_last = out.root;
  // Spans computed behind layout.span_context: their context is that of a prefix segment of
  // those tokens (what `prefix(absorber).span(doc)` computes), whatever this request's prefix.
  key span_ctx = out.root;
  if (layout.span_context) {
    const std::vector<token_t>& a = *layout.span_context;
    const segment as_prefix{};
    for (std::size_t at = 0, j = 0; at < a.size();
         at += static_cast<std::size_t>(layout.block_size), ++j) {
      const std::size_t n = std::min(a.size() - at, static_cast<std::size_t>(layout.block_size));
      const std::span<const token_t> toks(a.data() + at, n);
      span_ctx = h.combine(
          span_ctx,
          h.digest(std::as_bytes(toks), hash_domain::kTokens, block_tag(as_prefix, j == 0)),
          hash_domain::kContext);
    }
  }
  key ctx = out.root;
  for (std::size_t si = 0; si < layout.segments.size(); ++si) {
    const segment& s = layout.segments[si];
    key seg_ctx = out.root;
    if (s.kind == segment_kind::kSpan) {
      seg_ctx = layout.span_context ? span_ctx : prefix_last;
    } else if (s.kind == segment_kind::kDependent && s.dep_window > 0) {
      const std::int32_t n = s.dep_window < s.first_token ? s.dep_window : s.first_token;
      const std::span<const token_t> win =
          std::span<const token_t>(layout.tokens)
              .subspan(static_cast<std::size_t>(s.first_token - n), static_cast<std::size_t>(n));
      seg_ctx = h.combine(out.root, h.digest(std::as_bytes(win), hash_domain::kWindow),
                          hash_domain::kWindow);
    }
    out.segment_context[si] = seg_ctx;
    const bool relocatable =
        s.kind == segment_kind::kSpan || (s.kind == segment_kind::kDependent && s.dep_window > 0);
    key content = seg_ctx;
    key* RELOKV_RESTRICT cx = out.context.data() + s.first_block;
    key* RELOKV_RESTRICT ct = out.content.data() + s.first_block;  // digests in, keys out
    if (relocatable) {
      for (std::int32_t j = 0; j < s.num_blocks; ++j) {
        const key tok = ct[j];
        ctx = h.combine(ctx, tok, hash_domain::kContext);
        content = h.combine(content, tok, hash_domain::kContent);
        cx[j] = ctx;
        ct[j] = content;
      }
    } else {
      for (std::int32_t j = 0; j < s.num_blocks; ++j) {
        ctx = h.combine(ctx, ct[j], hash_domain::kContext);
        cx[j] = ctx;
        ct[j] = ctx;
      }
    }
    if (s.kind == segment_kind::kPrefix && s.num_blocks > 0) prefix_last = ctx;
  }
}

/// Convenience overload returning fresh keys (the other reuses `out`'s capacity).
template <hash_scheme H>
[[nodiscard]] block_keys<H> derive_block_keys(const H& h, const request_layout& layout,
                                              const extra_keys& extras = {}) {
  block_keys<H> out;
  derive_block_keys(h, layout, extras, out);
  return out;
}

RELOKV_NAMESPACE_END
