// The I/O engine under RedisStore: one reactor thread per store, a few multiplexed
// connections, auto-pipelining, per-request deadlines and the failure contract below.
//
//   auto engine = std::make_shared<redis::Engine>(options);
//   engine->submit(batch, [](std::vector<Reply>&& replies, std::exception_ptr error) { ... });
//   std::vector<Reply> replies = engine->execute(batch);   // synchronous
//   engine->close();
//
// Why epoll + eventfd + timerfd and not Asio: no extra dependency for a wheel, and the
// engine needs exact control of each write (everything queued since the last wake-up goes
// out in one syscall: auto-pipelining) and of TLS's want-read/want-write, which an
// asynchronous framework hides behind its own buffering.
//
// How it works. Callers on any thread submit a batch (a Job); it is formatted on the
// caller's thread, queued, and the reactor is woken through an eventfd (once per batch of
// submissions). On each wake-up the reactor moves every queued job to the least loaded of
// the store's `connections` sockets, appends its bytes to that socket's output and writes
// each output in one syscall; a job's requests are contiguous on the wire. Replies complete
// jobs in FIFO order per connection; `done` runs on the reactor thread. A timerfd carries
// every deadline, the watchdog and the set-up timeouts.
// A synchronous caller that finds a connection idle (nothing queued or in flight) borrows
// it and does its own write and read, with no thread hop: the single-thread path costs what
// a plain blocking client costs. While borrowed, the reactor does not touch it (the idle
// connection is registered for EPOLLRDHUP only, one-shot, so the caller's reply does not
// wake the reactor). When every connection is busy, the caller's job goes through the
// reactor and the caller asks it to open a thread connection: one more socket, never given
// queued work, that later synchronous callers borrow the same way. So N threads calling at
// once end up with about N sockets (at most max_connections in all), each waiting for its
// own reply: a reactor hop and a wake-up per call cost more than that on a busy machine
// (measured with 8 threads: about 2x one thread through the reactor alone).
//
// The failure contract (request by request):
// - A request not yet written when its connection dies is sent again on a new connection
//   (it cannot have run). If no connection can be opened, it fails at once with
//   ConnectionError, maybe_applied = false; so does every call while the reconnect backoff
//   lasts (refused connections and failed authentication alike, exponential with jitter).
// - A reply meaning "did not run" (LOADING, READONLY, MASTERDOWN, NOREPLICAS, TRYAGAIN, CLUSTERDOWN, and
//   NOSCRIPT for a script call) is retried within the request's deadline, after a short
//   backoff (NOSCRIPT: SCRIPT LOAD and the rerun at once, written together). A transaction
//   (MULTI) is retried only when none of it ran. Past the deadline the caller gets the reply.
// - A request written but unanswered when its connection dies fails with ConnectionError,
//   maybe_applied = true. Nothing written is ever resent: a script or an INCRBY may have run,
//   and sending it again would count it twice (request ids make a caller's retry safe).
// - A request unanswered at its deadline (command_timeout) fails alone with TimeoutError
//   (maybe_applied = true, "may or may not have run"). The deadline is spent on waiting for
//   the server only: the wait for a request's reply lasts at least command_timeout from the
//   moment it was written (time the caller or the I/O thread spent before the write, on its
//   own work or not scheduled at all, is not the server's), a job that can be written when
//   the I/O thread gets to it is written rather than failed, and the socket is read once
//   more before a timeout is declared, so a reply that arrived while the process was not
//   running is used. A timed-out request stays in flight, its late reply is
//   discarded, and the connection stays in step. A connection that has answered nothing for
//   twice the command timeout (at least 2 s) while requests are pending is closed by the
//   watchdog, and its pending requests fail as above.
// - Backpressure: at most kMaxQueued requests wait to be written and kMaxInFlight await
//   replies per connection; beyond that a caller waits up to pool_timeout, then gets
//   TimeoutError.
// - close(): queued requests fail with StoreClosed (not transient, nothing sent); requests in
//   flight fail with StoreClosed, maybe_applied = true.
//
// Blocking commands (Command::blocks_for, Quota's WAIT) never go on these connections: a
// server holds a blocked client's later replies, so every caller multiplexed behind a WAIT
// would wait for it. A batch holding one goes, whole, to a second engine on the same server
// (same handshake, TLS and authentication), created at the first such batch and used for
// nothing else: the write before a WAIT is on the same connection, which is what WAIT
// counts. Its deadline is command_timeout plus the batch's blocking time, and its watchdog
// allows for that time. Blocking batches share that engine's sockets among themselves (up
// to 4 multiplexed, and thread connections for synchronous callers up to max_connections).
//
// Thread-safe. `done` callbacks run on the reactor thread (or on the submitting thread when
// the outcome is known at once); they must be quick and must not call execute() (submit()
// is fine). Not fork-safe by itself: RedisStore abandons an engine inherited through fork().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "redcount/common/options.h"
#include "redcount/redis/io/connection.h"
#include "redcount/redis/io/pipeline.h"
#include "redcount/redis/io/target.h"
#include "redcount/store/store.h"

