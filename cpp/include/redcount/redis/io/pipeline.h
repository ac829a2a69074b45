// Pipeline bookkeeping: a caller's batch (a Job) from submission to completion, and which
// reply on a connection belongs to which job. No I/O and no locks here; the engine and a
// synchronous caller that borrowed a connection drive the same steps:
//
//   auto job = std::make_shared<Job>(...);                // requests, done, deadline
//   start_round(job, conn.out(), conn.inflight(), ...);   // bytes to write, replies to expect
//   ... for each reply: if (take_reply(conn.inflight(), reply)) the round is over:
//   switch (after_round(*job, now, options)) { Complete, Again (NOSCRIPT reload now), Later }
//
// A job is written contiguously: its requests (and, on NOSCRIPT, the SCRIPT LOADs with the
// rerun) are appended to one connection's output together, so nothing interleaves.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "redcount/store/reply.h"
#include "redcount/store/store.h"

namespace redcount::redis {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;
inline constexpr TimePoint kNever = TimePoint::max();

struct Job {
  std::vector<Request> requests;
  BatchDone done;
  CancelFlag cancelled;
  TimePoint deadline = kNever;
  std::string wire;  // the first round, formatted by the submitting thread

  std::vector<Reply> replies;
  std::vector<std::uint32_t> todo;   // requests of the current round (all in the first)
  std::vector<const Script*> loads;  // SCRIPT LOADs written just before the round
  std::size_t outstanding = 0;       // replies the current round still waits for
  std::uint64_t round_begin = 0;     // stream offset of the round on its connection
  std::string load_error;            // a SCRIPT LOAD of this round failed
  bool multi = false;                // holds MULTI: retried only as a whole
  // Sent by the cluster router: redirects and the cluster's own "did not run" replies
  // (TRYAGAIN, CLUSTERDOWN) come back as replies, for the router to re-route; on a
  // failure the replies received so far come with the error, and `answered` says which.
  bool routed = false;
  std::shared_ptr<std::vector<std::uint8_t>> answered;
  bool abandoned = false;            // completed early (deadline...): take_reply drops late replies
  bool finished = false;
  int noscript_rounds = 0;
  std::chrono::milliseconds backoff{0};
  TimePoint not_before{};

  // Outcome, delivered by deliver() once the engine's state is consistent again.
  std::exception_ptr error;

  bool is_cancelled() const noexcept { return cancelled && cancelled->load(std::memory_order_relaxed); }
  void succeed() { finished = true; }
  void fail(std::exception_ptr e) {
    finished = true;
    error = std::move(e);
  }
  // Calls done exactly once with the outcome.
  void deliver() noexcept;
};

// One reply a connection waits for, in FIFO order.
struct Expect {
  std::shared_ptr<Job> job;  // null: a reply nobody waits for any more
  std::int32_t slot;         // >= 0: index into job->replies; < 0: SCRIPT LOAD -(slot + 1) of the round
};

// Builds a job for `batch`. With `format`, the first round is formatted now (on the
// submitting thread, so the reactor only copies bytes); otherwise start_round formats it.
std::shared_ptr<Job> make_job(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint deadline,
                              bool format = true);
// Formats the first round into job.wire now (before handing the job to the reactor).
void format_wire(Job& job);

// Appends the job's current round to `out` and its expected replies to `inflight`.
void start_round(const std::shared_ptr<Job>& job, std::string& out, std::deque<Expect>& inflight,
                 std::uint64_t stream_offset);

// Consumes the front expectation with `reply`. Returns the job whose round is now over
// (null when the round continues or the reply belonged to nobody).
std::shared_ptr<Job> take_reply(std::deque<Expect>& inflight, Reply&& reply, std::string_view where);

enum class Next { Complete, Again, Later };
// Decides what follows a finished round: Complete (job->finished is set), Again (a
// NOSCRIPT reload and rerun, to write now on the same connection), Later (a rejection that
// means "did not run", retried at job->not_before).
Next after_round(Job& job, TimePoint now, std::chrono::milliseconds backoff_min,
                 std::chrono::milliseconds backoff_max);

// True for an error reply that proves the request did not run and may be sent again on
// the same connection. For a routed job (`routed`), TRYAGAIN and CLUSTERDOWN are left to
// the cluster router, which re-routes them.
bool did_not_run(const Reply& reply, const Request& request, bool routed = false) noexcept;

}  // namespace redcount::redis
