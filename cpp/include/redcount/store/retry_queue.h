// The bounded retry queue behind on_error="queue": writes that failed transiently wait
// here and a background thread retries them, with exponential backoff and jitter, until
// they land, are dropped, or the queue is closed.
//
//   auto q = RetryQueue::create(store, {capacity, 50ms, 5s}, [weak](auto entries) {
//     return make_my_attempt(weak, entries);     // one Operation per retry attempt
//   });
//   q->enqueue(std::move(entries), "LOADING ...");  // RetryQueueFull when over capacity
//   q->flush(1s);  q->stats();  q->close(500ms);
//
// What is queued belongs to the counter (it derives RetryQueue::Entry); the queue does not
// read it. For each attempt the queue asks the counter for an operation over the entries
// that are due and runs it through the synchronous driver (run_operation), so a retry
// takes the same path as a first attempt: NOSCRIPT reloads, breakers, metrics and Cluster
// routing included. The operation says per entry whether it was delivered, must be tried
// again, failed for good, or was dropped without being sent.
//
// close(timeout) never waits past its timeout: an attempt stuck on a stalled server (no
// command timeout) is left to finish on its own (its thread is detached and keeps the queue
// alive), and every entry close() gives up on, queued or in that attempt, is counted in
// stats().failed at once; what the abandoned attempt later reports is not counted again.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "redcount/store/operation.h"
#include "redcount/store/store.h"

namespace redcount {

// Counts of a retry queue's traffic since it was made. "Increments" are the entries the
// counter marked as counted (a pending TTL repair is queued but is no increment).
struct RetryStats {
  std::uint64_t queued = 0;      // increments put in the queue
  std::uint64_t retried = 0;     // retry attempts (an increment may be retried many times)
  std::uint64_t delivered = 0;   // queued increments that finally landed
  std::uint64_t dropped = 0;     // dropped because they could no longer be applied correctly
  std::uint64_t overflowed = 0;  // refused because the queue was full (RetryQueueFull raised)
  std::uint64_t failed = 0;      // a non-transient error during a retry, or given up by close()
  std::size_t pending = 0;       // in the queue now (an attempt in flight included)
  std::string last_error;        // the most recent transient error seen, if any
};

struct RetryQueueOptions {
  std::int64_t capacity = 100'000;                // entries queued or in flight; >= 1
  std::chrono::milliseconds backoff_min{50};      // first retry delay; >= 1 ms
  std::chrono::milliseconds backoff_max{5000};    // cap of the exponential backoff; >= backoff_min
};

// Throws InvalidArgument naming the option as the Python API spells it
// (queue_capacity, retry_backoff, retry_backoff_max).
void validate(const RetryQueueOptions& options);

class RetryQueue : public std::enable_shared_from_this<RetryQueue> {
 public:
  // One queued write; a counter derives its own and downcasts in its attempt.
  struct Entry {
    virtual ~Entry() = default;
    bool counted = true;  // counts as an increment in stats() (false: bookkeeping, e.g. a TTL repair)
  };

  enum class Outcome : std::uint8_t {
    Sent,       // in the attempt; the attempt must replace it with one of the others
    Delivered,  // landed (or was found already applied)
    Again,      // transient failure: queued again with a longer backoff
    Failed,     // non-transient failure: given up
    Dropped,    // not sent: it could no longer be applied correctly (a window ended...)
  };

  // One retry attempt over `entries` (in queue order). Whoever builds it sets `outcomes`
  // (one per entry: Sent or Dropped) before it runs and each Sent one when it completes.
  // If it throws, every entry still Sent is tried again (a transient error) or failed.
  class Attempt : public Operation {
   public:
    std::vector<Outcome> outcomes;
    std::string last_error;  // the most recent transient error reply, if any
  };
  using MakeAttempt = std::function<std::shared_ptr<Attempt>(const std::vector<const Entry*>& entries)>;

  static std::shared_ptr<RetryQueue> create(std::shared_ptr<Store> store, RetryQueueOptions options,
                                            MakeAttempt make_attempt);
  RetryQueue(const RetryQueue&) = delete;
  RetryQueue& operator=(const RetryQueue&) = delete;
  ~RetryQueue();

  // Queues `entries` (all or none), due after the first backoff; starts the retry thread
  // on first use. `error` is the transient error that sent them here. Throws
  // RetryQueueFull (counted in stats().overflowed) when they do not fit, and Error once
  // the queue is closed.
  void enqueue(std::vector<std::unique_ptr<Entry>> entries, const std::string& error);

  // Retries everything queued now and waits until nothing is pending or `timeout` passes
  // (nullopt = no limit). Returns how many entries are still pending.
  std::size_t flush(std::optional<std::chrono::milliseconds> timeout);
  // Flushes within `timeout`, then stops the retry thread within what is left of it (see
  // the file comment). Later enqueue() calls throw. Returns how many entries it gave up.
  std::size_t close(std::optional<std::chrono::milliseconds> timeout);

  bool closed() const;
  std::size_t pending() const;
  RetryStats stats() const;
  const RetryQueueOptions& options() const noexcept { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    std::unique_ptr<Entry> entry;
    Clock::time_point due;
    std::chrono::milliseconds backoff;
  };

  RetryQueue(std::shared_ptr<Store> store, RetryQueueOptions options, MakeAttempt make_attempt);
  void loop();
  void attempt_due(bool everything);
  std::size_t pending_locked() const { return queue_.size() + in_flight_; }

  const std::shared_ptr<Store> store_;
  const RetryQueueOptions options_;
  const MakeAttempt make_attempt_;

  mutable std::mutex mu_;
  std::condition_variable wake_;     // wakes the retry thread
  std::condition_variable drained_;  // wakes flush() and close()
  std::deque<Slot> queue_;
  std::size_t in_flight_ = 0;          // taken off the queue by the current attempt
  std::size_t in_flight_counted_ = 0;  // ... of which count as increments
  RetryStats stats_;
  bool closed_ = false;
  bool flush_now_ = false;   // a flush wants everything at once
  bool abandoned_ = false;   // close() gave up on the attempt in flight
  bool running_ = false;     // the retry thread runs (it signals drained_ when it ends)
  std::thread thread_;
};

}  // namespace redcount