namespace redcount::redis {

class Engine final : public Target, public std::enable_shared_from_this<Engine> {
 public:
  static constexpr std::size_t kMaxQueued = 1u << 16;    // requests waiting to be written
  static constexpr std::size_t kMaxInFlight = 1u << 14;  // replies awaited per connection

  // Validates the options (connections 1..4, timeouts >= 0); starts nothing yet.
  // `for_blocking`: the engine of another engine's blocking batches (see above).
  explicit Engine(const StoreOptions& options, bool for_blocking = false);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) override;
  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  std::vector<Reply> execute(std::vector<Request>&& batch);  // takes the requests over
  std::vector<Reply> execute_owned(std::vector<Request>&& batch) override { return execute(std::move(batch)); }
  // For the cluster router: the batch's deadline is the router's; MOVED, ASK, TRYAGAIN
  // and CLUSTERDOWN come back as replies (Job::routed); on a failure `done` also gets the
  // replies received so far, marked in `answered` (one entry per request).
  void submit_routed(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint deadline,
                     std::shared_ptr<std::vector<std::uint8_t>> answered) override;
  // The synchronous fast path of a routed batch (a borrowed idle connection when there is one).
  std::vector<Reply> execute_routed(const std::vector<Request>& batch, TimePoint deadline) override;
  // From now on a "did not run" reply (READONLY, NOREPLICAS...) completes its request with
  // that reply instead of being retried here: for a server that is no longer the one to
  // use (a Sentinel master that was replaced), where the caller resends elsewhere. Any thread.
  void stop_retries() noexcept;
  // Idempotent; from any thread, also from a done callback.
  void close() override;
  bool closed() const;
  // Connections open right now (set-up finished).
  int open_connections() const override;
  const std::string& where() const noexcept { return where_; }
  // The major version the last connection set up reported (0 until one is, or when INFO
  // is refused).
  int server_major() const noexcept override { return server_major_.load(std::memory_order_relaxed); }
  // True while a synchronous call is in execute() on another thread and this engine may
  // open thread connections (max_connections above connections): concurrent synchronous
  // calls then make separate round trips, each on a socket of its own, rather than share
  // pipelined writes.
  bool sync_contended() const noexcept {
    return thread_slots_ && sync_callers_.load(std::memory_order_relaxed) > 0;
  }
  bool contended() const noexcept override { return sync_contended(); }
  std::string describe() const override;
  std::string address() const override;

 private:
  enum class Owner { None, Reactor, Caller };
  struct Slot {
    std::unique_ptr<Connection> conn;  // no lock: used only by the slot's owner (reactor or borrower)
    // Under mu_:
    Owner owner = Owner::None;
    bool ready = false;
    bool hup = false;        // an event came while a caller had it
    bool adopt = false;      // a caller handed it back with work for the reactor
    bool wanted = false;     // a thread connection a caller asked the reactor to open
    std::size_t load = 0;    // replies awaited
    // Reactor only:
    bool in_epoll = false;
    std::uint32_t mask = 0;  // registered events; 0 after a one-shot fired
    std::uint64_t epoch = 0;  // the connection's fd_epoch() when it was registered
    std::uint32_t events = 0;
    TimePoint min_deadline = kNever;
  };
  enum class FailureKind { Connection, Timeout, Auth, Reply };

