// The retry thread shared by the counters with on_error="queue" (FixedWindowCounter,
// ShardedCounter): each keeps its own queue of writes and its own retry attempt; these are
// the parts that do not depend on what is queued.
//
//   void Core::retry_loop() { run_retry_loop(*this); }        // the thread's body
//   std::vector<Queued> batch = take_due(queue, everything, SteadyClock::now());
//
// `Core` has, under `mu`: a `std::deque` `queue` of entries with a `due` time point, flags
// `stopping` and `flush_now` (a flush asks for everything now), `cv` to wake the thread,
// and `retry_due_once(bool everything)`, which runs one attempt without the lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

namespace redcount::detail {

// Sleeps until the earliest entry is due (or a flush wants everything at once), then runs
// one attempt with the lock released; returns when `stopping` is set.
template <class Core>
void run_retry_loop(Core& c) {
  std::unique_lock<std::mutex> lock(c.mu);
  while (!c.stopping) {
    if (c.queue.empty()) {
      c.cv.wait(lock, [&c] { return c.stopping || !c.queue.empty(); });
      continue;
    }
    using Entry = typename decltype(c.queue)::value_type;
    auto earliest = std::min_element(c.queue.begin(), c.queue.end(),
                                     [](const Entry& a, const Entry& b) { return a.due < b.due; })->due;
    if (!c.flush_now && decltype(earliest)::clock::now() < earliest) {
      c.cv.wait_until(lock, earliest, [&c] { return c.stopping || c.flush_now; });
      continue;
    }
    const bool everything = c.flush_now;
    c.flush_now = false;
    lock.unlock();
    c.retry_due_once(everything);
    lock.lock();
  }
}

// Takes off `queue`, in order, up to `max` entries that are due at `now` (all of them
// with `everything`). The caller holds the queue's lock.
template <class Entry, class TimePoint>
std::vector<Entry> take_due(std::deque<Entry>& queue, bool everything, TimePoint now, std::size_t max = 4096) {
  std::vector<Entry> batch;
  for (auto it = queue.begin(); it != queue.end() && batch.size() < max;) {
    if (everything || it->due <= now) {
      batch.push_back(std::move(*it));
      it = queue.erase(it);
    } else {
      ++it;
    }
  }
  return batch;
}

}  // namespace redcount::detail
