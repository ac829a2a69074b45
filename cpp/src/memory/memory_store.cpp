#include "redcount/memory/memory_store.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <mutex>
#include <set>

#include "redcount/common/errors.h"
#include "redcount/common/threads.h"
#include "redcount/common/util.h"
#include "memory/keyspace.h"

#include "memory/command_support.h"

namespace redcount {

MemoryStore::MemoryStore(const StoreOptions& options)
    : clock_(options.clock ? options.clock : std::make_shared<SystemClock>()),
      sweep_interval_(options.sweep_interval) {
  fork_hooks_ = ForkHooks::of(this);
  if (sweep_interval_.count() > 0) sweeper_ = std::make_unique<std::thread>(start_thread([this] { sweeper_loop(); }));
}

MemoryStore::~MemoryStore() {
  close();
  fork_hooks_ = ForkHooks();
}

void MemoryStore::close() {
  std::lock_guard<std::mutex> closing(close_mu_);
  {
    std::lock_guard<std::mutex> lock(sweeper_mu_);
    stop_sweeper_ = true;
  }
  sweeper_cv_.notify_all();
  if (sweeper_ && sweeper_->joinable() && sweeper_->get_id() != std::this_thread::get_id()) sweeper_->join();
  restart_sweeper_.store(false, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

// Lock order everywhere: close_mu_, then sweeper_mu_ or mu_ (never both of those at once
// outside these handlers).
void MemoryStore::fork_prepare() {
  close_mu_.lock();
  sweeper_mu_.lock();
  mu_.lock();
}

void MemoryStore::fork_parent() {
  mu_.unlock();
  sweeper_mu_.unlock();
  close_mu_.unlock();
}

void MemoryStore::fork_child() {
  // The child has only the forking thread: the sweeper's handle names a thread that does not
  // exist here. Abandon it (joining or destroying a joinable std::thread would hang or
  // terminate) and start a new sweeper on the child's first call.
  if (sweeper_) {
    (void)sweeper_.release();
    if (!stop_sweeper_) restart_sweeper_.store(true, std::memory_order_relaxed);
  }
  mu_.unlock();
  sweeper_mu_.unlock();
  close_mu_.unlock();
}

void MemoryStore::restart_sweeper_after_fork() {
  std::lock_guard<std::mutex> closing(close_mu_);
  if (!restart_sweeper_.exchange(false) || stop_sweeper_) return;
  sweeper_ = std::make_unique<std::thread>(start_thread([this] { sweeper_loop(); }));
}

void MemoryStore::sweeper_loop() {
  std::unique_lock<std::mutex> lock(sweeper_mu_);
  while (!stop_sweeper_) {
    sweeper_cv_.wait_for(lock, sweep_interval_, [this] { return stop_sweeper_; });
    if (stop_sweeper_) break;
    lock.unlock();
    sweep();
    lock.lock();
  }
}

std::size_t MemoryStore::sweep() {
  std::size_t freed = 0;
  // Free in slices so a huge expiry wave never holds the lock for long.
  for (;;) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::int64_t now = clock_->now_ms();
    std::size_t slice = 0;
    std::size_t erased = 0;
    while (!expiry_.empty() && expiry_.begin()->first <= now && slice < 1024) {
      auto node = expiry_.extract(expiry_.begin());
      ++slice;
      auto it = data_.find(node.value().second);
      if (it == data_.end()) continue;
      Entry& e = it->second;
      if (e.expire_at != 0 && e.expire_at > now) {  // its deadline moved later: file it there
        e.indexed_at = e.expire_at;
        node.value().first = e.expire_at;
        expiry_.insert(std::move(node));
      } else if (e.expire_at == 0) {
        e.indexed_at = 0;
      } else {
        data_.erase(it);
        ++erased;
      }
    }
    freed += erased;
    if (slice < 1024) return freed;
  }
}

std::size_t MemoryStore::stored_keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.size();
}

Reply MemoryStore::run_request(Ops& ops, const Request& req) {
  if (const auto* cmd = std::get_if<Command>(&req)) return run_command(ops, cmd->args);
  const auto& call = *std::get_if<ScriptCall>(&req);
  if (call.typed && call.script->typed != nullptr) return call.script->typed(ops, call.keys, *call.typed);
  if (call.typed && call.args.empty()) [[unlikely]] {
    std::vector<std::string> scratch;
    return call.script->native(ops, call.keys, call.argv(scratch));
  }
  return call.script->native(ops, call.keys, call.args);
}

namespace {

// MULTI, EXEC or DISCARD (any case): the words of a transaction inside one batch.
enum class TxWord { None, Multi, Exec, Discard };

TxWord tx_word(const Request& req) {
  const auto* cmd = std::get_if<Command>(&req);
  if (cmd == nullptr || cmd->args.empty()) return TxWord::None;
  const std::string& a = cmd->args[0];
  if (a.size() != 4 && a.size() != 5 && a.size() != 7) return TxWord::None;
  const std::string w = memory_commands::upper(a);
  if (w == "MULTI") return TxWord::Multi;
  if (w == "EXEC") return TxWord::Exec;
  if (w == "DISCARD") return TxWord::Discard;
  return TxWord::None;
}

}  // namespace

std::vector<Reply> MemoryStore::execute(const std::vector<Request>& batch) {
  if (restart_sweeper_.load(std::memory_order_relaxed)) restart_sweeper_after_fork();
  std::vector<Reply> out;
  out.reserve(batch.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw StoreClosed("the memory:// store is closed; open a new one with redcount.connect()");
  auto run = [&](const Request& req) {
    Ops ops(*this, clock_->now_ms());
    Reply r;
    try {
      r = run_request(ops, req);
    } catch (const ReplyError& e) {
      r = Reply::of_error(e.what());
      // A command that fails inside a script fails the script: Redis says so after the
      // command's own error ("... script: <sha>, on @user_script:<line>."), which makes it a
      // ScriptError on both stores.
      if (const auto* call = std::get_if<ScriptCall>(&req)) {
        r.str += " script: " + std::string(call->script->sha1) + ", on @user_script: (" +
                 std::string(call->script->name) + ", the memory store's native twin).";
      }
    }
    return r;
  };
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Request& req = batch[i];
    if (const TxWord word = tx_word(req); word != TxWord::None) [[unlikely]] {
      // MULTI ... EXEC: the batch already runs under the lock, so the transaction is atomic;
      // as on Redis, the commands answer QUEUED and run at EXEC (not at all after DISCARD).
      if (word != TxWord::Multi) {
        out.push_back(Reply::of_error(word == TxWord::Exec ? "ERR EXEC without MULTI" : "ERR DISCARD without MULTI"));
        continue;
      }
      out.push_back(Reply::of_status("OK"));
      std::vector<std::size_t> queued;
      for (++i; i < batch.size(); ++i) {
        const TxWord w = tx_word(batch[i]);
        if (w == TxWord::Multi) {
          out.push_back(Reply::of_error("ERR MULTI calls can not be nested"));
        } else if (w == TxWord::Discard) {
          out.push_back(Reply::of_status("OK"));
          break;
        } else if (w == TxWord::Exec) {
          std::vector<Reply> replies;
          replies.reserve(queued.size());
          for (std::size_t q : queued) replies.push_back(run(batch[q]));
          out.push_back(Reply::of_array(std::move(replies)));
          break;
        } else {
          queued.push_back(i);
          out.push_back(Reply::of_status("QUEUED"));
        }
      }
      continue;
    }
    // One push_back site: this loop is on every call of every counter, and its code
    // should stay small (see the commit on instruction-cache misses).
    out.push_back(run(req));
  }
  return out;
}

}  // namespace redcount
