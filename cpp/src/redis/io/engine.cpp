#include "redcount/redis/io/engine.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "redcount/common/address.h"
#include "redcount/common/errors.h"
#include "redcount/common/threads.h"
#include "redcount/common/util.h"

namespace redcount::redis {
namespace {

constexpr std::uint64_t kEventTag = 0;
constexpr std::uint64_t kTimerTag = 1;
constexpr std::uint64_t kSlotTag = 2;
constexpr std::uint32_t kIdleMask = EPOLLRDHUP | EPOLLONESHOT;
// Rejections that mean "did not run" are retried after this backoff (doubling).
constexpr std::chrono::milliseconds kRetryMin{5};
constexpr std::chrono::milliseconds kRetryMax{200};

thread_local const Engine* t_reactor = nullptr;

std::string ms_text(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

// A caller's synchronous wait for its job.
struct Waiter {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::vector<Reply> replies;
  std::exception_ptr error;

  void set(std::vector<Reply>&& r, std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(m);
    replies = std::move(r);
    error = std::move(e);
    done = true;
    cv.notify_one();  // under the lock: the waiter cannot return and free us before this
  }
  std::vector<Reply> wait() {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [this] { return done; });
    if (error) std::rethrow_exception(error);
    return std::move(replies);
  }
};

// The wait for a job's reply counts from its first write: the time before it (the caller's
// own work, a queue, or the process not being scheduled at all) is not the server's.
void wait_from_write(Job& job, TimePoint written, std::chrono::milliseconds timeout) {
  if (timeout.count() > 0 && job.deadline != kNever) job.deadline = std::max(job.deadline, written + timeout);
}

std::chrono::milliseconds watchdog_for(const StoreOptions& o) {
  if (o.command_timeout.count() == 0) return std::chrono::milliseconds(0);
  return std::max(o.command_timeout * 2, std::chrono::milliseconds(2000));
}

}  // namespace

namespace {
constexpr int kMaxThreadConnections = 256;
constexpr std::chrono::microseconds kAutoSpin{100};

// CPUs this process may run on (its affinity mask, which containers and taskset narrow).
int usable_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}
}  // namespace

Engine::Engine(const StoreOptions& options, bool for_blocking)
    : options_(options),
      where_(server_name(options)),
      watchdog_(watchdog_for(options)),
      mux_(static_cast<std::size_t>(std::max(options.connections, 1))),
      for_blocking_(for_blocking) {
  if (options_.connections < 1 || options_.connections > 4) {
    throw InvalidArgument("connections must be 1 to 4 (sockets multiplexed per server), got " +
                          std::to_string(options_.connections));
  }
  if (options_.connect_timeout.count() < 0 || options_.command_timeout.count() < 0 ||
      options_.pool_timeout.count() < 0) {
    throw InvalidArgument("timeouts must be >= 0 (0 means wait forever)");
  }
  if (options_.max_connections < 1) {
    throw InvalidArgument("max_connections must be >= 1, got " + std::to_string(options_.max_connections));
  }
  if (options_.spin.count() > 1000) {
    throw InvalidArgument("spin must be at most 1 ms (it is a poll before sleeping), got " +
                          std::to_string(options_.spin.count()) + " us");
  }
  spin_ = options_.spin.count() >= 0 ? options_.spin : (usable_cpus() >= 2 ? kAutoSpin : std::chrono::microseconds(0));
  const int threads = std::min(std::max(options_.max_connections - options_.connections, 0), kMaxThreadConnections);
  slots_.resize(mux_ + static_cast<std::size_t>(threads));
  thread_slots_ = threads > 0;
  ours_.assign(slots_.size(), 0);
}

Engine::~Engine() {
  close();
  if (thread_.joinable()) thread_.detach();  // only when destroyed by its own thread
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  {
    std::lock_guard<std::mutex> lock(resolved_->mu);
    resolved_->fd = -1;  // a resolver thread still running must not write to it
  }
  if (event_fd_ >= 0) ::close(event_fd_);
  if (timer_fd_ >= 0) ::close(timer_fd_);
}

bool Engine::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

std::string Engine::describe() const {
  if (options_.kind == StoreOptions::Kind::Unix) return "unix://" + options_.unix_path + "?db=" + std::to_string(options_.db);
  return std::string(options_.tls ? "rediss://" : "redis://") +
         (options_.username.empty() ? std::string() : options_.username + "@") + options_.host + ":" +
         std::to_string(options_.port) + "/" + std::to_string(options_.db);
}

std::string Engine::address() const {
  if (options_.kind == StoreOptions::Kind::Unix) return options_.unix_path;
  return Address{options_.host, options_.port}.text();
}

int Engine::open_connections() const {
  std::shared_ptr<Engine> blocking;
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : slots_) n += s.ready ? 1 : 0;
    blocking = blocking_;
  }
  return n + (blocking ? blocking->open_connections() : 0);
}

