// The Redis store: counters and limiters talk to Redis through this, via Store::execute
// (blocking) or Store::submit (asynchronous).
//
//   auto store = std::make_shared<RedisStore>(parse_url("redis://localhost:6379/0"));
//   auto replies = store->execute(batch);  // one round trip for the whole batch
//   store->submit(batch, [](std::vector<Reply>&& r, std::exception_ptr e) { ... });
//
// Calls go to one redis::Target (redis/io/target.h), opened from the URL by
// redis::open_target: one server's engine; a router over a Redis Cluster
// (redis+cluster://) or a client-side hash ring (StoreOptions::ring), where shard_of() is
// the key's hash slot and nodes() gives a store per master or member; or, behind Redis
// Sentinel (redis+sentinel://), a follower of the master the sentinels name. This class
// never asks which.
//
// Under every topology each server is one I/O engine (redis/io/engine.h: a reactor thread,
// `connections` multiplexed sockets, auto-pipelining, deadlines and the failure contract).
// This class adds what belongs to the store:
// - Connection-state commands are refused on the shared connections (SELECT, WATCH,
//   SUBSCRIBE, CLIENT REPLY, AUTH, HELLO, RESET, blocking pops...), with InvalidArgument
//   saying why; MULTI is accepted only with its EXEC or DISCARD in the same batch (a batch
//   is written contiguously, so a transaction cannot interleave with other callers).
// - Fork safety: a child process never touches the parent's target, sockets or threads; it
//   opens its own target at its first call, and the parent keeps working.
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
class Target;
struct ClusterStats;
}

class RedisStore final : public Store {
 public:
  explicit RedisStore(StoreOptions options);
  // A store over a target someone else owns (a cluster's master, a ring's member, which
  // may be a Sentinel group): close() closes this view only.
  RedisStore(StoreOptions options, std::shared_ptr<redis::Target> target);
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
  // A cluster store's redirect counts (redis/topology/cluster.h); all zero for any other.
  redis::ClusterStats cluster_stats();
  bool is_ring() const noexcept { return !options_.ring.empty(); }
  // "host:port" ("[v6]:port"), the socket path for unix://, the seed list of a cluster, a
  // ring's members, or a Sentinel group's current master.
  std::string address() const;

  // Connections open right now (set up and usable).
  int open_connections() const;

  // Fork hooks (common/fork_hooks.h) only.
  void fork_prepare();
  void fork_parent();
  void fork_child();

 private:
  // The target, opened again in a forked child at its first call.
  redis::Target& target();
  [[noreturn]] void throw_closed() const;

  StoreOptions options_;
  std::string describe_;  // the target's, fixed at construction
  std::string address_;   // the target's at construction (before a forked child's first call)
  std::atomic<bool> closed_{false};
  std::mutex mu_;  // creating or replacing the target
  std::shared_ptr<redis::Target> target_;
  std::atomic<redis::Target*> current_{nullptr};
  bool owns_target_ = true;
  // Breakers per node, once asked for (kept for a target opened again in a forked child).
  std::optional<ResilienceOptions> node_breakers_;
  bool node_breakers_fallback_ = false;
  // Where a target inherited through fork() is put: never destroyed, never used (its
  // threads do not exist in the child and its sockets belong to the parent).
  alignas(std::shared_ptr<redis::Target>) unsigned char inherited_[sizeof(std::shared_ptr<redis::Target>)];
  ForkHooks fork_hooks_;  // registered from construction to destruction
};

}  // namespace redcount
