// The embedded in-process store behind memory://.
//
// It keeps strings, sorted sets and hashes with Redis semantics for the commands
// redcount and its users need:
//   keys     DEL, UNLINK, EXISTS, TYPE, PTTL, TTL, PEXPIREAT, PEXPIRE, EXPIREAT, EXPIRE,
//            PERSIST, KEYS, DBSIZE, FLUSHALL, FLUSHDB
//   strings  GET, SET (NX/XX/EX/PX/EXAT/PXAT/KEEPTTL), INCR, DECR, INCRBY, DECRBY
//   zsets    ZADD (NX/XX/GT/LT/CH), ZREM, ZCARD, ZSCORE, ZCOUNT, ZRANGE (by rank,
//            WITHSCORES), ZRANGEBYSCORE (WITHSCORES, LIMIT), ZREMRANGEBYSCORE
//   hashes   HSET, HGET, HMGET, HGETALL, HDEL, HLEN, HEXISTS, HINCRBY
//   streams  XADD (NOMKSTREAM, MAXLEN [=|~] n [LIMIT c]; ids *, ms, ms-seq, ms-*), XLEN,
//            XRANGE, XREVRANGE (COUNT; '-', '+', '(' exclusive ends), XDEL, XTRIM (MAXLEN or
//            MINID, [=|~], LIMIT), XINFO STREAM (summary form) and XINFO GROUPS (with
//            entries-read and lag as Redis 7 computes them). MAXLEN ~ and MINID ~ trim
//            exactly here: Redis keeps at least as much (it trims whole nodes only).
//            Consumer groups: XGROUP CREATE (id or $, MKSTREAM, ENTRIESREAD) / SETID (id or
//            $, ENTRIESREAD) / DESTROY, XREADGROUP (COUNT, NOACK, '>' or a history id; BLOCK is
//            accepted and never waits: an empty read answers nil at once, as a BLOCK that
//            timed out does), XACK, XPENDING (summary and extended forms), XAUTOCLAIM
//            (COUNT, JUSTID), with Redis 7's reply shapes.
//   server   PING, TIME, WAIT (always 0: there are no replicas); MULTI ... EXEC within
//            one batch (a batch runs under the store's lock, so it is atomic anyway:
//            commands answer QUEUED and EXEC answers their replies; DISCARD drops them)
// A command on a key of the wrong type fails with Redis's WRONGTYPE error, and a sorted
// set or hash that loses its last member is deleted with its TTL. Scripts run through
// their native twins (see `Keyspace`, and `Script::typed` for calls that carry typed
// arguments) under the same lock, so a script is as atomic here
// as it is on Redis.
//
// Expiry is real: a key past its deadline is invisible at once (lazy expiry) and a
// background sweep frees it, so memory does not grow with dead keys.
//
//   MemoryStore store;
//   store.execute_one(Command{{"SET", "k", "0", "NX", "PX", "1000"}});
//   store.execute_one(Command{{"ZADD", "z", "1.5", "a"}});
//
// Layout: this class (cpp/src/memory_store.cpp: locking, expiry sweep, dispatch of a
// batch); its keyspace (cpp/src/memory/keyspace.h); its command interpreter
// (cpp/src/memory/commands.cpp); the scripts' native twins sit next to the strategies that
// send them (see all_scripts()).
//
// Thread-safe: one mutex guards the keyspace; no I/O happens under it. close() may be called
// from any number of threads at once. Fork-safe: a forked child gets a usable copy of the
// keyspace (and its own sweeper on its first call); the parent's store is unaffected.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "redcount/common/fork_hooks.h"
#include "redcount/common/options.h"
#include "redcount/store/store.h"

namespace redcount {

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(const StoreOptions& options = {});
  ~MemoryStore() override;
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  std::int64_t now_ms() const override { return clock_->now_ms(); }
  std::string describe() const override { return "memory://"; }
  bool is_memory() const noexcept override { return true; }
  // Script calls with typed arguments go to the script's typed twin, if it has one.
  bool accepts_typed_args() const noexcept override { return true; }
  bool server_clock_is_local() const noexcept override { return true; }
  void close() override;

  // Live keys plus expired keys not yet swept (for tests and stats).
  std::size_t stored_keys() const;
  // Frees every expired key now; returns how many were freed.
  std::size_t sweep();

