// The Redis store: a pool of hiredis connections with pipelining and EVALSHA.
//
//   auto store = std::make_shared<RedisStore>(parse_url("redis://localhost:6379/0"));
//   auto replies = store->execute(batch);  // one round trip for the whole batch
//
// - Connections are opened lazily, authenticated (AUTH [user] password), switched to the
//   URL's database (SELECT) and checked with PING in one round trip.
// - A connection that failed is dropped; the next call opens a new one. Failed connects
//   are retried with exponential backoff: inside the backoff window calls fail at once
//   with ConnectionError instead of piling up connect attempts on a dead server.
// - Scripts run by EVALSHA; a NOSCRIPT reply (SCRIPT FLUSH, restart, failover) loads the
//   script and runs the call again on the same connection.
//
// Thread-safe: each call leases a connection from the pool; no lock is held during I/O
// and no hiredis context is ever used by two threads at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "redcount/options.h"
#include "redcount/store.h"

struct redisContext;

namespace redcount {

class RedisStore final : public Store {
 public:
  explicit RedisStore(StoreOptions options);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  std::int64_t now_ms() const override { return options_.clock ? options_.clock->now_ms() : SystemClock().now_ms(); }
  std::string describe() const override;
  bool is_memory() const noexcept override { return false; }
  void close() override;

  // Connections currently open (idle or leased).
  int open_connections() const;

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const noexcept;
  };
  using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;
  struct Connection {
    ContextPtr ctx;
    std::chrono::steady_clock::time_point last_used;
  };
  class Lease;

  Lease acquire();
  std::vector<Reply> run_pipeline(Lease& lease, const std::vector<Request>& batch);
  std::unique_ptr<Connection> connect();
  void give_back(std::unique_ptr<Connection> conn, bool healthy);
  std::string where() const;

  StoreOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> idle_;
  int open_ = 0;
  bool closed_ = false;

  std::mutex backoff_mu_;
  std::chrono::steady_clock::time_point next_connect_{};
  std::chrono::milliseconds backoff_{0};
  std::string last_connect_error_;
};

}  // namespace redcount
