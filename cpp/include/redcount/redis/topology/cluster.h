// Redis Cluster routing under RedisStore: the slot table, one engine per master, and the
// split of a batch into one child job per node with its replies put back in order.
//
//   auto cluster = std::make_shared<redis::Cluster>(parse_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000"));
//   std::vector<Reply> replies = cluster->execute(batch);   // or submit(batch, done, cancelled)
//
// The slot table comes from CLUSTER SLOTS (not CLUSTER SHARDS: Redis 7.0 misreports a
// failed master there), asked of a random known node at start, after a MOVED, after a
// node's connection failed, on CLUSTERDOWN or a slot nobody serves, and every 10 s; at
// most one refresh is in flight and at most one starts per 100 ms (jittered). Only
// masters are used: a read from a replica may be stale, which a limiter cannot afford.
//
// A batch is cut into units (command_keys.h): a keyed request, or a transaction, with the
// keyless requests attached to it. The units of one node form one child job for that
// node's engine (redis/io/engine.h), written contiguously on one of its connections; the
// batch completes when every child has. Each node's engine keeps the single-server
// failure contract; on top of it:
// - MOVED: the slot is patched, a refresh is asked for (coalesced), and the unit is sent
//   to the new owner at once; at most 5 MOVED per unit, then the caller gets the reply.
// - ASK: the unit goes to the target with ASKING written just before its keyed request
//   (before MULTI for a transaction), in the same write.
// - TRYAGAIN (a slot migrating), CLUSTERDOWN: backoff 5 ms doubling to 200 ms, then the
//   unit is routed again from the table (CLUSTERDOWN also refreshes it). ASK and TRYAGAIN
//   loops are bounded by the batch's deadline (command_timeout), not by a count: past it
//   the caller gets the rejection itself.
// - A node's connection refused or lost before its child was written: refresh, then the
//   unsent units go to the slot's owner after a backoff, within the deadline.
// - While a batch waits for a backoff because of a node failure, CLUSTERDOWN or a slot
//   nobody serves, the table is refreshed again every 100 ms (jittered); a refresh that
//   changes the table sends every waiting batch again at once (a promoted replica is
//   written as soon as the table names it, not at the end of a backoff of up to 200 ms).
//   Those refreshes ask a replica of the failed master (CLUSTER SLOTS lists them): it
//   knows of its own promotion first (the other masters learn of it from the bus, tens of
//   ms later), and the connection that asked is ready for the writes once it is promoted.
// - A node's connection lost after its child was written: nothing written is resent; the
//   other nodes' children complete; the batch fails with ConnectionError(maybe_applied =
//   true) carrying one RequestOutcome per request (reply, Maybe or NotSent).
//
// A client-side hash ring (StoreOptions::ring) is routed by the same code with a static
// table: each slot goes to a member by rendezvous hashing over the members' names
// (redis/topology/ring.h). It never asks CLUSTER SLOTS and never changes its table: a member that
// is down is not replaced (its slots fail; nothing is re-hashed onto the others). A member
// may be a Sentinel group (redis+sentinel://): its slots go to a MasterFollower
// (redis/topology/master_follower.h), which follows that group's master through failovers, so a
// ring of Sentinel groups scales out and fails over.
//
// Breakers per node (use_node_breakers, turned on by a ResilientStore in front): each node
// has a circuit breaker (store/breaker.h) fed by its children's connection failures; while
// a node's is open, the units routed to it are not sent (they end NotSent, the batch with
// Unavailable or outcomes) and one PING probes the node in the background after a pause.
//
// Thread-safe. `done` runs on some node engine's thread or the router's timer thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "redcount/common/address.h"
#include "redcount/common/options.h"
#include "redcount/redis/topology/command_keys.h"
#include "redcount/redis/io/pipeline.h"
#include "redcount/redis/io/target.h"
#include "redcount/redis/io/timer.h"
#include "redcount/store/breaker.h"
#include "redcount/store/store.h"

