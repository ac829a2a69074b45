#include "redcount/store/retry_queue.h"

#include <algorithm>
#include <utility>

#include "redcount/common/errors.h"
#include "redcount/common/threads.h"
#include "redcount/common/util.h"

namespace redcount {

namespace {
// Entries per attempt: one attempt stays one bounded batch however long the outage was.
constexpr std::size_t kMaxAttemptEntries = 4096;
}  // namespace

void validate(const RetryQueueOptions& o) {
  if (o.capacity < 1) throw InvalidArgument("queue_capacity must be >= 1, got " + std::to_string(o.capacity));
  if (o.backoff_min.count() < 1) {
    throw InvalidArgument("retry_backoff must be at least 0.001 seconds, got " + std::to_string(o.backoff_min.count()) +
                          " ms");
  }
  if (o.backoff_max < o.backoff_min) throw InvalidArgument("retry_backoff_max must be >= retry_backoff");
}

std::shared_ptr<RetryQueue> RetryQueue::create(std::shared_ptr<Store> store, RetryQueueOptions options,
                                               MakeAttempt make_attempt) {
  validate(options);
  if (!store) throw InvalidArgument("store must not be None");
  return std::shared_ptr<RetryQueue>(new RetryQueue(std::move(store), options, std::move(make_attempt)));
}

RetryQueue::RetryQueue(std::shared_ptr<Store> store, RetryQueueOptions options, MakeAttempt make_attempt)
    : store_(std::move(store)), options_(options), make_attempt_(std::move(make_attempt)) {}

RetryQueue::~RetryQueue() {
  // The retry thread holds a reference to its queue, so this runs after close() joined or
  // detached it, or on the retry thread itself as it ends.
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      {
        std::lock_guard<std::mutex> lock(mu_);
        closed_ = true;
      }
      wake_.notify_all();
      thread_.join();
    }
  }
}

void RetryQueue::enqueue(std::vector<std::unique_ptr<Entry>> entries, const std::string& error) {
  if (entries.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.last_error = error;
  if (closed_) throw Error("this counter is closed; the increment was not applied: " + error);
  if (pending_locked() + entries.size() > static_cast<std::size_t>(options_.capacity)) {
    stats_.overflowed += entries.size();
    throw RetryQueueFull("retry queue is full (capacity " + std::to_string(options_.capacity) +
                         "): " + std::to_string(entries.size()) +
                         " increment(s) were not queued; the store keeps failing with: " + error);
  }
  const auto now = Clock::now();
  for (auto& e : entries) {
    if (e->counted) ++stats_.queued;
    queue_.push_back(Slot{std::move(e), now + jittered(options_.backoff_min), options_.backoff_min});
  }
  if (!thread_.joinable()) {
    running_ = true;
    // The thread keeps its queue alive: close() may leave it to finish an attempt stuck on
    // a stalled server, and a counter dropped then must not wait for it (nor free what the
    // thread still uses).
    thread_ = start_thread([self = shared_from_this()] {
      self->loop();
      std::lock_guard<std::mutex> ended(self->mu_);
      self->running_ = false;
      self->drained_.notify_all();
    });
  }
  wake_.notify_all();
}

// Sleeps until the earliest entry is due (or a flush wants everything at once), then runs
// one attempt with the lock released; returns once the queue is closed.
void RetryQueue::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!closed_) {
    if (queue_.empty()) {
      wake_.wait(lock, [this] { return closed_ || !queue_.empty(); });
      continue;
    }
    const auto earliest =
        std::min_element(queue_.begin(), queue_.end(), [](const Slot& a, const Slot& b) { return a.due < b.due; })
            ->due;
    if (!flush_now_ && Clock::now() < earliest) {
      wake_.wait_until(lock, earliest, [this] { return closed_ || flush_now_; });
      continue;
    }
    const bool everything = flush_now_;
    flush_now_ = false;
    lock.unlock();
    attempt_due(everything);
    lock.lock();
  }
}

