// The timer thread of a routed or followed topology: what waits for a time runs here, the
// backoffs of parked batches, the deadlines of calls parked for a new master, the cluster's
// rate-limited and periodic refreshes.
//
//   Timer timer;
//   timer.schedule(SteadyClock::now() + 10ms, [] { retry(); });
//   timer.close();  // runs what is still due at once (callers get their outcome), joins
//
// Thread-safe. The thread starts with the first schedule(). A function runs with no lock
// held; it may schedule more, and it may drop the last reference to the Timer's owner (the
// state the thread uses outlives the Timer). After close(), schedule() runs its function at
// once, on the caller's thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "redcount/redis/io/pipeline.h"

namespace redcount::redis {

class Timer {
 public:
  Timer() = default;
  ~Timer() { close(); }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  void schedule(TimePoint at, std::function<void()> fn);
  // Stops the thread; what was due later runs now, on this thread. Called from the timer's
  // own thread (a function that closes the owner), the thread is left to end by itself.
  void close();

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::multimap<TimePoint, std::function<void()>> due;
    bool stop = false;
  };
  static void run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::mutex thread_mu_;
  std::thread thread_;  // under thread_mu_
  bool closed_ = false;  // under thread_mu_
};

}  // namespace redcount::redis
