// Local pre-aggregation for very hot sharded counters: increments add to an in-process sum,
// and a background thread writes the sum every `flush_every` or as soon as `max_pending`
// units have accumulated, whichever comes first, as one idempotent write (a request id per
// flushed batch), so a retried flush never counts twice.
//
//   auto likes = std::make_shared<ShardedCounter>(store, options);
//   BufferedCounter buffered(likes, BufferedOptions{});
//   buffered.incr(1);            // an atomic add: no I/O, no lock
//   buffered.close(std::chrono::seconds(5));   // writes what is pending
//
// The worst case: a reader of the store sees an increment at most `flush_every` after it was
// made (plus the write's round trip) while the store is reachable; a crash of this process
// loses at most pending() units (accumulated, or written without an acknowledgement), which
// pending() reports at any time. A flush that fails transiently is retried with the same
// request id until it lands or its id would expire (then its units are counted in
// stats().failed_units).
//
// Fork-safe: a forked child starts with nothing pending (the parent writes what it had) and
// its own flusher, started by its first incr.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "redcount/common/fork_hooks.h"
#include "redcount/sharded/sharded_counter.h"

namespace redcount {

// The largest |amount| of one buffered increment: sums of many stay far from int64 overflow
// between two flushes.
inline constexpr std::int64_t kMaxBufferedAmount = std::int64_t{1} << 40;

struct BufferedOptions {
  std::chrono::milliseconds flush_every{50};  // >= 1 ms
  std::int64_t max_pending = 1000;            // units (sum of |amount|) that trigger a flush; >= 1
};

struct BufferedStats {
  std::uint64_t flushes = 0;         // batches acknowledged by the store
  std::int64_t flushed_units = 0;    // their net amount
  std::uint64_t retries = 0;         // failed attempts that were retried
  std::int64_t failed_units = 0;     // net amount given up (non-transient error, id expiry, close)
  std::int64_t pending = 0;          // net amount not yet acknowledged
  std::string last_error;
};

class BufferedCounter {
 public:
  BufferedCounter(std::shared_ptr<ShardedCounter> counter, BufferedOptions options);
  ~BufferedCounter();
  BufferedCounter(const BufferedCounter&) = delete;
  BufferedCounter& operator=(const BufferedCounter&) = delete;

  // Adds `amount` (non-zero, |amount| <= 2^40) to the pending sum. Throws after close().
  void incr(std::int64_t amount) {
    if (amount == 0 || amount > kMaxBufferedAmount || amount < -kMaxBufferedAmount) bad_amount(amount);
    if (!running_.load(std::memory_order_acquire)) start();
    sum_.fetch_add(amount, std::memory_order_relaxed);
    const std::int64_t units = amount < 0 ? -amount : amount;
    const std::int64_t before = units_.fetch_add(units, std::memory_order_relaxed);
    if (before < options_.max_pending && before + units >= options_.max_pending) wake();
  }

  // Net units not yet acknowledged by the store (accumulated or in flight).
  std::int64_t pending() const;
  // Writes everything pending now and waits up to `timeout` (nullopt = no limit) for it to
  // be acknowledged; returns the units still pending.
  std::int64_t flush(std::optional<std::chrono::milliseconds> timeout);
  // Flushes within `timeout`, stops the flusher; what is still pending is given up and
  // counted in stats().failed_units, which close returns. Later incr calls throw.
  std::int64_t close(std::optional<std::chrono::milliseconds> timeout);
  BufferedStats stats() const;

  const BufferedOptions& options() const noexcept { return options_; }
  const std::shared_ptr<ShardedCounter>& counter() const noexcept { return counter_; }

  // Fork hooks (common/fork_hooks.h; see buffered_counter.cpp).
  void fork_prepare();
  void fork_parent();
  void fork_child();

 private:
  struct Batch {
    std::int64_t amount = 0;
    std::string request_id;
    std::chrono::steady_clock::time_point first_tried{};
  };

  [[noreturn]] static void bad_amount(std::int64_t amount);
  void start();
  void wake();
  void loop();
  // Moves the pending sum into batches (lock held).
  void cut_batches();
  // Sends the batches not yet acknowledged, once, on the flusher thread; lock not held.
  void send_once();

  std::shared_ptr<ShardedCounter> counter_;
  BufferedOptions options_;

  std::atomic<std::int64_t> sum_{0};
  std::atomic<std::int64_t> units_{0};
  std::atomic<bool> running_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_, acked_;
  std::deque<Batch> batches_;   // cut, not yet acknowledged (oldest first)
  bool wake_ = false, stopping_ = false, closed_ = false;
  std::string id_base_;
  std::uint64_t next_id_ = 0;
  BufferedStats stats_;
  // Null until the first incr; abandoned (never joined) in a forked child, whose first incr
  // starts its own.
  std::unique_ptr<std::thread> thread_;
  ForkHooks fork_hooks_;  // registered from construction to destruction
};

}  // namespace redcount
