#pragma once
/// @file
/// One request's KV as an engine computes it, in the library's words: built from the cache
/// (which names the RoPE placement once), the engine's host storage and RoPE table, and a
/// successful plan. It performs the plan's fetches and copies, says where each computed token's
/// K and V go (position, block, slot), applies the last-token rule, writes K/V and runs
/// attention with the cache's placement, gives decode its slots (extending the request when its
/// last block is full or shared), and commits and releases.
///
/// @code
///   auto plan = cache.plan(layout, strategy);            // plan.ok(), or wait and retry
///   relokv::request_kv req(cache, storage, rope, layout, std::move(plan));
///   for (int l = 0; l < layers; ++l) {
///     // q, k, v of req.prefill_tokens() from the model
///     for (std::size_t i = 0; i < n; ++i) req.write(l, req.prefill_tokens()[i], k_i, v_i);
///     req.attend(l, q, q_pos, n, num_q_heads, scale, out);
///   }
///   auto slot = req.append_token();                       // decode: std::nullopt when full
///   req.commit();                                         // reusable by later requests
/// @endcode
///
/// An engine that keeps positions rather than slots (a dynamic strategy's shrinking set, a
/// batch of decode rows) asks `slot_at(pos)`; one that splits attention its own way (over
/// threads, KV heads or blocks) takes `attention(l)`, the layer's call with the request's part
/// set, and adds its queries. The reference engine (examples/engine/llama_engine.cpp) does both.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "relokv/attention/kv_append.hpp"
#include "relokv/attention/params.hpp"
#include "relokv/attention/placed_view.hpp"
#include "relokv/cache/relocatable_cache.hpp"
#include "relokv/cache/reuse_plan.hpp"
#include "relokv/layout/request_layout.hpp"
#include "relokv/memory/host_kv_storage.hpp"
#include "relokv/rope/rotate.hpp"

RELOKV_NAMESPACE_BEGIN

template <class Cache, class T>
class request_kv;

/// Where one token's K and V live in a request: read-only to the engine. Only a request_kv
/// makes slots, and it writes through a slot only when the slot is its own and it granted the
/// right to write: a caller cannot point a slot at a shared block or turn writing on.
class token_slot {
 public:
  /// An empty slot: writes nothing.
  token_slot() = default;

  /// Logical position in the request (what RoPE sees).
  [[nodiscard]] pos_t pos() const noexcept { return pos_; }
  /// Physical block.
  [[nodiscard]] block_id block() const noexcept { return block_; }
  /// Slot in the block: pos() - the block's pos0.
  [[nodiscard]] std::int32_t slot() const noexcept { return slot_; }
  /// False for the one token the last-token rule adds: its hidden state is needed (it gives
  /// the first logits) but its K and V are cached already, in a block that may be shared.
  [[nodiscard]] bool writes() const noexcept { return write_; }

  friend bool operator==(const token_slot&, const token_slot&) = default;

 private:
  template <class Cache, class T>
  friend class request_kv;
  token_slot(pos_t pos, block_id block, std::int32_t slot, bool write, request_id owner) noexcept
      : pos_(pos), block_(block), slot_(slot), write_(write), owner_(owner) {}

  pos_t pos_ = 0;
  block_id block_ = kNoBlock;
  std::int32_t slot_ = 0;
  bool write_ = false;
  request_id owner_ = 0;  // the plan id of the request that made the slot
};

/// One live request of `Cache` over host storage of T. Movable, not copyable; the destructor
/// releases the request (without committing it) if neither commit() nor release() did.
template <class Cache, class T>
class request_kv {
 public:
  using cache_type = Cache;
  using placement = typename Cache::placement_type;
  using value_type = T;

  /// Takes over `plan`, a successful plan of `layout` by `cache`, and performs its fetches
  /// (store hits) and then its copies, which may read them.
  /// @throws error when the plan failed or does not belong to the layout, or when the storage
  ///         or the RoPE table does not fit the cache; the request is released then.
  request_kv(Cache& cache, host_kv_storage<T>& storage, const rope_table& rope,
             const request_layout& layout, reuse_plan plan)
      : request_kv(cache, storage, &rope, nullptr, layout, std::move(plan)) {}

