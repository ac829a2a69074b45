// The store's side of Redis Sentinel: one engine on the master the sentinels name, replaced
// by a new engine when the master changes.
//
//   MasterFollower f(parse_url("redis+sentinel://s1:26379,s2:26379/cache"));
//   auto replies = f.execute(batch);   // the first call asks the sentinels (blocking)
//   f.submit(batch, done, nullptr);
//   f.close();
//
// Why an engine per master rather than an engine whose address changes: an engine's
// connections, queue, deadlines and failure contract are all about one server, and a
// switch must not mix the two. New calls go to the engine of the current master at once;
// the old engine keeps what it already has (requests written there are answered or fail
// with maybe_applied as anywhere else, and a READONLY or NOREPLICAS there is no longer
// retried on it: Engine::stop_retries) and is closed as soon as no call is inside it, so
// its connections close when idle.
//
// What moves the master:
// - a `+switch-master` for this service (SwitchMasterWatcher's thread);
// - a re-resolution asked for when a call meets READONLY or NOREPLICAS, a connection whose
//   handshake ROLE is not master, or a disconnect (ConnectionError): the watcher asks the
//   sentinels again (coalesced, at least 100 ms apart) and reports a changed address;
// - ROLE sent on the master every 5 s while calls flow (RoleRecheck), so a master demoted
//   without an event reaching this client is left within about that time.
// Every connection sends ROLE in its handshake and refuses to carry requests unless the
// server says master (the address came from a sentinel and may already be stale).
//
// The failover hold (SwitchMasterWatcher in sentinel.h): from the moment the sentinel running
// a failover names the replica it will promote until that replica answers ROLE as master
// (or the failover is aborted, or SwitchMasterWatcher::kMaxHold passes), new calls are not
// sent to the old master: a synchronous call waits, an asynchronous one is parked. Writes
// the old master would acknowledge then are the ones a failover loses. A call whose deadline
// passes while held fails with ConnectionError(maybe_applied=false): nothing of it was sent.
// Calls already inside the old master's engine complete there; the promotion comes at least
// one Sentinel timer tick (50-100 ms) after the hold begins, and a reply on loopback or a LAN
// reaches the replica well before that.
//
// A call that fails with ConnectionError(maybe_applied=false) (nothing of it ran: the old
// master refuses connections, or answers ROLE as a replica) waits for the master to change,
// up to the command timeout, and is then sent to the new master; past that, the caller gets
// the error. So does one whose every reply says READONLY, NOREPLICAS or MASTERDOWN (the
// engine retried it until the deadline) when a new master is known by then. Synchronous
// and asynchronous calls alike: an asynchronous call keeps a copy of its batch for this
// (a Sentinel store only), and one that waits for the new master is parked here, not on a
// thread; the switch sends it, or a timer thread fails it with its error at its deadline.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <thread>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "redcount/common/options.h"
#include "redcount/redis/io/pipeline.h"
#include "redcount/redis/topology/sentinel.h"
#include "redcount/redis/io/target.h"
#include "redcount/redis/io/timer.h"
#include "redcount/store/store.h"

namespace redcount::redis {

class Engine;

class MasterFollower final : public Target {
 public:
  // Validates the options (options.sentinel set, at least one sentinel, a service name);
  // connects to nothing yet.
  explicit MasterFollower(StoreOptions options);
  ~MasterFollower();
  MasterFollower(const MasterFollower&) = delete;
  MasterFollower& operator=(const MasterFollower&) = delete;

  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) override;
  // As a ring's member: the call keeps its own deadline (the member's command_timeout, as
  // the ring's batch has) and reports no partial replies (`answered` is left untouched).
  void submit_routed(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint deadline,
                     std::shared_ptr<std::vector<std::uint8_t>> answered) override;
  std::vector<Reply> execute_routed(const std::vector<Request>& batch, TimePoint deadline) override;
  // Idempotent; stops the watcher and closes every engine.
  void close() override;

