#include "redcount/sharded/buffered.h"

#include <algorithm>
#include <new>
#include <random>
#include <set>

#include "redcount/common/errors.h"
#include "redcount/common/threads.h"

namespace redcount {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::string random_id_base() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  std::mt19937_64 rng((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<std::uint64_t>(SteadyClock::now().time_since_epoch().count()));
  std::uint64_t v = rng();
  std::string out = "buf:";
  for (int i = 0; i < 16; ++i, v >>= 4) out += kHex[v & 15];
  return out + ":";
}

}  // namespace

BufferedCounter::BufferedCounter(std::shared_ptr<ShardedCounter> counter, BufferedOptions options)
    : counter_(std::move(counter)), options_(options), id_base_(random_id_base()) {
  if (!counter_) throw InvalidArgument("counter must not be None");
  if (counter_->options().route != ShardedOptions::Route::RequestId) {
    throw InvalidArgument("BufferedCounter needs a counter with route='request-id': each flush is an idempotent "
                          "write with a request id");
  }
  if (options_.flush_every.count() < 1) throw InvalidArgument("flush_every must be >= 0.001 seconds");
  if (options_.max_pending < 1) {
    throw InvalidArgument("max_pending must be >= 1, got " + std::to_string(options_.max_pending));
  }
  fork_hooks_ = ForkHooks::of(this);
}

BufferedCounter::~BufferedCounter() {
  close(std::chrono::milliseconds(0));
  fork_hooks_ = ForkHooks();
}

void BufferedCounter::bad_amount(std::int64_t amount) {
  if (amount == 0) throw InvalidArgument("amount must not be 0 (use a positive or negative integer)");
  throw InvalidArgument("amount must be within +-2**40, got " + std::to_string(amount));
}

void BufferedCounter::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw Error("this BufferedCounter is closed; create a new one");
  if (running_.load(std::memory_order_relaxed)) return;
  stopping_ = false;
  thread_ = std::make_unique<std::thread>(start_thread([this] { loop(); }));
  running_.store(true, std::memory_order_release);
}

void BufferedCounter::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_one();
}

void BufferedCounter::cut_batches() {
  // Units first: an increment landing between the two is then counted towards the next
  // wake-up although this cut takes it (an early flush, harmless), never the other way
  // round (a sum past max_pending that no wake-up would ever write before flush_every).
  units_.store(0, std::memory_order_relaxed);
  std::int64_t sum = sum_.exchange(0, std::memory_order_relaxed);
  // One write carries at most kMaxShardedAmount; a larger sum goes in several.
  while (sum != 0) {
    const std::int64_t part = std::clamp(sum, -kMaxShardedAmount, kMaxShardedAmount);
    batches_.push_back(Batch{part, id_base_ + std::to_string(next_id_++), SteadyClock::now()});
    sum -= part;
  }
}

void BufferedCounter::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait_for(lock, options_.flush_every, [this] { return stopping_ || wake_; });
    wake_ = false;
    cut_batches();
    if (!batches_.empty()) {
      lock.unlock();
      send_once();
      lock.lock();
    }
    acked_.notify_all();
    if (stopping_) return;
  }
}

void BufferedCounter::send_once() {
  std::deque<Batch> todo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo = batches_;
  }
  const auto id_life = std::chrono::milliseconds(counter_->options().idempotency_ttl_ms);
  std::size_t done = 0;
  std::int64_t flushed = 0, given_up = 0;
  std::uint64_t flushes = 0, retries = 0;
  std::string error;
  for (const Batch& b : todo) {
    if (SteadyClock::now() - b.first_tried >= id_life) {
      // Its id may have expired since an attempt that landed: retrying could count twice.
      given_up += b.amount;
      ++done;
      continue;
    }
    try {
      // True (applied now) or false (applied by an earlier attempt whose reply was lost):
      // either way the batch is in the store exactly once.
      counter_->incr(b.amount, b.request_id);
      flushed += b.amount;
      ++flushes;
      ++done;
    } catch (const Error& e) {
      error = e.what();
      if (is_transient(e)) {
        ++retries;
        break;  // keep this batch and the later ones, in order, for the next round
      }
      given_up += b.amount;
      ++done;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Only the flusher removes batches, and only from the front, so the first `done` are these.
  for (std::size_t i = 0; i < done && !batches_.empty(); ++i) batches_.pop_front();
  stats_.flushes += flushes;
  stats_.flushed_units += flushed;
  stats_.failed_units += given_up;
  stats_.retries += retries;
  if (!error.empty()) stats_.last_error = error;
}

std::int64_t BufferedCounter::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::int64_t total = sum_.load(std::memory_order_relaxed);
  for (const Batch& b : batches_) total += b.amount;
  return total;
}

std::int64_t BufferedCounter::flush(std::optional<std::chrono::milliseconds> timeout) {
  const auto deadline = timeout ? SteadyClock::now() + *timeout : SteadyClock::time_point::max();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!running_.load(std::memory_order_relaxed)) {
      if (sum_.load(std::memory_order_relaxed) == 0 && batches_.empty()) return 0;
    }
  }
  if (!running_.load(std::memory_order_acquire)) start();
  std::unique_lock<std::mutex> lock(mu_);
  auto drained = [this] { return batches_.empty() && sum_.load(std::memory_order_relaxed) == 0; };
  while (!drained() && !stopping_) {
    wake_ = true;
    cv_.notify_one();
    if (acked_.wait_until(lock, deadline) == std::cv_status::timeout) break;
  }
  std::int64_t total = sum_.load(std::memory_order_relaxed);
  for (const Batch& b : batches_) total += b.amount;
  return total;
}

std::int64_t BufferedCounter::close(std::optional<std::chrono::milliseconds> timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return 0;
  }
  flush(timeout);
  std::unique_ptr<std::thread> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    closed_ = true;
    t = std::move(thread_);
  }
  cv_.notify_all();
  if (t && t->joinable() && t->get_id() != std::this_thread::get_id()) t->join();
  std::lock_guard<std::mutex> lock(mu_);
  running_.store(false, std::memory_order_release);
  // Never acknowledged: given up and counted, never silently.
  std::int64_t left = sum_.exchange(0, std::memory_order_relaxed);
  for (const Batch& b : batches_) left += b.amount;
  batches_.clear();
  stats_.failed_units += left;
  return left;
}

BufferedStats BufferedCounter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BufferedStats s = stats_;
  s.pending = sum_.load(std::memory_order_relaxed);
  for (const Batch& b : batches_) s.pending += b.amount;
  return s;
}

void BufferedCounter::fork_prepare() { mu_.lock(); }

void BufferedCounter::fork_parent() { mu_.unlock(); }

void BufferedCounter::fork_child() {
  // The child has only the forking thread: abandon the flusher's handle (joining or
  // destroying a joinable std::thread would hang or terminate). What was pending belongs to
  // the parent, which writes it; the child starts empty, with its own request ids.
  (void)thread_.release();
  running_.store(false, std::memory_order_relaxed);
  sum_.store(0, std::memory_order_relaxed);
  units_.store(0, std::memory_order_relaxed);
  batches_.clear();
  wake_ = false;
  stopping_ = false;
  id_base_ = random_id_base();
  next_id_ = 0;
  stats_ = BufferedStats{};
  // The parent's flusher may have been waiting on these at the fork: in the child, a
  // condition variable that counts waiters it does not have can block a notify or a wait
  // for ever (glibc). Start them afresh (their memory holds no resources to release).
  new (&cv_) std::condition_variable();
  new (&acked_) std::condition_variable();
  mu_.unlock();
}

}  // namespace redcount