  /// The same for a model whose layers differ in RoPE or window (layer_rope: Gemma 2/3,
  /// sliding-window models): layer l's keys are rotated by its own table (pre_rotated
  /// relocation included) and its attention windowed by logical position. `layers` must
  /// outlive the request.
  request_kv(Cache& cache, host_kv_storage<T>& storage, const layer_rope& layers,
             const request_layout& layout, reuse_plan plan)
      : request_kv(cache, storage, &layers.table(0), &layers, layout, std::move(plan)) {}

 private:
  request_kv(Cache& cache, host_kv_storage<T>& storage, const rope_table* rope,
             const layer_rope* layers, const request_layout& layout, reuse_plan plan)
      : cache_(&cache), storage_(&storage), rope_(rope), layers_(layers), plan_(std::move(plan)) {
    if (!plan_.ok())
      throw error("request_kv: the plan failed (" + std::to_string(plan_.blocks_short) +
                  " more free blocks needed); wait or preempt, plan again");
    try {
      check(layout);
      apply_fetches(storage, plan_.fetches);
      if (layers_ != nullptr)
        apply_copies<placement>(*layers_, storage, plan_.copies);
      else
        apply_copies<placement>(*rope_, storage, plan_.copies);
      plan_.fetches.clear();  // the bytes are written; drop the blobs
    } catch (...) {
      cache.release(plan_.id);
      cache_ = nullptr;
      throw;
    }
    table_ = plan_.block_table();
    writable_.reserve(plan_.blocks.size());
    for (std::size_t b = 0; b < plan_.blocks.size(); ++b) {
      const planned_block& pb = plan_.blocks[b];
      // Decode appends only into a private block left open; a sealed block (a span's end, a
      // full block) is cached as it is, so the next token starts a new one.
      writable_.push_back((pb.fresh || pb.copy_on_write) && !layout.blocks[b].sealed);
    }
    const auto n = static_cast<std::int32_t>(layout.tokens.size());
    std::size_t b = 0;
    for (pos_t p = 0; p < n; ++p) {
      while (b + 1 < plan_.blocks.size() && p >= plan_.blocks[b].pos0 + plan_.blocks[b].len) ++b;
      if (plan_.compute[static_cast<std::size_t>(p)])
        tokens_.push_back(
            token_slot{p, plan_.blocks[b].physical, p - plan_.blocks[b].pos0, true, plan_.id});
    }
    // The last-token rule: the prompt's last token gives the first logits, so the engine
    // computes it even when its K/V are reused (then exactly, and without writing them).
    if (n > 0 && (tokens_.empty() || tokens_.back().pos() != n - 1)) {
      const planned_block& last = plan_.blocks.back();
      tokens_.push_back(token_slot{n - 1, last.physical, n - 1 - last.pos0, false, plan_.id});
    }
    num_tokens_ = n;
    prompt_tokens_ = n;
  }

 public:
  request_kv(const request_kv&) = delete;
  request_kv& operator=(const request_kv&) = delete;
  request_kv(request_kv&& o) noexcept
      : cache_(std::exchange(o.cache_, nullptr)),
        storage_(o.storage_),
        rope_(o.rope_),
        layers_(o.layers_),
        plan_(std::move(o.plan_)),
        table_(std::move(o.table_)),
        writable_(std::move(o.writable_)),
        tokens_(std::move(o.tokens_)),
        num_tokens_(o.num_tokens_),
        prompt_tokens_(o.prompt_tokens_),
        committed_(o.committed_) {}
  request_kv& operator=(request_kv&&) = delete;
  ~request_kv() {
    if (cache_ != nullptr) {
      try {
        cache_->release(plan_.id);
      } catch (...) {  // a destructor does not throw; release() reports misuse
      }
    }
  }

  /// The plan, with its block table as planned (decode's blocks are in table()).
  [[nodiscard]] const reuse_plan& plan() const noexcept { return plan_; }
  /// The tokens prefill computes, by position: the plan's computed tokens with their block and
  /// slot, and the last token of the prompt with write = false when the plan reuses it. A
  /// dynamic strategy (CacheBlend) computes a shrinking subset of them, layer by layer.
  [[nodiscard]] std::span<const token_slot> prefill_tokens() const noexcept { return tokens_; }
  /// Tokens of the request so far: the prompt and every appended token.
  [[nodiscard]] std::int32_t num_tokens() const noexcept { return num_tokens_; }