void Engine::stop_retries() noexcept {
  no_retries_.store(true, std::memory_order_relaxed);
  std::shared_ptr<Engine> blocking;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocking = blocking_;
  }
  if (blocking) blocking->stop_retries();
}

std::shared_ptr<Engine> Engine::blocking_engine() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) {
    throw StoreClosed("the store for " + where_ + " is closed; open a new one with redcount.connect() (nothing was sent)");
  }
  if (!blocking_) {
    // Same server, handshake, TLS and credentials. Each WAIT holds a socket for up to its
    // timeout, so this engine multiplexes over as many sockets as an engine may (4), and
    // synchronous callers that find them busy open thread connections as usual.
    StoreOptions o = options_;
    o.connections = 4;
    o.max_connections = std::max(options_.max_connections, o.connections);
    blocking_ = std::make_shared<Engine>(o, true);
    if (no_retries_.load(std::memory_order_relaxed)) blocking_->no_retries_.store(true, std::memory_order_relaxed);
  }
  return blocking_;
}

TimePoint Engine::deadline_for(std::chrono::milliseconds block) {
  if (block.count() > 0) {
    std::int64_t seen = block_slack_ms_.load(std::memory_order_relaxed);
    while (seen < block.count() && !block_slack_ms_.compare_exchange_weak(seen, block.count())) {
    }
  }
  if (options_.command_timeout.count() == 0) return kNever;
  return SteadyClock::now() + options_.command_timeout + block;
}

void Engine::start_locked() {
  if (started_) return;
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (epoll_fd_ < 0 || event_fd_ < 0 || timer_fd_ < 0) {
    throw ConnectionError(std::string("cannot start the I/O engine: ") + std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kEventTag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  ev.data.u64 = kTimerTag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, timer_fd_, &ev);
  {
    std::lock_guard<std::mutex> lock(resolved_->mu);
    resolved_->fd = event_fd_;
  }
  thread_ = start_thread([this] { run(); });
  started_ = true;
}

void Engine::ResolvedSignal::notify() {
  pending.store(true);
  std::lock_guard<std::mutex> lock(mu);
  const std::uint64_t one = 1;
  if (fd < 0) return;
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}

void Engine::wake() {
  const std::uint64_t one = 1;
  // A full counter (never in practice) still leaves the eventfd readable: nothing lost.
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof one);
}

std::exception_ptr Engine::backoff_error_locked(TimePoint now) const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_connect_ - now).count();
  const std::string again = "next attempt in " + std::to_string(std::max<std::int64_t>(left, 0)) + " ms";
  switch (failure_kind_) {
    case FailureKind::Auth:
      return std::make_exception_ptr(AuthenticationError(failure_ + " (retrying with backoff; " + again + ")"));
    case FailureKind::Reply:
      return std::make_exception_ptr(ReplyError(failure_ + " (retrying with backoff; " + again + ")"));
    case FailureKind::Timeout:
      return std::make_exception_ptr(TimeoutError(failure_ + " (reconnecting with backoff; " + again + ")"));
    case FailureKind::Connection:
      break;
  }
  return std::make_exception_ptr(ConnectionError(failure_ + " (reconnecting with backoff; " + again + ")"));
}

// ----------------------------------------------------------------------------- callers

void Engine::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  std::shared_ptr<Job> job;
  try {
    if (cancelled && cancelled->load()) throw Cancelled("cancelled before it was sent");
    const std::chrono::milliseconds block = blocking_time(batch);
    if (block.count() > 0 && !for_blocking_) {
      std::shared_ptr<Engine> blocking = blocking_engine();
      return blocking->submit(std::move(batch), std::move(done), std::move(cancelled));
    }
    const TimePoint deadline = deadline_for(block);
    job = make_job(std::move(batch), std::move(done), std::move(cancelled), deadline);
  } catch (...) {
    if (done) done({}, std::current_exception());
    return;
  }
  if (job->requests.empty()) {
    job->succeed();
    return job->deliver();
  }
  enqueue(std::move(job), t_reactor != this);
}

void Engine::submit_routed(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint deadline,
                           std::shared_ptr<std::vector<std::uint8_t>> answered) {
  std::shared_ptr<Job> job;
  try {
    if (cancelled && cancelled->load()) throw Cancelled("cancelled before it was sent");
    // The router has added the batch's blocking time to `deadline`.
    const std::chrono::milliseconds block = blocking_time(batch);
    if (block.count() > 0 && !for_blocking_) {
      std::shared_ptr<Engine> blocking = blocking_engine();
      return blocking->submit_routed(std::move(batch), std::move(done), std::move(cancelled), deadline,
                                     std::move(answered));
    }
    deadline_for(block);
    job = make_job(std::move(batch), std::move(done), std::move(cancelled), deadline);
  } catch (...) {
    if (done) done({}, std::current_exception());
    return;
  }
  job->routed = true;
  if (answered) answered->assign(job->requests.size(), 0);
  job->answered = std::move(answered);
  if (job->requests.empty()) {
    job->succeed();
    return job->deliver();
  }
  enqueue(std::move(job), t_reactor != this);
}

