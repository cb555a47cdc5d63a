#pragma once
/// @file
/// The contexts relocatable content is bound to (a span's prefix or span_context, a dependent
/// segment's window), interned once and shared by every block bound to them: a content hit is
/// valid only when its context's tokens and extra keys equal the request's.
#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "relokv/cache/detail/cache_state.hpp"

RELOKV_NAMESPACE_BEGIN
namespace detail {

/// Interned contexts, reference-counted by the blocks bound to them.
template <class Key, class Hasher>
class context_table {
 public:
  /// The entry of segment s's context when it is interned with the request's tokens and extra
  /// keys; -1 otherwise.
  [[nodiscard]] std::int32_t find(const request_state<Key>& rs, std::int32_t s) const {
    const auto it = index_.find(rs.segment_context[static_cast<std::size_t>(s)]);
    if (it == index_.end()) return -1;
    const context_entry<Key>& c = entries_[static_cast<std::size_t>(it->second)];
    const auto toks = context_tokens(rs, s);
    if (c.extras != rs.extras ||
        !std::equal(toks.begin(), toks.end(), c.tokens.begin(), c.tokens.end()))
      return -1;
    return it->second;
  }
  /// The entry of segment s's context, interned when its key is free; -1 when another context
  /// holds the key. The request's copy (segment_entry) is always left equal to the result.
  std::int32_t intern(request_state<Key>& rs, std::int32_t s) {
    std::int32_t& mine = rs.segment_entry[static_cast<std::size_t>(s)];
    mine = find(rs, s);
    if (mine >= 0) return mine;
    const Key& k = rs.segment_context[static_cast<std::size_t>(s)];
    if (index_.count(k) != 0) return -1;  // a different context holds this key
    std::int32_t idx;
    if (!free_.empty()) {
      idx = free_.back();
      free_.pop_back();
    } else {
      idx = static_cast<std::int32_t>(entries_.size());
      entries_.emplace_back();
    }
    context_entry<Key>& c = entries_[static_cast<std::size_t>(idx)];
    const auto toks = context_tokens(rs, s);
    c.key = k;
    c.tokens.assign(toks.begin(), toks.end());
    c.extras = rs.extras;
    c.refs = 0;
    c.live = true;
    index_.emplace(k, idx);
    mine = idx;
    return idx;
  }
  /// One more block bound to entry idx.
  void retain(std::int32_t idx) { ++entries_[static_cast<std::size_t>(idx)].refs; }
  /// One block fewer; the entry is freed with its last.
  void release(std::int32_t idx) {
    context_entry<Key>& c = entries_[static_cast<std::size_t>(idx)];
    if (--c.refs != 0) return;
    index_.erase(c.key);
    c.live = false;
    c.tokens.clear();
    free_.push_back(idx);
  }

 private:
  std::unordered_map<Key, std::int32_t, Hasher> index_;
  std::vector<context_entry<Key>> entries_;
  std::vector<std::int32_t> free_;
};

}  // namespace detail
RELOKV_NAMESPACE_END
