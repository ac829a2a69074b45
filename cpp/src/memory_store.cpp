#include "redcount/memory_store.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>

#include "redcount/errors.h"
#include "redcount/util.h"
#include "memory/keyspace.h"

namespace redcount {

MemoryStore::MemoryStore(const StoreOptions& options)
    : clock_(options.clock ? options.clock : std::make_shared<SystemClock>()),
      sweep_interval_(options.sweep_interval) {
  if (sweep_interval_.count() > 0) sweeper_ = std::thread([this] { sweeper_loop(); });
}

MemoryStore::~MemoryStore() { close(); }

void MemoryStore::close() {
  {
    std::lock_guard<std::mutex> lock(sweeper_mu_);
    stop_sweeper_ = true;
  }
  sweeper_cv_.notify_all();
  if (sweeper_.joinable() && sweeper_.get_id() != std::this_thread::get_id()) sweeper_.join();
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
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

std::vector<Reply> MemoryStore::execute(const std::vector<Request>& batch) {
  std::vector<Reply> out;
  out.reserve(batch.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw StoreClosed("the memory:// store is closed; open a new one with redcount.connect()");
  for (const Request& req : batch) {
    Ops ops(*this, clock_->now_ms());
    // One push_back site: this loop is on every call of every counter, and its code
    // should stay small (see the commit on instruction-cache misses).
    Reply r;
    try {
      r = run_request(ops, req);
    } catch (const ReplyError& e) {
      r = Reply::of_error(e.what());
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace redcount