void Engine::enqueue(std::shared_ptr<Job> job, bool may_wait) {
  std::exception_ptr refused;
  bool do_wake = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const TimePoint now = SteadyClock::now();
    if (closed_) {
      refused = std::make_exception_ptr(
          StoreClosed("the store for " + where_ + " is closed; open a new one with redcount.connect() (nothing was sent)"));
    } else {
      try {
        start_locked();
      } catch (...) {
        refused = std::current_exception();
      }
    }
    if (!refused) {
      const bool any_ready = std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.ready; });
      if (!any_ready && connecting_ == 0 && now < next_connect_) refused = backoff_error_locked(now);
    }
    if (!refused && may_wait && queued_requests_ >= kMaxQueued) {
      const TimePoint until = options_.pool_timeout.count() > 0 ? now + options_.pool_timeout : kNever;
      const bool room = space_cv_.wait_until(lock, until, [this] { return closed_ || queued_requests_ < kMaxQueued; });
      if (closed_) {
        refused = std::make_exception_ptr(StoreClosed("the store for " + where_ + " was closed (nothing was sent)"));
      } else if (!room) {
        refused = std::make_exception_ptr(TimeoutError(
            "the queue of requests waiting for " + where_ + " stayed full (" + std::to_string(kMaxQueued) +
            " requests) for pool_timeout=" + ms_text(options_.pool_timeout) +
            "; the server is slow or unreachable: raise pool_timeout, or connections (up to 4); nothing was sent"));
      }
    }
    if (!refused) {
      queued_requests_ += job->requests.size();
      queue_.push_back(std::move(job));
      do_wake = !wake_pending_;
      wake_pending_ = true;
    }
  }
  if (refused) {
    job->fail(refused);
    job->deliver();
    return;
  }
  if (do_wake) wake();
}

int Engine::try_borrow() {
  bool do_wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return -1;
    // A multiplexed connection only when nothing is queued for it (queued jobs go first).
    for (std::size_t i = queue_.empty() ? 0 : mux_; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (s.ready && s.owner == Owner::None && !s.hup) {
        s.owner = Owner::Caller;
        return static_cast<int>(i);
      }
    }
    // Every connection is busy: ask for one more thread connection (one opening at a
    // time, none during a reconnect backoff); this call goes through the reactor.
    const TimePoint now = SteadyClock::now();
    if (!started_ || now < next_connect_ || now < next_thread_connect_) return -1;
    // Only fields under mu_ here, never `conn`: the reactor opens and resets a slot's
    // connection without the lock while it owns the slot. A slot the reactor owns that is
    // not ready is opening (or was just lost); one nobody owns that is not ready has no
    // connection (the reactor releases a slot only when it is ready and idle, or empty).
    std::size_t free_slot = slots_.size();
    for (std::size_t i = mux_; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.wanted || (s.owner == Owner::Reactor && !s.ready)) return -1;
      if (!s.ready && s.owner == Owner::None && free_slot == slots_.size()) free_slot = i;
    }
    if (free_slot == slots_.size()) return -1;
    slots_[free_slot].wanted = true;
    do_wake = !wake_pending_;
    wake_pending_ = true;
  }
  if (do_wake) wake();
  return -1;
}

void Engine::give_back(int i, bool to_reactor) {
  bool do_wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[static_cast<std::size_t>(i)];
    if (to_reactor || s.hup) {
      s.owner = Owner::Reactor;
      s.adopt = true;
      s.hup = false;
      do_wake = true;
    } else {
      s.owner = Owner::None;
      do_wake = !queue_.empty();
    }
    if (do_wake) {
      do_wake = !wake_pending_;
      wake_pending_ = true;
    }
    if (closed_) space_cv_.notify_all();  // close() waits for borrowers
  }
  if (do_wake) wake();
}

std::vector<Reply> Engine::execute(const std::vector<Request>& batch) {
  const std::chrono::milliseconds block = blocking_time(batch);
  if (block.count() > 0 && !for_blocking_) return blocking_engine()->execute(batch);
  return execute_job(batch, deadline_for(block), false);
}

std::vector<Reply> Engine::execute(std::vector<Request>&& batch) {
  const std::chrono::milliseconds block = blocking_time(batch);
  if (block.count() > 0 && !for_blocking_) return blocking_engine()->execute(std::move(batch));
  return execute_job(std::move(batch), deadline_for(block), false);
}

std::vector<Reply> Engine::execute_routed(const std::vector<Request>& batch, TimePoint deadline) {
  const std::chrono::milliseconds block = blocking_time(batch);
  if (block.count() > 0 && !for_blocking_) return blocking_engine()->execute_routed(batch, deadline);
  deadline_for(block);
  return execute_job(batch, deadline, true);
}