namespace redcount::redis {

// host:port of a node: common/address.h.
using redcount::Address;

// The address a ring member is known by: its server's, or for a Sentinel group
// "service@host:port" of its first sentinel (the group has no fixed server address).
Address ring_member_address(const StoreOptions& member);

struct SlotRange {
  std::uint32_t first = 0;
  std::uint32_t last = 0;
  Address master;
  std::vector<Address> replicas;  // never written to; asked for the table when the master fails
};

// The masters (and their replicas) of a CLUSTER SLOTS reply. An empty host in it means "the node you asked"
// (`asked`). Throws ProtocolError on a reply of another shape.
std::vector<SlotRange> parse_cluster_slots(const Reply& reply, const std::string& asked);

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"; nullopt for any other reply.
struct Redirect {
  bool ask = false;
  std::uint32_t slot = 0;
  Address to;
};
std::optional<Redirect> parse_redirect(const Reply& reply);

// One node's child of a routed batch: the requests to write (ASKING included) and, per
// request, the index of the batch request whose reply it is (-1: an ASKING).
struct Child {
  std::vector<Request> requests;
  std::vector<std::int32_t> origin;
  std::vector<std::uint32_t> units;  // indices into the batch's units
};
// Builds the child for `units` (in order); `asking[u]` puts an ASKING before unit u's
// ask_at request.
Child build_child(const std::vector<Request>& batch, const std::vector<Unit>& all_units,
                  const std::vector<std::uint32_t>& units, const std::vector<char>& asking);

class Cluster final : public Target, public std::enable_shared_from_this<Cluster> {
 public:
  static constexpr int kMaxMoved = 5;
  static constexpr std::chrono::milliseconds kRefreshEvery{10'000};
  static constexpr std::chrono::milliseconds kRefreshGap{100};

  // Validates the options; a ring computes its table now. A cluster learns its table from a seed (failures there are kept
  // and retried at the first call, so opening a store never needs the cluster up).
  explicit Cluster(const StoreOptions& options);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) override;
  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  // A router is never a router's member: these are submit() and execute(), under the
  // store's own deadline.
  void submit_routed(std::vector<Request> batch, BatchDone done, CancelFlag cancelled, TimePoint deadline,
                     std::shared_ptr<std::vector<std::uint8_t>> answered) override;
  std::vector<Reply> execute_routed(const std::vector<Request>& batch, TimePoint deadline) override;
  void close() override;

  // The slot's master right now (nullopt: not served).
  std::optional<Address> master_of(std::uint32_t slot) const;
  // Every master (a ring's members in the order given), with its target.
  std::vector<Member> masters();
  // masters(), after learning the table when none is known yet (Store::nodes()).
  std::vector<Member> members() override;
  // True when every master's connection reported Redis >= `major`.
  bool masters_at_least(int major) const;
  // The lowest major version of the masters (0 until each reported one).
  int server_major() const noexcept override;
  bool contended() const noexcept override;
  int open_connections() const override;
  // The key's hash slot (a ring's table is indexed by slots too).
  std::uint32_t shard_of(std::string_view key) const noexcept override;
  std::string describe() const override;
  std::string address() const override;
  // CLUSTER SLOTS refreshes started so far (tests, metrics).
  std::uint64_t refreshes() const noexcept { return refreshes_.load(std::memory_order_relaxed); }
  ClusterStats stats() const noexcept;
  // stats() for a cluster; all zero for a ring (no server of which redirects).
  ClusterStats cluster_stats() const noexcept override;
  bool is_ring() const noexcept { return ring_; }
  // A ring's member names, in the order given (empty on a cluster).
  const std::vector<std::string>& ring_names() const noexcept { return ring_names_; }
  // Turns on a circuit breaker per node (for every node, also those learned later).
  bool use_node_breakers(const ResilienceOptions& options, bool has_fallback) override;
  std::vector<NodeBreakerState> node_breakers() const override;
  // Asks for a refresh now (coalesced and rate-limited like every other).
  void request_refresh();
  // Blocks until a refresh has succeeded since the call (asking other nodes after a failed
  // one), or `timeout`; true when the table is known (the first call, tests).
  bool refresh_now(std::chrono::milliseconds timeout);

