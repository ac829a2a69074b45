// Sharded idempotent counters: one logical counter striped over N keys ("shards"), so that a
// counter written by many clients at once is not one hot key, with request-id
// deduplication so that a retried write is never counted twice.
//
//   ShardedOptions o;
//   o.name = "likes:post:987";
//   ShardedCounter likes(store, o);
//   bool applied = likes.incr(1, "req-20260223-13001");   // false for a repeat of the id
//   std::int64_t total = likes.value();                    // all shards, one round trip
//   Reading r = likes.read(250);                           // cached for hot readers
//
// A write is one Lua script (sharded_incr.lua, with a native twin on the memory store):
// record the request id (SET NX PX idempotency_ttl), and only if it is new, INCRBY the
// shard and XADD the delta to the shard's delta log (a stream trimmed with MAXLEN ~). The
// three happen together or not at all, so the log never disagrees with the value. A write
// with a request id goes to the shard fnv1a64(request_id) % shards, so a retry finds the id
// it recorded; a write without one goes to a random shard.
//
// Keys (keys.h): every shard has its own hash tag "{<prefix>:<name>:<shard>}", which is its
// value key; its request ids and its log share the tag, so one script call touches one slot.
//
// Resharding (reshard(M)) adds a shard generation: the counter's shards so far are frozen
// (still summed by every read, no longer written by up-to-date writers) and M new shards
// with the next free indices take the writes. The generations live in the layout key
// "{<prefix>:<name>}:layout" (absent = one generation of `shards`), which writers re-read at
// most kLayoutRefreshMs after their last look (on Redis Cluster or a ring, without waiting
// for that read while their copy is younger than kLayoutFallbackMs) and readers read with
// every value, following up when it changed. For idempotency_ttl (+ kLayoutGraceMs) after a reshard, a write with a
// request id also checks and records the id in the shard each younger-than-that older
// generation routes it to, so a retry counts once whichever generation its writer believed
// current: in the same script call when that shard is in the write's store shard (always on
// one server), else (Redis Cluster: another slot) by a claim step first (sharded_claim.lua),
// one round trip more for those writes only.
//
// Every method is also an operation (operation.h): make_incr(...) etc. The operations share
// the counter's read cache and retry queue and stay valid after the counter is destroyed.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/store/operation.h"
#include "redcount/store/store.h"
#include "redcount/store/scripts.h"
#include "redcount/store/retry_queue.h"

namespace redcount {


// The most shards one counter may have: value() reads every shard in one round trip, and
// past this a read costs more than the hot key it replaces.
inline constexpr std::int64_t kMaxShards = 4096;
// The largest |amount| of one increment: deltas stay exact wherever a Lua number carries them.
inline constexpr std::int64_t kMaxShardedAmount = (std::int64_t{1} << 53) - 1;
// The longest adjustment reason (the SQL adjustments table's column width).
inline constexpr std::size_t kMaxAdjustReason = 255;
// Request ids live at most this long (one year).
inline constexpr std::int64_t kMaxIdempotencyTtlMs = 366LL * 86'400'000;

// How long a writer trusts the layout it read before it reads it again (before its next write).
inline constexpr std::int64_t kLayoutRefreshMs = 1000;
// On a store that puts the layout key on another node than the counter's shards (Redis
// Cluster, a ring), a writer whose layout is stale but younger than this writes with it
// and re-reads it in the background, so a failover of the layout key's node does not stop
// writes to healthy nodes. Older than this (far below kLayoutGraceMs, which the older
// generations' request-id checks cover), it waits for the read as everywhere else.
inline constexpr std::int64_t kLayoutFallbackMs = 30'000;
// Added to idempotency_ttl for how long after a reshard writes also check the older
// generations' request ids: covers a writer's layout refresh and a write's time in flight.
inline constexpr std::int64_t kLayoutGraceMs = 60'000;

// One generation of a counter's shards: the indices [first, first + count). retired_ms is
// when a reshard replaced it (the store's clock, ms since the epoch); 0 for the current one.
struct ShardGeneration {
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t retired_ms = 0;
};

// A counter's shard generations, oldest first; the last one takes the writes. Indices are
// contiguous over the generations: 0 .. total() - 1.
struct ShardLayout {
  std::int64_t version = 1;  // = generations.size(); 1 = the counter as created (no layout key)
  std::vector<ShardGeneration> generations;
  const ShardGeneration& current() const { return generations.back(); }
  std::int64_t total() const { return current().first + current().count; }
};

struct ShardedOptions {
  enum class Route { RequestId, Random };
  enum class OnError { Raise, Queue };