std::vector<Reply> Engine::execute_job(std::vector<Request> batch, TimePoint deadline, bool routed) {
  if (t_reactor == this) {
    throw Error("a blocking call on the store from inside one of its own completion callbacks would deadlock "
                "its I/O thread; use submit() there");
  }
  if (batch.empty()) return {};
  sync_callers_.fetch_add(1, std::memory_order_relaxed);
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1, std::memory_order_relaxed); }
  } leave{sync_callers_};
  Waiter w;
  auto job = make_job(std::move(batch), [&w](std::vector<Reply>&& r, std::exception_ptr e) { w.set(std::move(r), e); }, nullptr,
                      deadline, false);
  job->routed = routed;
  const int slot = try_borrow();
  if (slot < 0 || !run_borrowed(slot, job)) {
    format_wire(*job);  // here, not on the reactor thread
    enqueue(job, true);
  }
  return w.wait();
}

// The synchronous fast path on a borrowed idle connection. Returns false when the job
// must go to the reactor instead (nothing of it was sent).
bool Engine::run_borrowed(int i, const std::shared_ptr<Job>& job) {
  Connection& c = *slots_[static_cast<std::size_t>(i)].conn;
  if (!c.alive()) {  // EOF or stray bytes: let the reactor find out and reconnect
    give_back(i, true);
    return false;
  }
  bool handed = false;
  try {
    start_round(job, c.out(), c.inflight(), c.stream_end());
    c.touch(SteadyClock::now());
    bool first = true;
    for (;;) {
      bool on_time = c.flush_until(job->deadline);
      // Alone, with replies lately quicker than twice the poll: poll before sleeping.
      const TimePoint sent = SteadyClock::now();
      if (first && on_time) wait_from_write(*job, sent, options_.command_timeout);
      first = false;
      const bool spin = spin_.count() > 0 && sync_callers_.load(std::memory_order_relaxed) == 1 &&
                        reply_us_.load(std::memory_order_relaxed) <= 2 * spin_.count();
      const TimePoint spin_until = spin ? sent + spin_ : TimePoint{};
      std::shared_ptr<Job> over;
      auto on_reply = [&](Reply&& r) {
        if (c.inflight().empty()) throw ProtocolError("a reply from " + where_ + " that no request asked for");
        if (auto j = take_reply(c.inflight(), std::move(r), where_)) over = std::move(j);
      };
      while (on_time && !over) on_time = c.read_until(job->deadline, on_reply, spin_until);
      bool late = false;
      if (!on_time) {
        // One more look before the timeout: a reply that arrived while this thread was not
        // running (descheduled, or the process stopped) is the server's answer in time.
        c.read(on_reply);
        on_time = late = over != nullptr;
      }
      if (on_time && !late && spin_.count() > 0) {  // (a late look measures this thread, not the server)
        // A moving average over about 8 replies; a lost update between threads only delays it.
        const auto took = std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - sent).count();
        const std::int64_t avg = reply_us_.load(std::memory_order_relaxed);
        reply_us_.store(avg + (took - avg) / 8, std::memory_order_relaxed);
      }
      if (!on_time) {
        // Fails alone; its replies stay due and are discarded by the reactor, which takes
        // the connection over, so the connection stays in step.
        job->abandoned = true;
        job->fail(std::make_exception_ptr(TimeoutError(
            "timed out waiting for a reply from " + where_ + " (command_timeout=" + ms_text(options_.command_timeout) +
                "); the command may or may not have run",
            true)));
        give_back(i, true);
        handed = true;
        break;
      }
      Next next = after_round(*job, SteadyClock::now(), kRetryMin, kRetryMax);
      if (next == Next::Later && no_retries_.load(std::memory_order_relaxed)) {
        job->succeed();  // the caller gets the rejection itself now
        next = Next::Complete;
      }
      if (next == Next::Again) {
        start_round(job, c.out(), c.inflight(), c.stream_end());
        continue;
      }
      if (next == Next::Later) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          handoff_.push_back(job);
        }
        give_back(i, true);  // wakes the reactor, which schedules the retry
        return true;
      }
      give_back(i, false);
      handed = true;
      break;
    }
  } catch (const Error& e) {
    if (handed) throw;
    const bool sent = job->round_begin < c.written();
    // Whatever happened, the reactor closes this connection (it reads the EOF we cause
    // here) and opens a new one.
    c.inflight().clear();
    c.discard_output();
    c.interrupt();
    give_back(i, true);
    if (!sent && !job->finished && !closed()) {
      job->outstanding = 0;
      return false;  // sent by the reactor on a new connection: it cannot have run
    }
    if (closed()) {
      job->fail(std::make_exception_ptr(
          StoreClosed("the store for " + where_ + " was closed during the call; it may or may not have run", sent)));
    } else {
      job->fail(std::make_exception_ptr(ConnectionError("connection to " + where_ + " lost (" + e.what() +
                                                            ") after the request was sent; it may or may not have run",
                                                        true)));
    }
  }
  job->deliver();
  return true;
}