  /// One layer of the storage, tagged with the cache's placement.
  /// @throws error when `l` is not a layer of the storage
  [[nodiscard]] placed_kv_view<placement, T> layer(std::int32_t l) const {
    check_layer(l, "layer");
    return {storage_->layer(l)};
  }
  /// The block table attention reads, as one sequence: the plan's blocks and decode's.
  [[nodiscard]] block_table_view table() const noexcept {
    indptr_[1] = static_cast<std::int32_t>(table_.size());
    return {table_.data(), indptr_, 1};
  }
  [[nodiscard]] std::span<const block_entry> blocks() const noexcept { return table_; }

  /// The slot of any position of the request (the prompt's and the appended tokens'), as an
  /// engine that keeps positions rather than slots asks for it (a dynamic strategy's shrinking
  /// set, a decode row): writes() is true where this request computes the token (the plan's
  /// computed tokens, the appended ones), false where it reuses it (the reused last token
  /// included), so write() through it never touches a reused block.
  /// @throws error for a position outside [0, num_tokens()) or a released request
  [[nodiscard]] token_slot slot_at(pos_t pos) const {
    live("slot_at");
    if (pos < 0 || pos >= num_tokens_)
      throw error("request_kv::slot_at: position " + std::to_string(pos) +
                  " is outside the request's " + std::to_string(num_tokens_) + " tokens");
    // The table is in position order (the plan's blocks, then decode's).
    const auto it = std::upper_bound(table_.begin(), table_.end(), pos,
                                     [](pos_t p, const block_entry& e) { return p < e.pos0; });
    const block_entry& e = *(it - 1);
    const bool computes =
        pos >= prompt_tokens_ || static_cast<bool>(plan_.compute[static_cast<std::size_t>(pos)]);
    return token_slot{pos, e.block, pos - e.pos0, computes, plan_.id};
  }

  /// Writes a token's K and V (unrotated, [num_kv_heads][head_dim] each) into layer `l`, rotated
  /// as the placement stores them; does nothing for a slot with writes() == false.
  /// @throws error when `l` is not a layer of the storage or the slot is another request's
  void write(std::int32_t l, const token_slot& t, const float* k, const float* v) {
    check_layer(l, "write");
    if (t.owner_ != plan_.id || cache_ == nullptr)
      throw error("request_kv::write: the slot (position " + std::to_string(t.pos_) +
                  ") was not made by this live request");
    if (!t.write_) return;
    append_kv<placement>(rope_of(l), storage_->layer(l), t.block_, t.slot_, t.pos_, k, v);
  }

  /// Layer l's RoPE table (the one table unless built from a layer_rope).
  [[nodiscard]] const rope_table& rope_of(std::int32_t l) const {
    return layers_ != nullptr ? layers_->table(l) : *rope_;
  }
  /// Layer l's sliding window (0: none).
  [[nodiscard]] std::int32_t window_of(std::int32_t l) const {
    return layers_ != nullptr ? layers_->window(l) : 0;
  }

  /// Layer l's attention call over this request's blocks with what the request decides set:
  /// the layer's RoPE table and window, its KV, the block table. The engine adds the queries
  /// and the output (and may split the call: over KV heads, over query rows, over the blocks
  /// with merge_attention_states) and calls paged_attention<placement> or grouped_attention.
  /// The table view reads this request's table: it holds until the next append_token().
  /// @throws error when `l` is not a layer of the storage
  [[nodiscard]] attention_params<T> attention(std::int32_t l) const {
    check_layer(l, "attention");
    attention_params<T> p;
    p.rope = &rope_of(l);
    p.window = window_of(l);
    p.kv = storage_->layer(l);
    p.table = table();
    return p;
  }

  /// Attention of n queries of this request (unrotated, at positions q_pos, causal, windowed
  /// where the layer is) over its blocks in layer l: the decode kernel for one query, the
  /// prefill kernel otherwise.
  void attend(std::int32_t l, const float* q, const pos_t* q_pos, std::int32_t n,
              std::int32_t num_q_heads, float scale, float* out, kv_head_range heads = {},
              float* lse = nullptr) const {
    attention_params<T> p = attention(l);
    p.q = q;
    p.q_pos = q_pos;
    const std::int32_t qi[2] = {0, n};
    p.q_indptr = n == 1 ? nullptr : qi;
    p.num_tokens = n;
    p.num_q_heads = num_q_heads;
    p.scale = scale;
    p.out = out;
    p.lse = lse;
    p.heads = heads;
    paged_attention<placement>(p);
  }

