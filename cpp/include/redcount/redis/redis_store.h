// The Redis store: counters and limiters talk to Redis through this, via Store::execute
// (blocking) or Store::submit (asynchronous).
//
//   auto store = std::make_shared<RedisStore>(parse_url("redis://localhost:6379/0"));
//   auto replies = store->execute(batch);  // one round trip for the whole batch
//   store->submit(batch, [](std::vector<Reply>&& r, std::exception_ptr e) { ... });
//
// On a Redis Cluster (a redis+cluster:// URL) a router (redis/cluster.h) replaces the one
// engine: one engine per master, batches split per node and put back in order, MOVED and
// ASK followed; shard_of() is the key's hash slot, and nodes() gives a store per master.
// A client-side hash ring (StoreOptions::ring) takes the same router with a table computed
// from the members' names (redis/ring.h): shard_of() is the hash slot there too, and
// nodes() gives a store per member.
// Behind Redis Sentinel (a redis+sentinel:// URL) a MasterFollower (redis/master_follower.h)
// holds one engine on the master the sentinels name and moves to a new one on a failover.
//
// Underneath is one I/O engine (redis/engine.h: a reactor thread, `connections`
// multiplexed sockets, auto-pipelining, deadlines and the failure contract). This class
// adds what belongs to the store:
// - Connection-state commands are refused on the shared connections (SELECT, WATCH,
//   SUBSCRIBE, CLIENT REPLY, AUTH, HELLO, RESET, blocking pops...), with InvalidArgument
//   saying why; MULTI is accepted only with its EXEC or DISCARD in the same batch (a batch
//   is written contiguously, so a transaction cannot interleave with other callers).
// - Fork safety: a child process never touches the parent's engine, sockets or thread; it
//   opens its own engine at its first call, and the parent keeps working.
// - close() is idempotent and safe from any number of threads; later calls raise
//   StoreClosed (a ConnectionError that is not transient).
//
// Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "redcount/common/fork_hooks.h"
#include "redcount/common/options.h"
#include "redcount/store/store.h"

namespace redcount {

namespace redis {
class Engine;
class Cluster;
class MasterFollower;
struct ClusterStats;
}

class RedisStore final : public Store {
 public:
  explicit RedisStore(StoreOptions options);
  // A store over an engine someone else owns (a cluster's node): close() closes this
  // view only.
  RedisStore(StoreOptions options, std::shared_ptr<redis::Engine> engine);
  // The same over a Sentinel follower someone else owns (a ring member that is a Sentinel
  // group).
  RedisStore(StoreOptions options, std::shared_ptr<redis::MasterFollower> follower);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  std::vector<Reply> execute_owned(std::vector<Request>&& batch) override;
  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled = nullptr) override;
  std::int64_t now_ms() const override { return options_.clock ? options_.clock->now_ms() : SystemClock().now_ms(); }
  std::string describe() const override;
  bool is_memory() const noexcept override { return false; }
  // The RESP formatter renders ScriptCall::argv() itself.
  bool accepts_typed_args() const noexcept override { return true; }
  bool has_expire_options() const noexcept override;
  bool contended() const noexcept override;
  std::uint32_t shard_of(std::string_view key) const noexcept override;
  std::vector<std::shared_ptr<Store>> nodes() override;
  bool use_node_breakers(const ResilienceOptions& options, bool has_fallback) override;
  std::vector<NodeBreakerState> node_breakers() const override;
  void close() override;
  bool is_cluster() const noexcept { return options_.cluster; }
  bool is_sentinel() const noexcept { return options_.sentinel; }
  // Behind Sentinel: the master calls go to now ("host:port"; empty before the first call)
  // and how many times it changed.
  std::string sentinel_master() const;
  std::uint64_t sentinel_switches() const;
  // {failover holds begun, switches to a promoted replica before any sentinel announced it,
  // holds ended by Sentinel aborting the failover}.
  std::array<std::uint64_t, 3> sentinel_holds() const;
  // A cluster store's redirect counts (redis/cluster.h); all zero for a single server.
  redis::ClusterStats cluster_stats();
  bool is_ring() const noexcept { return !options_.ring.empty(); }
  // A cluster or a ring: batches go through the router.
  bool routed() const noexcept { return options_.cluster || !options_.ring.empty(); }
  // "host:port" ("[v6]:port"), the socket path for unix://, or the seed list of a cluster.
  std::string address() const;

  // Connections open right now (set up and usable).
  int open_connections() const;

  // Fork hooks (common/fork_hooks.h) only.
  void fork_prepare();
  void fork_parent();
  void fork_child();

 private:
  redis::Engine& engine();
  redis::Cluster& cluster();
  redis::MasterFollower& follower();
  [[noreturn]] void throw_closed() const;

  StoreOptions options_;
  std::atomic<bool> closed_{false};
  std::mutex mu_;  // creating or replacing the engine
  std::shared_ptr<redis::Engine> engine_;
  std::atomic<redis::Engine*> current_{nullptr};
  bool owns_engine_ = true;
  std::shared_ptr<redis::Cluster> cluster_;
  std::atomic<redis::Cluster*> cluster_current_{nullptr};
  // Breakers per node, once asked for (kept for a router opened again in a forked child).
  std::optional<ResilienceOptions> node_breakers_;
  bool node_breakers_fallback_ = false;
  std::shared_ptr<redis::MasterFollower> follower_;
  std::atomic<redis::MasterFollower*> follower_current_{nullptr};
  // Where an engine inherited through fork() is put: never destroyed, never used (its
  // thread does not exist in the child and its sockets belong to the parent).
  alignas(std::shared_ptr<redis::Engine>) unsigned char inherited_[sizeof(std::shared_ptr<redis::Engine>)];
  ForkHooks fork_hooks_;  // registered from construction to destruction
};

}  // namespace redcount