void Engine::close() {
  bool already = false;
  std::vector<std::shared_ptr<Job>> jobs;
  std::shared_ptr<Engine> blocking;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) {
      already = true;
      // Another thread is closing: wait until it is done (not on the reactor thread, which
      // that thread may be joining).
      if (t_reactor != this) space_cv_.wait(lock, [this] { return close_done_; });
    } else {
      closed_ = true;
      blocking = blocking_;
      for (auto& j : queue_) jobs.push_back(std::move(j));
      queue_.clear();
      queued_requests_ = 0;
      for (auto& s : slots_) {
        if (s.owner == Owner::Caller && s.conn) s.conn->interrupt();  // wakes a blocked borrower
      }
      space_cv_.notify_all();
    }
  }
  if (already) return;
  if (blocking) blocking->close();
  for (auto& j : jobs) {
    j->fail(std::make_exception_ptr(StoreClosed("the store for " + where_ + " was closed (nothing was sent)")));
    j->deliver();
  }
  if (started_) {
    wake();
    if (t_reactor == this) {
      keepalive_ = shared_from_this();  // the reactor finishes its step, then exits
      thread_.detach();
      return;
    }
    thread_.join();
  } else {
    shutdown_reactor();
  }
  std::lock_guard<std::mutex> lock(mu_);
  close_done_ = true;
  space_cv_.notify_all();
}

// ----------------------------------------------------------------------------- reactor