 private:
  struct Batch;
  struct Node {
    Address address;
    std::shared_ptr<Target> target;    // a server's engine, or a Sentinel ring member's follower
    StoreOptions options;              // what a store over this node alone is opened with
    std::string name;                  // a ring member's name; empty on a cluster
    std::shared_ptr<Breaker> breaker;  // with breakers per node
    std::string where;                 // a Sentinel ring member's URL, for messages
  };
  std::shared_ptr<Breaker> make_breaker_locked(const Node& n) const;
  // The breaker of the node at `address` (null without breakers).
  std::shared_ptr<Breaker> breaker_of(const Address& address) const;
  void probe(const std::shared_ptr<Node>& node);

  std::shared_ptr<Node> node_locked(const Address& address);
  void dispatch(const std::shared_ptr<Batch>& batch);
  void absorb(const std::shared_ptr<Batch>& batch, const Child& child, const Address& node,
              std::vector<Reply>&& replies, const std::vector<std::uint8_t>* answered, std::exception_ptr error);
  void finish_round(const std::shared_ptr<Batch>& batch);
  // Ends the backoff the batch waits for when it is still `ticket`'s (true: dispatch it).
  bool unpark(const std::shared_ptr<Batch>& batch, std::uint64_t ticket);
  // Sends every batch waiting for a backoff again now (the table changed).
  void wake_parked(std::vector<std::weak_ptr<Batch>> parked);
  void complete(const std::shared_ptr<Batch>& batch);
  void install(const std::vector<SlotRange>& ranges);
  void patch(std::uint32_t slot, const Address& to);
  void start_refresh();
  void refresh_done(bool ok);
  void periodic();

  StoreOptions options_;
  std::vector<Address> seeds_;
  std::string describe_, address_;  // fixed at construction

  mutable std::mutex mu_;  // the table, the nodes, refresh state
  std::vector<std::int32_t> slots_;  // slot -> index into masters_, -1 = not served
  std::vector<std::shared_ptr<Node>> masters_;
  std::unordered_map<std::string, std::shared_ptr<Node>> nodes_;  // every node seen, by address
  bool refreshing_ = false;
  bool refresh_wanted_ = false;      // asked for while one ran or within the gap
  bool refresh_scheduled_ = false;
  TimePoint last_refresh_{};
  std::uint64_t refresh_generation_ = 0;  // completed refreshes
  std::uint64_t refresh_successes_ = 0;
  std::string last_refresh_error_;  // why the last failed refresh failed
  std::condition_variable refresh_cv_;
  std::atomic<std::uint64_t> refreshes_{0};
  std::atomic<std::uint64_t> moved_{0}, ask_{0}, tryagain_{0}, clusterdown_{0};
  // Batches waiting for a backoff (woken when the table changes), and how many of them wait
  // for the topology to change (the table is refreshed every gap while any does).
  struct Parked {
    std::weak_ptr<Batch> batch;
    bool topology = false;
  };
  std::unordered_map<const Batch*, Parked> parked_;
  std::size_t topology_parked_ = 0;
  std::uint64_t park_tickets_ = 0;
  // Masters whose connection failed (until they serve again or leave the table), the
  // replicas of each master (from CLUSTER SLOTS), and the node whose refresh failed last.
  std::unordered_map<std::string, Address> failed_;
  std::unordered_map<std::string, std::vector<Address>> replicas_;
  std::string refresh_failed_at_;
  bool closed_ = false;

  bool periodic_started_ = false;

  bool ring_ = false;
  std::vector<std::string> ring_names_;
  std::atomic<bool> breakers_on_{false};
  ResilienceOptions breaker_options_;  // under mu_
  bool breaker_fallback_ = false;      // under mu_

  // Backoffs, rate-limited refreshes and the periodic refresh run on the timer's thread.
  Timer timer_;
};

}  // namespace redcount::redis
