// The Redis store: counters and limiters talk to Redis through this, via Store::execute
// (blocking) or Store::submit (asynchronous).
//
//   auto store = std::make_shared<RedisStore>(parse_url("redis://localhost:6379/0"));
//   auto replies = store->execute(batch);  // one round trip for the whole batch
//   store->submit(batch, [](std::vector<Reply>&& r, std::exception_ptr e) { ... });
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

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "redcount/common/options.h"
#include "redcount/store/store.h"

namespace redcount {

namespace redis {
class Engine;
}

class RedisStore final : public Store {
 public:
  explicit RedisStore(StoreOptions options);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  std::vector<Reply> execute(const std::vector<Request>& batch) override;
  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled = nullptr) override;
  std::int64_t now_ms() const override { return options_.clock ? options_.clock->now_ms() : SystemClock().now_ms(); }
  std::string describe() const override;
  bool is_memory() const noexcept override { return false; }
  // The RESP formatter renders ScriptCall::argv() itself.
  bool accepts_typed_args() const noexcept override { return true; }
  bool has_expire_options() const noexcept override;
  bool contended() const noexcept override;
  void close() override;

  // Connections open right now (set up and usable).
  int open_connections() const;

  // Used by the fork handlers only.
  void before_fork();
  void after_fork_in_parent();
  void after_fork_in_child();

 private:
  redis::Engine& engine();
  [[noreturn]] void throw_closed() const;

  StoreOptions options_;
  std::atomic<bool> closed_{false};
  std::mutex mu_;  // creating or replacing the engine
  std::shared_ptr<redis::Engine> engine_;
  std::atomic<redis::Engine*> current_{nullptr};
  // Where an engine inherited through fork() is put: never destroyed, never used (its
  // thread does not exist in the child and its sockets belong to the parent).
  alignas(std::shared_ptr<redis::Engine>) unsigned char inherited_[sizeof(std::shared_ptr<redis::Engine>)];
};

}  // namespace redcount