void Engine::run() {
  t_reactor = this;
  epoll_event evs[16];
  bool running = true;
  while (running) {
    const int n = ::epoll_wait(epoll_fd_, evs, 16, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    bool tick = false;
    for (int k = 0; k < n; ++k) {
      const std::uint64_t tag = evs[k].data.u64;
      std::uint64_t value;
      if (tag == kEventTag) {
        [[maybe_unused]] ssize_t r = ::read(event_fd_, &value, sizeof value);
      } else if (tag == kTimerTag) {
        [[maybe_unused]] ssize_t r = ::read(timer_fd_, &value, sizeof value);
        tick = true;
      } else {
        Slot& s = slots_[tag - kSlotTag];
        s.events |= evs[k].events;
        if (s.mask & EPOLLONESHOT) s.mask = 0;  // disarmed until re-registered
      }
    }
    running = step(tick);
  }
  shutdown_reactor();
  std::shared_ptr<Engine> keep = std::move(keepalive_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    close_done_ = true;
    space_cv_.notify_all();
  }
  // `keep` may hold the last reference: the engine is destroyed here, on its own thread.
}

bool Engine::step(bool tick) {
  const TimePoint now = SteadyClock::now();
  if (tick) armed_ = kNever;
  std::vector<std::shared_ptr<Job>> requeue;
  // Slots this thread owns in this step. Only the reactor takes a slot from None and
  // only it gives one back, so this stays true until it releases them below.
  std::vector<char>& ours = ours_;
  std::fill(ours.begin(), ours.end(), 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_pending_ = false;
    if (closed_) return false;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (s.owner == Owner::Caller) {
        if (s.events != 0) s.hup = true;  // the borrower hands it back to us
        s.events = 0;
        continue;
      }
      if (s.adopt) {
        s.adopt = false;
        s.events |= EPOLLIN;
      }
      if (s.events != 0 && s.owner == Owner::None) s.owner = Owner::Reactor;
      ours[i] = s.owner == Owner::Reactor;
    }
    for (auto& j : handoff_) delayed_.push_back(std::move(j));
    handoff_.clear();
  }
  const bool resolved = resolved_->pending.exchange(false);
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (ours[i] && s.conn && (s.events != 0 || (resolved && s.conn->resolving()))) {
      handle_slot(static_cast<int>(i), now, requeue);
    }
    slots_[i].events = 0;
  }
  if (tick) expire(now, ours, requeue);
  for (const auto& j : delayed_) arm(j->not_before);

  // Hand queued jobs to connections.
  std::vector<std::pair<int, std::shared_ptr<Job>>> assigned;
  std::vector<int> to_open;
  std::vector<std::shared_ptr<Job>> refused;
  std::exception_ptr refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = requeue.rbegin(); it != requeue.rend(); ++it) {
      queued_requests_ += (*it)->requests.size();
      queue_.push_front(std::move(*it));
    }
    requeue.clear();
    for (std::size_t i = mux_; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.wanted) continue;
      s.wanted = false;
      if (!s.conn && s.owner == Owner::None && now >= next_connect_ && now >= next_thread_connect_) {
        s.owner = Owner::Reactor;
        ours[i] = true;
        ++connecting_;
        to_open.push_back(static_cast<int>(i));
      }
    }
    if (!queue_.empty()) {
      for (std::size_t i = 0; i < mux_; ++i) {
        Slot& s = slots_[i];
        if (!s.conn && s.owner != Owner::Caller && now >= next_connect_) {
          s.owner = Owner::Reactor;
          ours[i] = true;
          ++connecting_;
          to_open.push_back(static_cast<int>(i));
        }
      }
    }
    while (!queue_.empty()) {
      int best = -1;
      for (std::size_t i = 0; i < mux_; ++i) {
        const Slot& s = slots_[i];
        if (!s.ready || s.owner == Owner::Caller || s.load >= kMaxInFlight) continue;
        if (best < 0 || s.load < slots_[static_cast<std::size_t>(best)].load) best = static_cast<int>(i);
      }
      if (best < 0) break;
      Slot& s = slots_[static_cast<std::size_t>(best)];
      s.owner = Owner::Reactor;
      ours[best] = true;
      auto job = std::move(queue_.front());
      queue_.pop_front();
      queued_requests_ -= job->requests.size();
      s.load += job->requests.size();
      assigned.emplace_back(best, std::move(job));
    }
    // Past their deadline only now: what a connection can carry was handed over above, so a
    // job the I/O thread reaches late (not scheduled) is written, not failed unsent.
    if (tick) {
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->deadline <= now) {
          queued_requests_ -= (*it)->requests.size();
          (*it)->fail(std::make_exception_ptr(TimeoutError(
              "timed out after " + ms_text(options_.command_timeout) + " waiting for a connection to " + where_ +
              (failure_.empty() ? std::string() : " (last error: " + failure_ + ")") + "; nothing was sent")));
          finished_.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
    }
    const bool any_ready = std::any_of(slots_.begin(), slots_.begin() + static_cast<std::ptrdiff_t>(mux_),
                                       [](const Slot& s) { return s.ready; });
    if (!queue_.empty() && !any_ready && connecting_ == 0) {
      // Nothing can carry them: fail at once rather than at the deadline (never sent).
      refusal = backoff_error_locked(now);
      for (auto& j : queue_) refused.push_back(std::move(j));
      queue_.clear();
      queued_requests_ = 0;
    }
    for (const auto& j : queue_) arm(j->deadline);
    if (queued_requests_ < kMaxQueued) space_cv_.notify_all();
  }
  for (auto& j : refused) {
    j->fail(refusal);
    finished_.push_back(std::move(j));
  }
  for (int i : to_open) open_slot(i, now);
  std::vector<std::pair<int, std::shared_ptr<Job>>> first_writes;  // first rounds, written below
  for (auto& [i, job] : assigned) {
    Slot& s = slots_[static_cast<std::size_t>(i)];
    if (job->is_cancelled()) {
      job->fail(std::make_exception_ptr(Cancelled("cancelled before it was sent")));
      finished_.push_back(std::move(job));
      continue;
    }
    if (!s.conn || !s.conn->ready()) {  // lost earlier in this step
      requeue.push_back(std::move(job));
      continue;
    }
    Connection& c = *s.conn;
    if (c.inflight().empty()) c.touch(now);
    if (job->todo.empty()) first_writes.emplace_back(i, job);
    start_round(job, c.out(), c.inflight(), c.stream_end());
    s.min_deadline = std::min(s.min_deadline, job->deadline);
    arm(job->deadline);
  }
  // One write per connection: everything queued since the last wake-up.
  std::vector<int> release;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.conn || !ours[i]) continue;
    Connection& c = *s.conn;
    if (c.ready() && c.has_output()) {
      try {
        c.flush();
      } catch (const Error& e) {
        connection_lost(static_cast<int>(i), e.what(), requeue);
        continue;
      }
      if (!c.has_output()) {  // written whole: their wait for the server starts now
        for (auto& [slot, job] : first_writes) {
          if (slot == static_cast<int>(i)) wait_from_write(*job, now, options_.command_timeout);
        }
      }
    }
    if (c.ready() && c.idle()) {
      set_interest(static_cast<int>(i), kIdleMask);
      s.min_deadline = kNever;
      release.push_back(static_cast<int>(i));
    } else {
      set_interest(static_cast<int>(i), c.wanted() | EPOLLRDHUP);
      arm(s.min_deadline);
      if (c.ready() && watchdog_.count() > 0) arm(c.last_progress() + watchdog_limit());
      if (!c.ready()) arm(c.setup_deadline());
    }
  }
  bool again = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (s.owner != Owner::Reactor) continue;
      s.load = s.conn ? s.conn->inflight().size() : 0;
      if (!s.conn && !s.adopt) s.owner = Owner::None;
    }
    for (int i : release) slots_[static_cast<std::size_t>(i)].owner = Owner::None;
    for (auto it = requeue.rbegin(); it != requeue.rend(); ++it) {
      queued_requests_ += (*it)->requests.size();
      queue_.push_front(std::move(*it));
    }
    if (!requeue.empty() && !wake_pending_) {
      wake_pending_ = true;
      again = true;
    }
  }
  if (again) wake();
  // Completions last: a caller woken here finds the connection idle again (fast path).
  std::vector<std::shared_ptr<Job>> done;
  done.swap(finished_);
  for (auto& j : done) j->deliver();
  return true;
}