  std::vector<Reply> execute_job(std::vector<Request> batch, TimePoint deadline, bool routed);
  // The engine for batches with a blocking command, created at the first (StoreClosed
  // once this one is closed).
  std::shared_ptr<Engine> blocking_engine();
  // This engine's deadline for a batch that blocks the server for `block` at most.
  TimePoint deadline_for(std::chrono::milliseconds block);
  // The watchdog's limit: no reply for this long with requests pending closes a connection.
  std::chrono::milliseconds watchdog_limit() const noexcept {
    return watchdog_ + std::chrono::milliseconds(block_slack_ms_.load(std::memory_order_relaxed));
  }
  void start_locked();
  void wake();
  void enqueue(std::shared_ptr<Job> job, bool may_wait);
  int try_borrow();
  // Multiplexed slots are [0, mux_); the rest are thread connections, opened on demand
  // for synchronous callers that find every connection busy (up to max_connections in all).
  bool is_mux(std::size_t i) const noexcept { return i < mux_; }
  bool run_borrowed(int slot, const std::shared_ptr<Job>& job);
  void give_back(int slot, bool to_reactor);
  std::exception_ptr backoff_error_locked(TimePoint now) const;

  void run();
  bool step(bool tick);
  void handle_slot(int i, TimePoint now, std::vector<std::shared_ptr<Job>>& requeue);
  void round_over(int i, const std::shared_ptr<Job>& job, TimePoint now);
  void connection_lost(int i, const std::string& why, std::vector<std::shared_ptr<Job>>& requeue);
  void connect_failed(int i, std::exception_ptr error, TimePoint now);
  void open_slot(int i, TimePoint now);
  void expire(TimePoint now, const std::vector<char>& ours, std::vector<std::shared_ptr<Job>>& requeue);
  void set_interest(int i, std::uint32_t mask);
  void arm(TimePoint at);
  void shutdown_reactor();

  const StoreOptions options_;
  const std::string where_;
  const std::chrono::milliseconds watchdog_;
  const std::size_t mux_;
  const bool for_blocking_;
  std::shared_ptr<TlsContext> tls_;
  // The longest blocking time of a batch sent here so far (for_blocking_ only): the
  // watchdog gives a connection that much longer to answer.
  std::atomic<std::int64_t> block_slack_ms_{0};

  std::atomic<int> sync_callers_{0};  // threads in execute()
  // A lone synchronous caller's poll before it sleeps on its reply (StoreOptions::spin,
  // resolved), and a moving average of how long its replies took (us), which turns the
  // poll off while replies take longer than twice it.
  std::chrono::microseconds spin_{0};
  std::atomic<std::int64_t> reply_us_{0};
  std::atomic<bool> no_retries_{false};  // stop_retries()
  bool thread_slots_ = false;          // max_connections leaves room for thread connections

  mutable std::mutex mu_;
  std::condition_variable space_cv_;   // queue space, borrowers gone, close finished
  std::vector<Slot> slots_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::size_t queued_requests_ = 0;
  std::shared_ptr<Engine> blocking_;  // blocking_engine(), once asked for
  std::vector<std::shared_ptr<Job>> handoff_;  // from borrowers: retry later
  bool started_ = false;
  bool closed_ = false;
  bool close_done_ = false;
  bool wake_pending_ = false;
  int connecting_ = 0;
  std::chrono::milliseconds backoff_{0};
  TimePoint next_connect_{};
  // Thread connections' own backoff after a failed connect (it never holds back the
  // multiplexed connections or refuses calls).
  std::chrono::milliseconds thread_backoff_{0};
  TimePoint next_thread_connect_{};
  FailureKind failure_kind_ = FailureKind::Connection;
  std::string failure_;
  std::atomic<int> server_major_{0};

  // Wakes the reactor when a host name resolved on a resolver thread; such a thread may
  // outlive the engine, so it holds this and never touches a closed eventfd.
  struct ResolvedSignal {
    std::mutex mu;
    int fd = -1;
    std::atomic<bool> pending{false};
    void notify();
  };
  std::shared_ptr<ResolvedSignal> resolved_ = std::make_shared<ResolvedSignal>();

  int epoll_fd_ = -1;
  int event_fd_ = -1;
  int timer_fd_ = -1;
  std::thread thread_;
  std::shared_ptr<Engine> keepalive_;  // set when closed from its own thread

  // Reactor only.
  std::vector<char> ours_;  // slots the reactor owns in the current step
  std::vector<std::shared_ptr<Job>> delayed_;
  std::vector<std::shared_ptr<Job>> finished_;
  TimePoint armed_ = kNever;
};

}  // namespace redcount::redis
