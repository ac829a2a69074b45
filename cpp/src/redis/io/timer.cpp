#include "redcount/redis/io/timer.h"

#include "redcount/common/threads.h"

namespace redcount::redis {

void Timer::run(const std::shared_ptr<State>& state) {
  std::unique_lock<std::mutex> lock(state->mu);
  while (!state->stop) {
    if (state->due.empty()) {
      state->cv.wait(lock);
      continue;
    }
    const TimePoint at = state->due.begin()->first;
    if (SteadyClock::now() < at) {
      state->cv.wait_until(lock, at);
      continue;
    }
    std::function<void()> fn = std::move(state->due.begin()->second);
    state->due.erase(state->due.begin());
    lock.unlock();
    fn();
    fn = nullptr;  // may drop the owner's last reference; `state` stays valid
    lock.lock();
  }
}

void Timer::schedule(TimePoint at, std::function<void()> fn) {
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (state_->stop) {
      lock.unlock();
      return fn();  // closed: a parked batch or call gets its outcome now
    }
    state_->due.emplace(at, std::move(fn));
  }
  state_->cv.notify_all();
  std::lock_guard<std::mutex> lock(thread_mu_);
  if (!closed_ && !thread_.joinable()) thread_ = start_thread([s = state_] { run(s); });
}

void Timer::close() {
  std::multimap<TimePoint, std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
    dropped.swap(state_->due);
  }
  state_->cv.notify_all();
  for (auto& [at, fn] : dropped) fn();
  dropped.clear();
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    closed_ = true;
    t = std::move(thread_);
  }
  if (!t.joinable()) return;
  if (t.get_id() == std::this_thread::get_id()) {
    t.detach();  // a function on the timer's thread closed the owner: the thread ends by itself
  } else {
    t.join();
  }
}

}  // namespace redcount::redis