void Engine::handle_slot(int i, TimePoint now, std::vector<std::shared_ptr<Job>>& requeue) {
  Slot& s = slots_[static_cast<std::size_t>(i)];
  Connection& c = *s.conn;
  if (!c.ready()) {
    try {
      c.advance();
    } catch (...) {
      return connect_failed(i, std::current_exception(), now);
    }
    if (c.ready()) {
      server_major_.store(c.server_major(), std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(mu_);
      s.ready = true;
      --connecting_;
      backoff_ = std::chrono::milliseconds(0);
      next_connect_ = {};
      thread_backoff_ = std::chrono::milliseconds(0);
      next_thread_connect_ = {};
      failure_.clear();
    }
    return;
  }
  try {
    c.read([&](Reply&& r) {
      if (c.inflight().empty()) throw ProtocolError("a reply from " + where_ + " that no request asked for");
      if (auto job = take_reply(c.inflight(), std::move(r), where_)) round_over(i, job, now);
    });
    if (c.has_output()) c.flush();
  } catch (const Error& e) {
    connection_lost(i, e.what(), requeue);
  }
}

void Engine::round_over(int i, const std::shared_ptr<Job>& job, TimePoint now) {
  Connection& c = *slots_[static_cast<std::size_t>(i)].conn;
  switch (after_round(*job, now, kRetryMin, kRetryMax)) {
    case Next::Complete:
      finished_.push_back(job);
      return;
    case Next::Again:
      start_round(job, c.out(), c.inflight(), c.stream_end());
      return;
    case Next::Later:
      if (no_retries_.load(std::memory_order_relaxed)) {
        job->succeed();  // the caller gets the rejection itself now
        finished_.push_back(job);
        return;
      }
      delayed_.push_back(job);
      return;
  }
}

void Engine::connection_lost(int i, const std::string& why, std::vector<std::shared_ptr<Job>>& requeue) {
  Slot& s = slots_[static_cast<std::size_t>(i)];
  Connection& c = *s.conn;
  const std::uint64_t written = c.written();
  for (auto& e : c.inflight()) {
    if (!e.job || e.job->abandoned || e.job->finished) continue;
    Job& j = *e.job;
    if (j.round_begin < written) {
      j.abandoned = true;
      j.fail(std::make_exception_ptr(ConnectionError("connection to " + where_ + " lost (" + why +
                                                         ") after the request was sent; it may or may not have run",
                                                     true)));
      finished_.push_back(e.job);
    } else if (requeue.empty() || requeue.back() != e.job) {
      j.outstanding = 0;
      requeue.push_back(e.job);  // never written: it cannot have run
    }
  }
  s.conn.reset();
  s.in_epoll = false;
  s.mask = 0;
  s.min_deadline = kNever;
  std::lock_guard<std::mutex> lock(mu_);
  s.ready = false;
  s.load = 0;
}

void Engine::connect_failed(int i, std::exception_ptr error, TimePoint now) {
  Slot& s = slots_[static_cast<std::size_t>(i)];
  s.conn.reset();
  s.in_epoll = false;
  s.mask = 0;
  FailureKind kind = FailureKind::Connection;
  std::string text;
  try {
    std::rethrow_exception(error);
  } catch (const AuthenticationError& e) {
    kind = FailureKind::Auth;
    text = e.what();
  } catch (const ReplyError& e) {
    kind = FailureKind::Reply;
    text = e.what();
  } catch (const TimeoutError& e) {
    kind = FailureKind::Timeout;
    text = e.what();
  } catch (const std::exception& e) {
    text = e.what();
  }
  std::lock_guard<std::mutex> lock(mu_);
  --connecting_;
  if (static_cast<std::size_t>(i) >= mux_) {
    // A thread connection only saves a thread hop: its failure backs off further thread
    // connections alone. Whether the server can be reached is for the multiplexed
    // connections to find out (they back the store off and fail its queue), so a thread
    // connection lost in its handshake, e.g. to a reset that also took the multiplexed one,
    // never refuses calls that the multiplexed connection, reopened at once, would carry.
    thread_backoff_ = thread_backoff_.count() == 0 ? options_.reconnect_backoff_min
                                                   : std::min(thread_backoff_ * 2, options_.reconnect_backoff_max);
    next_thread_connect_ = now + jittered(thread_backoff_);
    return;
  }
  // Refused connections and refused passwords alike: exponential, jittered, so a dead
  // server or a wrong password costs a few connects a second, not thousands.
  backoff_ = backoff_.count() == 0 ? options_.reconnect_backoff_min
                                   : std::min(backoff_ * 2, options_.reconnect_backoff_max);
  next_connect_ = now + jittered(backoff_);
  failure_kind_ = kind;
  failure_ = text;
  const bool any_ready = std::any_of(slots_.begin(), slots_.begin() + static_cast<std::ptrdiff_t>(mux_),
                                     [](const Slot& x) { return x.ready; });
  if (!any_ready && connecting_ == 0) {
    for (auto& j : queue_) {
      j->fail(error);
      finished_.push_back(std::move(j));
    }
    queue_.clear();
    queued_requests_ = 0;
  }
}

void Engine::open_slot(int i, TimePoint now) {
  Slot& s = slots_[static_cast<std::size_t>(i)];
  try {
    if (options_.tls && !tls_) tls_ = make_tls_context(options_);  // once per store
    s.conn = std::make_unique<Connection>(options_, tls_, [signal = resolved_] { signal->notify(); });
    s.conn->open(now);
  } catch (...) {
    return connect_failed(i, std::current_exception(), now);
  }
  set_interest(i, s.conn->wanted() | EPOLLRDHUP);
  arm(s.conn->setup_deadline());
}

void Engine::expire(TimePoint now, const std::vector<char>& ours, std::vector<std::shared_ptr<Job>>& requeue) {
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.conn || !ours[i]) continue;
    Connection& c = *s.conn;
    if (!c.ready()) {
      if (now >= c.setup_deadline()) {
        try {
          c.throw_setup_timeout();
        } catch (...) {
          connect_failed(static_cast<int>(i), std::current_exception(), now);
        }
      }
      continue;
    }
    if (s.min_deadline <= now) {
      // One more read first: a reply that arrived after epoll_wait returned (this thread was
      // not running) completes its job instead of timing it out.
      handle_slot(static_cast<int>(i), now, requeue);
      if (!s.conn) continue;  // lost while reading: its jobs were failed or requeued
      TimePoint next = kNever;
      for (auto& e : c.inflight()) {
        if (!e.job || e.job->abandoned || e.job->finished) continue;
        if (e.job->deadline <= now) {
          e.job->abandoned = true;
          e.job->fail(std::make_exception_ptr(TimeoutError(
              "timed out waiting for a reply from " + where_ + " (command_timeout=" +
                  ms_text(options_.command_timeout) + "); the command may or may not have run",
              true)));
          finished_.push_back(e.job);
        } else {
          next = std::min(next, e.job->deadline);
        }
      }
      s.min_deadline = next;
    }
    if (watchdog_.count() > 0 && !c.inflight().empty() && now - c.last_progress() >= watchdog_limit()) {
      connection_lost(static_cast<int>(i),
                      "no reply for " + ms_text(watchdog_limit()) + " with requests pending; closed by the watchdog",
                      requeue);
    }
  }
  // Retries whose backoff is over go first in line; past their deadline they complete
  // with the rejection itself.
  std::vector<std::shared_ptr<Job>> keep;
  for (auto& j : delayed_) {
    if (j->not_before <= now) {
      requeue.push_back(std::move(j));
    } else {
      keep.push_back(std::move(j));
    }
  }
  delayed_.swap(keep);
}