  int open_connections() const override;
  bool contended() const noexcept override;
  // The server major version of the current master's connections (0 until known).
  int server_major() const noexcept override;
  FollowerStats follower_stats() const override;
  // "redis+sentinel://[user@]s1:p,s2:p/service/db".
  std::string describe() const override;
  // The current master's "host:port", or the sentinels' before the first call resolved it.
  std::string address() const override;
  // The master calls go to now (nullopt before the first call resolved it).
  std::optional<Address> master() const;
  // How many times the master changed since the first resolution.
  std::uint64_t switches() const noexcept { return switches_.load(std::memory_order_relaxed); }
  // How many failover holds began, and how many switches followed a promoted replica before
  // any sentinel announced it.
  std::uint64_t holds() const noexcept;
  std::uint64_t early_switches() const noexcept;
  // How many holds Sentinel's abort of the failover ended.
  std::uint64_t aborted_holds() const noexcept;

 private:
  // One master and its engine. `calls` counts calls inside the engine (a submitted batch
  // until its `done` ran); a retired generation is closed when it drops to 0.
  struct Generation {
    Address at;
    std::shared_ptr<Engine> engine;
    std::uint64_t number = 0;
    std::atomic<int> calls{0};
    std::atomic<bool> retired{false};
  };
  using GenPtr = std::shared_ptr<Generation>;

  // An asynchronous call while it may still be sent elsewhere: its batch (a copy: sent
  // again only when nothing of it ran), its caller, its deadline.
  struct AsyncCall {
    std::vector<Request> batch;
    BatchDone done;
    CancelFlag cancelled;
    TimePoint deadline;
  };
  using CallPtr = std::shared_ptr<AsyncCall>;
  // A call waiting for a master newer than generation `seen`; `error` is what its caller
  // gets if none comes before the deadline.
  struct Parked {
    CallPtr call;
    std::uint64_t seen = 0;
    std::exception_ptr error;
    bool held = false;  // parked by the failover hold: sent to the master followed when it ends
  };

  // The current generation, counted; a synchronous caller waits out a failover hold until
  // `deadline` (a call that never was sent: ConnectionError, maybe_applied false).
  GenPtr acquire(TimePoint deadline);
  void hold(bool on);  // the watcher's thread
  // Submits `call` to `g` (whose `calls` the caller has counted).
  void send(const GenPtr& g, const CallPtr& call);
  // After `g` answered `call`: true when the call was handed to a newer master (now, or
  // parked until one is known); false when the caller gets this outcome.
  bool follow(const GenPtr& g, const CallPtr& call, const std::vector<Reply>& replies, std::exception_ptr error);
  void park(Parked p);
  void park_locked(Parked p);  // with mu_ held: queues `p`, and its expiry on the timer
  void expire(const std::weak_ptr<AsyncCall>& call);  // the timer's thread: its deadline passed
  void release(const GenPtr& g);
  GenPtr make_generation(const Address& at, std::uint64_t number);
  void move_to(const Address& at);  // the watcher's thread
  // Looks at a call's outcome: asks for a re-resolution on what suggests a stale master.
  // Only the current generation's outcomes say something of the master followed.
  void observe(const GenPtr& g, const std::vector<Reply>& replies);
  void observe_error(const GenPtr& g, std::exception_ptr error);
  std::exception_ptr held_error() const;
  // Waits until the generation is newer than `seen` or `deadline`; the newer one, or null.
  GenPtr wait_newer(std::uint64_t seen, TimePoint deadline);
  GenPtr newer_than(std::uint64_t seen);
  void maybe_recheck_role(const GenPtr& g);
  TimePoint call_deadline() const;
  [[noreturn]] void throw_closed() const;

  const StoreOptions options_;
  std::shared_ptr<SentinelResolver> resolver_;
  std::unique_ptr<SwitchMasterWatcher> watcher_;  // created with the first generation

  mutable std::mutex mu_;
  std::condition_variable switched_cv_;
  GenPtr current_;
  std::vector<GenPtr> retired_;  // closed, kept until close() (a stale pointer stays valid)
  std::vector<Parked> parked_;   // asynchronous calls waiting for a new master
  bool closed_ = false;
  bool holding_ = false;  // a failover hold is on
  std::mutex resolve_mu_;  // one first resolution at a time
  std::atomic<std::uint64_t> switches_{0};
  std::atomic<std::int64_t> next_role_check_ns_{0};
  RoleRecheck recheck_interval_;
  // Parked calls' deadlines (its thread starts with the first parked call).
  Timer timer_;
};

}  // namespace redcount::redis