  std::string prefix = "redcount";
  std::string name;
  std::int64_t shards = 16;                     // 1..kMaxShards; the first generation (see reshard)
  std::int64_t idempotency_ttl_ms = 86'400'000;  // how long a request id is remembered; >= 1
  // RequestId: a write with a request id goes to the id's shard, one without to a random
  // shard. Random: every write to a random shard; request ids are then refused (a retry
  // could land on another shard, which has not seen the id).
  Route route = Route::RequestId;
  // The delta log's memory guard (XADD MAXLEN ~): entries kept per shard when no flusher trims
  // it (a flusher trims its applied entries itself); far above a flusher's working set. >= 1
  std::int64_t log_maxlen = 1'000'000;
  // Queue: a write with a request id that fails transiently (or ambiguously: sent, no
  // reply) goes to a bounded retry queue and is applied exactly once later; a write
  // without one raises as with Raise, since retrying it could count it twice.
  OnError on_error = OnError::Raise;
  std::int64_t queue_capacity = 100'000;       // writes queued or in flight; >= 1
  std::chrono::milliseconds retry_backoff_min{50};
  std::chrono::milliseconds retry_backoff_max{5000};
  std::size_t max_script_batch = 128;           // items per script call in incr_many
};

// One item of incr_many: a counter of the same prefix and layout, an amount, an optional id.
struct ShardedIncrement {
  std::string name;
  std::int64_t amount = 1;
  std::string request_id;  // empty = none
};

// A cached read: the value and how old it may be. The value reflects the store at some
// moment between `staleness_ms` ago and now (a fresh read reports its round trip).
struct Reading {
  std::int64_t value = 0;
  std::int64_t staleness_ms = 0;
};

class ShardedCounter {
 public:
  ShardedCounter(std::shared_ptr<Store> store, ShardedOptions options);
  ~ShardedCounter();
  ShardedCounter(const ShardedCounter&) = delete;
  ShardedCounter& operator=(const ShardedCounter&) = delete;

  // Adds `amount` (non-zero, may be negative). True when applied; false when `request_id`
  // was already applied to this counter within idempotency_ttl. With OnError::Queue, a
  // write queued for retry returns true: it will be applied exactly once (or is counted in
  // stats().dropped/failed if it cannot be).
  bool incr(std::int64_t amount, std::string_view request_id = {});
  // Many counters (of this prefix and TTL, each in its own layout) in one round trip, one
  // script call per shard group; results in input order. Every item is validated before
  // anything is sent.
  std::vector<bool> incr_many(const std::vector<ShardedIncrement>& items);
  // An audited correction: incr(amount, request_id) whose log entry also carries `reason`
  // (non-empty, at most kMaxAdjustReason bytes), which the flusher records as an adjustment.
  bool adjust(std::int64_t amount, std::string_view reason, std::string_view request_id = {});
  // Every generation's shards (shard_values: in index order), with the layout read first in
  // the same batch and a follow-up batch when it changed (see reshard).
  std::int64_t value();
  std::vector<std::int64_t> shard_values();
  // The values of other counters with this prefix, each in its own layout (the constructor's
  // `shards` until a layout key says otherwise).
  std::vector<std::int64_t> values(const std::vector<std::string>& names);
  // The cached value when it is at most max_staleness_ms old, else a fresh value(); at most
  // one refresh at a time per counter object (others meanwhile get the cached value with
  // its true staleness).
  Reading read(std::int64_t max_staleness_ms);

  std::shared_ptr<Op<bool>> make_incr(std::int64_t amount, std::string_view request_id = {});
  std::shared_ptr<Op<std::vector<bool>>> make_incr_many(const std::vector<ShardedIncrement>& items);
  std::shared_ptr<Op<bool>> make_adjust(std::int64_t amount, std::string_view reason, std::string_view request_id = {});
  std::shared_ptr<Op<std::int64_t>> make_value();
  std::shared_ptr<Op<std::vector<std::int64_t>>> make_shard_values();
  std::shared_ptr<Op<std::vector<std::int64_t>>> make_values(const std::vector<std::string>& names);
  std::shared_ptr<Op<Reading>> make_read(std::int64_t max_staleness_ms);

  // Moves the writes to a new generation of `new_shards` shards (1..kMaxShards, not the current
  // count; all generations together at most kMaxShards) while other writers keep writing;
  // returns the new layout. A reshard that raced another one (the layout changed between its
  // read and its write) throws Error and changes nothing.
  ShardLayout reshard(std::int64_t new_shards);
  std::shared_ptr<Op<ShardLayout>> make_reshard(std::int64_t new_shards);
  // The layout as the store holds it now (and this object's cached copy is refreshed).
  ShardLayout layout();
  std::shared_ptr<Op<ShardLayout>> make_layout();
  // The layout this object last saw (no I/O): the constructor's `shards` until it read one.
  ShardLayout cached_layout() const;
  // The layout key "{<prefix>:<name>}:layout" (a string: the generations; absent until a reshard).
  std::string layout_key() const;

  // The shard a write with this request id goes to (in the cached layout's current generation).
  std::int64_t shard_of(std::string_view request_id) const;
  // The value key of `shard` (its hash tag), any generation's index (0..kMaxShards-1);
  // key_of(shard, "log") / key_of(shard, "rid:<id>").
  std::string key_of(std::int64_t shard, std::string_view suffix = {}) const;

  // The retry queue (OnError::Queue), as for FixedWindowCounter.
  std::size_t flush(std::optional<std::chrono::milliseconds> timeout);
  std::size_t pending() const;
  RetryStats stats() const;
  std::size_t close(std::optional<std::chrono::milliseconds> timeout);

  const ShardedOptions& options() const noexcept;
  const std::shared_ptr<Store>& store() const noexcept;

  struct Core;  // shared with the operations (sharded_counter.cpp)

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace redcount
