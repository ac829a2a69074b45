// A bounded top-K of the storage keys a process touches (Space-Saving, Metwally et al.,
// "Efficient computation of frequent and top-k elements in data streams", 2005), and the
// store wrapper that feeds it with every request's key.
//
//   auto hk = std::make_shared<HotKeys>(1000);
//   auto store = observe_hot_keys(open_store(options), hk);   // counters run on `store`
//   for (const HotKey& k : hk->top(10)) std::cout << k.key << " " << k.count << "\n";
//
// The guarantee (N = total(), m = capacity()): every reported count is an upper bound and
// the true count lies in [count - error, count], with error <= N / m; every key whose true
// count exceeds N / m is in the table. Memory is bounded by `capacity` entries, whatever
// the stream. While fewer than `capacity` distinct keys were seen, counts are exact.
//
// observe() is O(1) for n = 1 (the stream-summary structure: buckets of equal counts in a
// doubly linked list, so an increment moves a key to the next bucket); for n > 1 the key
// walks forward over the buckets between its old and new count. One mutex guards the
// table, held for that step only (no I/O, no allocation once the table is full).
//
// Thread-safe. A forked child starts with an empty table (its counts are its own).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "redcount/common/fork_hooks.h"
#include "redcount/store/store.h"

namespace redcount {

struct HotKey {
  std::string key;
  std::uint64_t count = 0;  // estimate: an upper bound of the true count
  std::uint64_t error = 0;  // the true count is in [count - error, count]
};

class HotKeys {
 public:
  // Largest capacity accepted (about 100 MB of table for long keys): beyond that a top-K
  // stops being a sample.
  static constexpr std::int64_t kMaxCapacity = 1'000'000;
  // Largest weight of one observation, so that total() (uint64) cannot overflow in any
  // realistic run and counts stay exact in a double (Prometheus, Python floats).
  static constexpr std::int64_t kMaxWeight = std::int64_t{1} << 40;
  // Keys are storage keys; longer ones are refused rather than stored.
  static constexpr std::size_t kMaxKeyBytes = 64 * 1024;

  // Throws InvalidArgument unless 1 <= capacity <= kMaxCapacity.
  explicit HotKeys(std::int64_t capacity = 1000);
  HotKeys(const HotKeys&) = delete;
  HotKeys& operator=(const HotKeys&) = delete;

  // Counts `n` occurrences of `key`. Throws InvalidArgument for an empty or over-long key
  // or n outside 1..kMaxWeight (nothing is counted then).
  void observe(std::string_view key, std::int64_t n = 1);
  // Up to `n` keys by estimated count, descending (ties by key). n >= 0.
  std::vector<HotKey> top(std::int64_t n = 10) const;
  // The sum of every observation's weight since construction or reset().
  std::uint64_t total() const;
  std::int64_t capacity() const noexcept { return capacity_; }
  // Keys in the table now (<= capacity).
  std::size_t size() const;
  void reset();

 private:
  // After a fork (common/fork_hooks.h): releases the mutex taken before it; the child's
  // table is emptied.
  void unlock_after_fork(bool child);

  struct Entry {
    std::string key;
    std::uint64_t count = 0;
    std::uint64_t error = 0;
    int bucket = -1;
    int prev = -1, next = -1;  // within the bucket
  };
  struct Bucket {
    std::uint64_t count = 0;
    int first = -1;             // an entry of this bucket
    int prev = -1, next = -1;   // buckets by ascending count
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  int new_bucket(std::uint64_t count, int after);
  void free_bucket(int b);
  void detach(int e);
  void attach(int e, int b);
  // Moves entry `e` from its bucket to the one for count + n (created when missing).
  void bump(int e, std::uint64_t n);
  // Puts a fresh entry (count n) into the bucket for n, searching from the lowest bucket.
  void place(int e);
  void clear_locked();

  const std::int64_t capacity_;
  mutable std::mutex mu_;
  std::uint64_t total_ = 0;
  std::vector<Entry> entries_;
  std::vector<Bucket> buckets_;
  std::vector<int> free_buckets_;
  int lowest_ = -1, highest_ = -1;
  std::unordered_map<std::string, int, Hash, std::equal_to<>> index_;
  ForkHooks fork_hooks_;  // last: unregistered before the rest is destroyed
};

// A store that observes the storage key of every request before passing the batch on,
// unchanged, to `inner`: for a script call KEYS[1] (the other keys of one call share its
// hash tag: request ids, delta logs); for a command every key it names, at the key
// positions the cluster router uses (redcount/redis/topology/command_keys.h: GET, INCRBY, PEXPIREAT,
// MGET, DEL, HGETALL, XADD, XREADGROUP's streams, ...; EVAL and EVALSHA: KEYS[1] only);
// connection and server commands (PING, MULTI, EXEC, SCRIPT, WAIT, INFO...) name no key and
// are not observed. A MULTI ... EXEC transaction counts each key
// it names once, like the script it stands in for (an increment's INCRBY + PEXPIREAT: once).
//
// Thread-safe when `inner` is. Stores without a HotKeys pay nothing (they are not wrapped).
class HotKeysStore final : public Store {
 public:
  HotKeysStore(std::shared_ptr<Store> inner, std::shared_ptr<HotKeys> hot_keys);

  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled = nullptr) override;
  std::uint32_t shard_of(std::string_view key) const noexcept override { return inner_->shard_of(key); }
  std::vector<std::shared_ptr<Store>> nodes() override { return inner_->nodes(); }
  std::int64_t now_ms() const override { return inner_->now_ms(); }
  bool accepts_typed_args() const noexcept override { return inner_->accepts_typed_args(); }
  bool server_clock_is_local() const noexcept override { return inner_->server_clock_is_local(); }
  bool has_expire_options() const noexcept override { return inner_->has_expire_options(); }
  bool contended() const noexcept override { return inner_->contended(); }
  std::string describe() const override { return inner_->describe(); }
  bool is_memory() const noexcept override { return inner_->is_memory(); }
  void close() override { inner_->close(); }

  const std::shared_ptr<Store>& inner() const noexcept { return inner_; }
  const std::shared_ptr<HotKeys>& hot_keys() const noexcept { return hot_keys_; }

 private:
  void observe(const std::vector<Request>& batch);

  std::shared_ptr<Store> inner_;
  std::shared_ptr<HotKeys> hot_keys_;
};

// `store` observed by `hot_keys` (a HotKeysStore).
std::shared_ptr<Store> observe_hot_keys(std::shared_ptr<Store> store, std::shared_ptr<HotKeys> hot_keys);

}  // namespace redcount
