// What a RedisStore sends its calls to, whichever topology serves them: one server
// (Engine, io/engine.h), a Redis Cluster or a client-side hash ring (Cluster, topology/cluster.h), or
// the master a group of Sentinels names (MasterFollower, topology/master_follower.h). A router's
// members are Targets too, so a ring member that is a Sentinel group is routed as any
// other member is, and a store over one member is a RedisStore over its Target.
//
//   std::shared_ptr<redis::Target> t = redis::open_target(parse_url(url));  // redis/topology/open_target.h
//   std::vector<Reply> replies = t->execute(batch);
//   t->submit(batch, done, cancelled);
//   t->close();
//
// The store above a Target adds what does not depend on the topology (refused commands,
// fork safety, StoreClosed); a Target adds nothing of that.
//
// Every implementation is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/common/options.h"
#include "redcount/redis/io/pipeline.h"
#include "redcount/store/store.h"

namespace redcount::redis {

class Target;

// Redirect and rejection replies a cluster's router has met since the store opened (metrics,
// tests: how many TRYAGAIN a slot migration cost). Counted per request that carried one.
// All zero for any other target.
struct ClusterStats {
  std::uint64_t moved = 0;
  std::uint64_t ask = 0;
  std::uint64_t tryagain = 0;
  std::uint64_t clusterdown = 0;
  std::uint64_t refreshes = 0;  // CLUSTER SLOTS refreshes started
};

// What a Sentinel follower has done (all zero, `master` empty, for any other target).
struct FollowerStats {
  std::string master;  // "host:port" calls go to now; empty before the first call
  std::uint64_t switches = 0;        // times the master changed
  std::uint64_t holds = 0;           // failover holds begun
  std::uint64_t early_switches = 0;  // switches to a promoted replica before any sentinel announced it
  std::uint64_t aborted_holds = 0;   // holds ended by Sentinel aborting the failover
};

// One member of a router (a cluster's master, a ring's member): the options a store of
// its own is described by, and its target (shared with the router).
struct Member {
  StoreOptions options;
  std::shared_ptr<Target> target;
};

class Target {
 public:
  virtual ~Target() = default;

  // A batch under the store's deadline (command_timeout). `done` runs on an I/O or timer
  // thread of the target, or inline on an error found before anything was queued.
  virtual void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) = 0;
  virtual std::vector<Reply> execute(const std::vector<Request>& batch) = 0;
  // The same, taking the requests over (no copy where the target can avoid one).
  virtual std::vector<Reply> execute_owned(std::vector<Request>&& batch) { return execute(batch); }
  // As a router's member: under the router's `deadline`, with MOVED, ASK, TRYAGAIN and
  // CLUSTERDOWN coming back as replies. On a failure `done` also gets the replies received
  // so far, marked in `answered` (one entry per request), where the target can tell; one
  // that cannot (a Sentinel follower, which keeps its own deadline) leaves it untouched and
  // its error covers every unanswered request.
  virtual void submit_routed(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint deadline,
                             std::shared_ptr<std::vector<std::uint8_t>> answered) = 0;
  virtual std::vector<Reply> execute_routed(const std::vector<Request>& batch, TimePoint deadline) = 0;
  // Idempotent; from any thread, also from a done callback.
  virtual void close() = 0;

  // Connections open right now (set up and usable), over every server.
  virtual int open_connections() const = 0;
  // The lowest Redis major version its servers reported (0 until every one has).
  virtual int server_major() const noexcept = 0;
  // True while concurrent synchronous calls make separate round trips (engine.h).
  virtual bool contended() const noexcept = 0;
  // The shard a key belongs to: its hash slot under a router, 0 on one server.
  virtual std::uint32_t shard_of(std::string_view key) const noexcept {
    (void)key;
    return 0;
  }
  // The members keys are spread over, a ring's in the order given (empty: not a router).
  // A cluster learns its table first when none is known (blocking, up to command_timeout).
  virtual std::vector<Member> members() { return {}; }
  // Turns on a circuit breaker per member (false: not a router, nothing done).
  virtual bool use_node_breakers(const ResilienceOptions& options, bool has_fallback) {
    (void)options;
    (void)has_fallback;
    return false;
  }
  virtual std::vector<NodeBreakerState> node_breakers() const { return {}; }
  virtual ClusterStats cluster_stats() const noexcept { return {}; }
  virtual FollowerStats follower_stats() const { return {}; }

  // The URL it was opened with, never with a password: "redis://[user@]host:port/db",
  // "unix://path?db=N", "redis+cluster://seeds/db", "ring:name=url,...",
  // "redis+sentinel://sentinels/service/db".
  virtual std::string describe() const = 0;
  // Where calls go: "host:port" ("[v6]:port"), the socket path, a cluster's seeds, a ring's
  // members' addresses, a Sentinel group's current master (its sentinels before the first call).
  virtual std::string address() const = 0;
};

}  // namespace redcount::redis