void Engine::set_interest(int i, std::uint32_t mask) {
  Slot& s = slots_[static_cast<std::size_t>(i)];
  const int fd = s.conn->fd();
  if (fd < 0) return;  // resolving its host: the resolver wakes us
  // A connect that fell back to the host's next address has a new socket (maybe with the
  // old number); closing the old one took it out of the epoll set.
  const bool same = s.in_epoll && s.epoch == s.conn->fd_epoch();
  if (same && s.mask == mask) return;
  epoll_event ev{};
  ev.events = mask;
  ev.data.u64 = kSlotTag + static_cast<std::uint64_t>(i);
  ::epoll_ctl(epoll_fd_, same ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
  s.in_epoll = true;
  s.epoch = s.conn->fd_epoch();
  s.mask = mask;
}

void Engine::arm(TimePoint at) {
  if (at == kNever || at >= armed_) return;
  armed_ = at;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(std::max<std::int64_t>(ns, 1) / 1'000'000'000);
  spec.it_value.tv_nsec = static_cast<long>(std::max<std::int64_t>(ns, 1) % 1'000'000'000);
  ::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void Engine::shutdown_reactor() {
  // Borrowers were woken by close(); wait until they have given their connections back.
  {
    std::unique_lock<std::mutex> lock(mu_);
    space_cv_.wait(lock, [this] {
      return std::none_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.owner == Owner::Caller; });
    });
    for (auto& j : handoff_) delayed_.push_back(std::move(j));
    handoff_.clear();
  }
  for (auto& s : slots_) {
    if (!s.conn) continue;
    for (auto& e : s.conn->inflight()) {
      if (!e.job || e.job->abandoned || e.job->finished) continue;
      e.job->fail(std::make_exception_ptr(StoreClosed(
          "the store for " + where_ + " was closed while the request was in flight; it may or may not have run",
          e.job->round_begin < s.conn->written())));
      finished_.push_back(e.job);
    }
    s.conn.reset();
  }
  for (auto& j : delayed_) {
    j->fail(std::make_exception_ptr(
        StoreClosed("the store for " + where_ + " was closed before a retry; parts of the batch may have run", true)));
    finished_.push_back(std::move(j));
  }
  delayed_.clear();
  std::vector<std::shared_ptr<Job>> done;
  done.swap(finished_);
  for (auto& j : done) j->deliver();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : slots_) {
    s.ready = false;
    s.owner = Owner::None;
  }
}

}  // namespace redcount::redis