void RetryQueue::attempt_due(bool everything) {
  std::vector<Slot> batch;
  std::size_t counted = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    for (auto it = queue_.begin(); it != queue_.end() && batch.size() < kMaxAttemptEntries;) {
      if (everything || it->due <= now) {
        counted += it->entry->counted ? 1 : 0;
        batch.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    in_flight_ += batch.size();
    in_flight_counted_ += counted;
  }
  if (batch.empty()) return;

  std::vector<const Entry*> entries;
  entries.reserve(batch.size());
  for (const auto& s : batch) entries.push_back(s.entry.get());
  std::vector<Outcome> outcomes(batch.size(), Outcome::Sent);
  std::string last_error;
  try {
    std::shared_ptr<Attempt> attempt = make_attempt_(entries);
    if (!attempt || attempt->outcomes.size() != batch.size()) throw Error("retry attempt: no outcome per entry");
    if (std::any_of(attempt->outcomes.begin(), attempt->outcomes.end(),
                    [](Outcome o) { return o == Outcome::Sent; })) {
      try {
        // The retry thread may block: the synchronous driver is all it needs.
        run_operation(*store_, *attempt);
      } catch (const Error& e) {
        last_error = e.what();
        const Outcome whole = is_transient(e) ? Outcome::Again : Outcome::Failed;
        for (Outcome& o : attempt->outcomes) {
          if (o == Outcome::Sent) o = whole;
        }
      }
    }
    outcomes = std::move(attempt->outcomes);
    if (!attempt->last_error.empty()) last_error = attempt->last_error;
  } catch (const std::exception& e) {  // the attempt could not be built: give the batch up
    last_error = e.what();
    std::fill(outcomes.begin(), outcomes.end(), Outcome::Failed);
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (abandoned_) return;  // close() gave up on this attempt and counted its entries already
  const auto now = Clock::now();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    Slot& s = batch[i];
    const std::uint64_t n = s.entry->counted ? 1 : 0;
    switch (outcomes[i]) {
      case Outcome::Dropped: stats_.dropped += n; continue;
      case Outcome::Delivered: stats_.delivered += n; break;
      case Outcome::Again:
        s.backoff = std::min(s.backoff * 2, options_.backoff_max);
        s.due = now + jittered(s.backoff);
        queue_.push_back(std::move(s));
        break;
      case Outcome::Sent:  // an attempt that did not say: never lost silently
      case Outcome::Failed: stats_.failed += n; break;
    }
    stats_.retried += n;
  }
  in_flight_ -= batch.size();
  in_flight_counted_ -= counted;
  if (!last_error.empty()) stats_.last_error = last_error;
  drained_.notify_all();
}

std::size_t RetryQueue::flush(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (pending_locked() == 0) return 0;
  flush_now_ = true;
  wake_.notify_all();
  auto done = [this] { return pending_locked() == 0 || abandoned_; };
  if (timeout) {
    drained_.wait_for(lock, *timeout, done);
  } else {
    drained_.wait(lock, done);
  }
  return pending_locked();
}

std::size_t RetryQueue::close(std::optional<std::chrono::milliseconds> timeout) {
  const auto deadline = Clock::now() + timeout.value_or(std::chrono::milliseconds(0));
  flush(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return pending_locked();
  closed_ = true;
  wake_.notify_all();
  // Wait for the retry thread to end its current attempt, within what is left of the
  // timeout: a stalled server must not hold up close() (nor a destructor, which runs with
  // the GIL held in Python).
  auto stopped = [this] { return !running_; };
  bool ended = true;
  if (timeout) {
    ended = drained_.wait_until(lock, deadline, stopped);
  } else {
    drained_.wait(lock, stopped);
  }
  // Whatever is still queued, or in an attempt left behind, is given up: counted as
  // failed, never silently.
  const std::size_t left = pending_locked();
  for (const auto& s : queue_) stats_.failed += s.entry->counted ? 1 : 0;
  queue_.clear();
  if (!ended) {
    abandoned_ = true;
    stats_.failed += in_flight_counted_;
    in_flight_ = 0;
    in_flight_counted_ = 0;
  }
  std::thread thread = std::move(thread_);
  lock.unlock();
  if (thread.joinable()) {
    if (ended) {
      thread.join();
    } else {
      thread.detach();
    }
  }
  return left;
}

bool RetryQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::size_t RetryQueue::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_locked();
}

RetryStats RetryQueue::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RetryStats s = stats_;
  s.pending = pending_locked();
  return s;
}

}  // namespace redcount
