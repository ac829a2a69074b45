// The embedded in-process store behind memory://.
//
// It keeps string keys with Redis semantics for the commands redcount uses (GET, SET
// with NX/XX/EX/PX/EXAT/PXAT/KEEPTTL, INCR, INCRBY, DECRBY, DEL, EXISTS, PTTL, TTL,
// PEXPIREAT, PEXPIRE, EXPIREAT, EXPIRE, PERSIST, KEYS, DBSIZE, FLUSHALL, FLUSHDB, PING,
// TIME) and runs scripts through their native twins under the same lock, so a script is
// as atomic here as it is on Redis.
//
// Expiry is real: a key past its deadline is invisible at once (lazy expiry) and a
// background sweep frees it, so memory does not grow with dead keys.
//
//   MemoryStore store;
//   store.execute_one(Command{{"SET", "k", "0", "NX", "PX", "1000"}});
//
// Thread-safe: one mutex guards the keyspace; no I/O happens under it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "redcount/options.h"
#include "redcount/store.h"

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
  void close() override;

  // Live keys plus expired keys not yet swept (for tests and stats).
  std::size_t stored_keys() const;
  // Frees every expired key now; returns how many were freed.
  std::size_t sweep();

 private:
  struct Entry {
    std::string value;
    std::int64_t expire_at = 0;  // ms since epoch; 0 = no TTL
  };
  class Ops;  // the Keyspace implementation, valid while the lock is held

  Reply run_command(Ops& ops, const std::vector<std::string>& args);
  void sweeper_loop();

  std::shared_ptr<Clock> clock_;
  std::chrono::milliseconds sweep_interval_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> data_;
  std::set<std::pair<std::int64_t, std::string>> expiry_;  // (expire_at, key)
  bool closed_ = false;

  std::mutex sweeper_mu_;
  std::condition_variable sweeper_cv_;
  bool stop_sweeper_ = false;
  std::thread sweeper_;
};

}  // namespace redcount