  /// A slot for the next decoded token, at position num_tokens(): the open private last block
  /// when it has room, else a new block from the cache (extend). The engine writes the token's
  /// K/V there in every layer before it attends.
  /// @return the slot, or std::nullopt when the pool is exhausted (nothing changed: preempt or
  ///         wait, then call again)
  [[nodiscard]] std::optional<token_slot> append_token() {
    live("append_token");
    const pos_t pos = num_tokens_;
    block_entry& last = table_.back();
    if (writable_.back() && last.len < cache_->block_size() && last.pos0 + last.len == pos) {
      ++last.len;
    } else {
      const alloc_result a = cache_->extend(plan_.id);
      if (a.status != alloc_status::kOk) return std::nullopt;
      table_.push_back({a.block, pos, 1});
      writable_.push_back(true);
    }
    ++num_tokens_;
    return token_slot{pos, table_.back().block, pos - table_.back().pos0, true, plan_.id};
  }

  /// Registers the blocks the prompt wrote so that later requests reuse them (and puts new
  /// ones into the cache's store, when it writes to one). Call once every layer is written.
  /// @throws error when already committed or released
  void commit() {
    live("commit");
    if (committed_) throw error("request_kv::commit: already committed");
    cache_->commit(plan_.id, *storage_);
    committed_ = true;
  }
  /// Ends the request: its blocks go back to the cache's LRU queue. Idempotent.
  void release() {
    if (cache_ == nullptr) return;
    Cache* c = std::exchange(cache_, nullptr);
    c->release(plan_.id);
  }

 private:
  void check_layer(std::int32_t l, const char* what) const {
    if (l < 0 || l >= storage_->shape().num_layers)
      throw error(std::string("request_kv::") + what + ": layer " + std::to_string(l) +
                  " is out of range (the storage has " +
                  std::to_string(storage_->shape().num_layers) + ")");
  }
  void live(const char* what) const {
    if (cache_ == nullptr)
      throw error(std::string("request_kv::") + what + ": the request was released");
  }
  void check(const request_layout& layout) const {
    const auto n = layout.tokens.size();
    if (plan_.compute.size() != n || plan_.blocks.size() != layout.blocks.size() || n == 0)
      throw error("request_kv: the plan (" + std::to_string(plan_.compute.size()) + " tokens, " +
                  std::to_string(plan_.blocks.size()) + " blocks) is not a plan of this layout (" +
                  std::to_string(n) + " tokens, " + std::to_string(layout.blocks.size()) +
                  " blocks)");
    for (std::size_t b = 0; b < plan_.blocks.size(); ++b)
      if (plan_.blocks[b].pos0 != layout.blocks[b].pos0 ||
          plan_.blocks[b].len != layout.blocks[b].len)
        throw error("request_kv: block " + std::to_string(b) +
                    " of the plan differs from the "
                    "layout's");
    const kv_shape& s = storage_->shape();
    if (s.block_size != cache_->block_size())
      throw error("request_kv: storage block_size " + std::to_string(s.block_size) +
                  " differs from the cache's " + std::to_string(cache_->block_size()));
    if (layers_ != nullptr && layers_->num_layers() != s.num_layers)
      throw error("request_kv: " + std::to_string(layers_->num_layers()) +
                  " layers of RoPE for a storage of " + std::to_string(s.num_layers) + " layers");
    if (rope_->config().head_dim != s.head_dim)
      throw error("request_kv: rope head_dim " + std::to_string(rope_->config().head_dim) +
                  " differs from the storage's " + std::to_string(s.head_dim));
  }

  Cache* cache_;
  host_kv_storage<T>* storage_;
  const rope_table* rope_;
  const layer_rope* layers_ = nullptr;  // per-layer RoPE and windows, when given
  reuse_plan plan_;
  std::vector<block_entry> table_;
  std::vector<bool> writable_;  // per table entry: decode may append into it
  std::vector<token_slot> tokens_;
  std::int32_t num_tokens_ = 0;
  std::int32_t prompt_tokens_ = 0;
  bool committed_ = false;
  mutable std::int32_t indptr_[2] = {0, 0};
};

RELOKV_NAMESPACE_END