 private:
  // Members ordered as Redis orders a sorted set: by score, then by member bytes. The
  // bare-score overloads let a range start at a score without naming a member.
  using ZItem = std::pair<double, std::string>;
  struct ZLess {
    using is_transparent = void;
    bool operator()(const ZItem& a, const ZItem& b) const { return a < b; }
    bool operator()(const ZItem& a, double score) const { return a.first < score; }
    bool operator()(double score, const ZItem& b) const { return score < b.first; }
  };
  // A sorted set as a sorted deque: a rate limiter's log appends at the back (its scores
  // are times) and trims from the front, both O(1) here, with no node per member. The
  // member -> score index is built the first time a command needs it (ZSCORE, ZREM, a
  // checked ZADD) and kept from then on; until then every member was added through
  // zadd_unique() by a twin whose members are unique by construction.
  struct ZSet {
    std::deque<ZItem> order;
    std::unordered_map<std::string, double> scores;  // valid only when `indexed`
    bool indexed = false;
    std::size_t size() const noexcept { return order.size(); }
  };
  // Fields kept in insertion order, the order a small Redis hash (listpack) answers
  // HGETALL in. `index` views the field names inside `fields`, whose nodes never move,
  // so a Hash can be moved but not copied.
  struct Hash {
    using Fields = std::list<std::pair<std::string, std::string>>;
    Fields fields;
    std::unordered_map<std::string_view, Fields::iterator> index;
    Hash() = default;
    Hash(Hash&&) = default;
    Hash& operator=(Hash&&) = default;
    Hash(const Hash&) = delete;
    Hash& operator=(const Hash&) = delete;
  };
  // A stream: entries in id order, and the last id ever given (ids never go back, even
  // after the entries are trimmed).
  struct StreamId {
    std::uint64_t ms = 0, seq = 0;
    auto operator<=>(const StreamId&) const = default;
  };
  struct Stream {
    struct Item {
      StreamId id;
      std::vector<std::pair<std::string, std::string>> fields;
    };
    // One consumer group: where `>` reads resume, and the pending entries list (delivered,
    // not yet acknowledged), each with its consumer, last delivery time (ms) and count.
    struct Pending {
      std::string consumer;
      std::int64_t delivered_at = 0;
      std::int64_t deliveries = 0;
    };
    struct Group {
      StreamId last_delivered;
      // Redis 7's logical read counter: how many entries the stream had added up to and
      // including last_delivered; -1 when unknown (a group created without ENTRIESREAD
      // before its first read).
      std::int64_t entries_read = -1;
      std::map<StreamId, Pending> pel;
      std::map<std::string, std::int64_t> consumers;  // name -> last seen (ms)
    };
    std::deque<Item> items;
    StreamId last;
    std::uint64_t added = 0;  // entries ever added (XINFO STREAM entries-added)
    StreamId max_deleted;     // the largest id XDEL removed (trimming does not count)
    std::map<std::string, Group> groups;
  };
  struct Entry {
    std::variant<std::string, ZSet, Hash, Stream> value;
    std::int64_t expire_at = 0;  // ms since epoch; 0 = no TTL
    // Where the key sits in expiry_ (0 = nowhere): at or before expire_at. A deadline that
    // moves later leaves the index alone; the sweep re-files the key when it gets there.
    std::int64_t indexed_at = 0;
  };
  class Ops;  // the Keyspace implementation, valid while the lock is held

  Reply run_request(Ops& ops, const Request& req);
  Reply run_command(Ops& ops, const std::vector<std::string>& args);
  // The Z* and H* commands; nullopt when `cmd` is none of them.
  std::optional<Reply> run_zset_command(Ops& ops, const std::string& cmd, const std::vector<std::string>& args);
  std::optional<Reply> run_hash_command(Ops& ops, const std::string& cmd, const std::vector<std::string>& args);
  std::optional<Reply> run_stream_command(Ops& ops, const std::string& cmd, const std::vector<std::string>& args);
  std::optional<Reply> run_stream_group_command(Ops& ops, const std::string& cmd,
                                                const std::vector<std::string>& args);
  void sweeper_loop();

  std::shared_ptr<Clock> clock_;
  std::chrono::milliseconds sweep_interval_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> data_;
  std::set<std::pair<std::int64_t, std::string>> expiry_;  // (indexed_at, key)
  bool closed_ = false;

  std::mutex close_mu_;  // one close() at a time: the sweeper is joined exactly once
  std::mutex sweeper_mu_;
  std::condition_variable sweeper_cv_;
  bool stop_sweeper_ = false;
  // Null when sweeping is off, and in a forked child until its first call restarts it (the
  // parent's sweeper thread does not exist there, so its handle is abandoned, never joined).
  std::unique_ptr<std::thread> sweeper_;
  std::atomic<bool> restart_sweeper_{false};
  void restart_sweeper_after_fork();

  // fork(): every live memory store's locks are taken before the fork and released in both
  // processes after it, so the child never inherits a lock held by a thread it does not have.
  friend class ForkHooks;
  void fork_prepare();
  void fork_parent();
  void fork_child();
  ForkHooks fork_hooks_;  // registered while the store is open to calls
};

}  // namespace redcount
