// What the sharded counter's files share: a write resolved to its shard, the layout key's
// text, and the state the counter shares with its operations (Core). The counter's writes
// and retry queue are in sharded_counter.cpp, its reads in sharded_reads.cpp, its layout
// and reshard in sharded_layout.cpp. Private to sharded/.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <type_traits>

#include "redcount/common/errors.h"
#include "redcount/common/keys.h"
#include "redcount/sharded/sharded_counter.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {
namespace sharded_detail {

using SteadyClock = std::chrono::steady_clock;

// One increment resolved to its shard and keys.
struct ShardedWrite {
  std::string name;
  std::int64_t shard = 0;
  std::int64_t amount = 0;
  std::string request_id;
  std::string reason;  // non-empty for an audited adjustment
  std::string value_key, log_key, rid_key;
  // The id's keys in older generations' shards (for a while after a reshard): those in the
  // value key's store shard go into the write's own script call (checked and recorded
  // atomically, as on a single server, where every key is in one store shard); the others
  // (Redis Cluster, a ring: another slot) are claimed first with sharded_claim.lua.
  std::vector<std::string> older_rid_keys;
  std::vector<std::string> claim_keys;
};


// The layout key's text: "<version>|<first>,<count>,<retired_ms>;..." oldest generation first.
std::string format_layout(const ShardLayout& l);
ShardLayout first_layout(std::int64_t shards);
// The layout in `text` ('' = none written yet: the first generation of `shards`). A text
// reshard() did not write (a foreign SET) is an error naming the key, never a guess.
ShardLayout parse_layout(const std::string& text, std::int64_t shards, const std::string& key);
// The layout key's reply as text ('' when absent).
std::string layout_text(const Reply& r);

}  // namespace sharded_detail

using sharded_detail::first_layout;
using sharded_detail::parse_layout;
using sharded_detail::ShardedWrite;
using sharded_detail::SteadyClock;

struct ShardedCounter::Core {
  std::shared_ptr<Store> store;
  ShardedOptions options;

  // The layouts this object has seen, per counter name (incr_many and values() touch others).
  struct KnownLayout {
    ShardLayout layout;
    std::string text;
    SteadyClock::time_point read_at{};  // when the read that returned it was sent; {} = never read
  };
  mutable std::mutex layout_mu;
  std::map<std::string, KnownLayout, std::less<>> layouts;
  std::set<std::string, std::less<>> refreshing;  // names whose read_behind() is in flight

  // The read cache.
  std::mutex cache_mu;
  std::optional<std::int64_t> cached;
  SteadyClock::time_point cached_at{};       // when the read that produced `cached` was sent
  SteadyClock::time_point refresh_started{};  // a refresh in flight, if recent

  std::shared_ptr<RetryQueue> retry;  // also what close() closes (with on_error="raise" it stays empty)

  bool queueing() const noexcept { return options.on_error == ShardedOptions::OnError::Queue; }

  KnownLayout known(std::string_view name) const {
    std::lock_guard<std::mutex> lock(layout_mu);
    auto it = layouts.find(name);
    if (it != layouts.end()) return it->second;
    return KnownLayout{first_layout(options.shards), {}, {}};
  }

  // Remembers the layout read at `sent` (the newest read wins; a bounded map: names come
  // from callers of incr_many and values()).
  void learn(std::string_view name, const std::string& text, SteadyClock::time_point sent) {
    ShardLayout l = parse_layout(text, options.shards, sharded_layout_key(options.prefix, name));
    std::lock_guard<std::mutex> lock(layout_mu);
    auto it = layouts.find(name);
    if (it == layouts.end()) {
      if (layouts.size() >= 10'000) layouts.clear();
      layouts.emplace(std::string(name), KnownLayout{std::move(l), text, sent});
    } else if (it->second.read_at <= sent) {
      it->second = KnownLayout{std::move(l), text, sent};
    }
  }

  static std::int64_t shard_in(const ShardGeneration& g, std::uint64_t hash) {
    return g.first + static_cast<std::int64_t>(hash % static_cast<std::uint64_t>(g.count));
  }

  std::int64_t shard_for(std::string_view request_id) const {
    const ShardGeneration g = known(options.name).layout.current();
    if (!request_id.empty()) return shard_in(g, fnv1a64(request_id));
    static thread_local std::minstd_rand rng{std::random_device{}()};
    return shard_in(g, rng());
  }

  // Gives `w` its shard and keys in `l`: the current generation's shard, and for a request
  // id the id's keys in the older generations retired less than idempotency_ttl + grace ago.
  void route(ShardedWrite& w, const ShardLayout& l, std::int64_t now_ms) const {
    static thread_local std::minstd_rand rng{std::random_device{}()};
    const std::uint64_t hash = w.request_id.empty() ? rng() : fnv1a64(w.request_id);
    w.shard = shard_in(l.current(), hash);
    w.value_key = sharded_value_key(options.prefix, w.name, w.shard);
    w.log_key.reserve(w.value_key.size() + 4);
    w.log_key.assign(w.value_key).append(":log");
    w.rid_key.clear();
    w.older_rid_keys.clear();
    w.claim_keys.clear();
    if (w.request_id.empty()) return;
    const std::string suffix = std::string("rid:").append(w.request_id);
    w.rid_key.reserve(w.value_key.size() + 1 + suffix.size());
    w.rid_key.assign(w.value_key).append(":").append(suffix);
    for (std::size_t i = 0; i + 1 < l.generations.size(); ++i) {
      const ShardGeneration& g = l.generations[i];
      if (now_ms < g.retired_ms + options.idempotency_ttl_ms + kLayoutGraceMs) {
        std::string key = sharded_key(options.prefix, w.name, shard_in(g, hash), suffix);
        (store->shard_of(key) == store->shard_of(w.value_key) ? w.older_rid_keys : w.claim_keys)
            .push_back(std::move(key));
      }
    }
  }

  // Routes every write under one lock, reading the layouts in place (no copies: this runs
  // per incr_many item at the counters' full rate).
  // `now_ms` is the store's clock when the operation was made: the steps of an operation
  // read no store state.
  void route_all(std::vector<ShardedWrite>& writes, std::int64_t now_ms) const {
    const ShardLayout first = first_layout(options.shards);
    std::lock_guard<std::mutex> lock(layout_mu);
    for (auto& w : writes) {
      auto it = layouts.find(w.name);
      route(w, it == layouts.end() ? first : it->second.layout, now_ms);
    }
  }

  // The names among `writes` whose layout is older than kLayoutRefreshMs (or never read).
  std::vector<std::string> stale_names(const std::vector<ShardedWrite>& writes) const {
    const auto now = SteadyClock::now();
    std::vector<std::string> out;
    std::lock_guard<std::mutex> lock(layout_mu);
    const std::string* previous = nullptr;
    for (const auto& w : writes) {
      if (previous != nullptr && *previous == w.name) continue;  // a run of one counter's writes
      previous = &w.name;
      auto it = layouts.find(w.name);
      if (it != layouts.end() && now - it->second.read_at < std::chrono::milliseconds(kLayoutRefreshMs)) continue;
      if (std::find(out.begin(), out.end(), w.name) == out.end()) out.push_back(w.name);
    }
    return out;
  }

  // Takes out of the stale `names` those a write may go on with while their layout is
  // re-read in the background (read_behind): read before, less than kLayoutFallbackMs ago,
  // and with the layout key in another store shard than the current generation's first
  // shard (a Redis Cluster or ring: the layout key's node may be down while the shards'
  // are not). A stale writer is one the layout protocol already allows for: its writes go
  // to a generation every read still sums, and a request id's claim by a newer writer
  // makes sharded_incr.lua answer -1, which re-reads the layout before the write goes on.
  std::vector<std::string> take_read_behind(std::vector<std::string>& names) const {
    const auto now = SteadyClock::now();
    std::vector<std::string> behind;
    std::lock_guard<std::mutex> lock(layout_mu);
    for (auto it = names.begin(); it != names.end();) {
      auto known_it = layouts.find(*it);
      const bool usable = known_it != layouts.end() && known_it->second.read_at != SteadyClock::time_point{} &&
                          now - known_it->second.read_at < std::chrono::milliseconds(kLayoutFallbackMs) &&
                          store->shard_of(sharded_layout_key(options.prefix, *it)) !=
                              store->shard_of(sharded_value_key(options.prefix, *it,
                                                                known_it->second.layout.current().first));
      if (usable) {
        behind.push_back(std::move(*it));
        it = names.erase(it);
      } else {
        ++it;
      }
    }
    return behind;
  }

  // Re-reads `names`' layouts without anybody waiting for the reply: at most one read per
  // name in flight; a failed read leaves the copy as it was (still stale: the next write
  // sends another).
  static void read_behind(const std::shared_ptr<Core>& core, std::vector<std::string> names) {
    {
      std::lock_guard<std::mutex> lock(core->layout_mu);
      names.erase(std::remove_if(names.begin(), names.end(),
                                 [&](const std::string& n) { return !core->refreshing.insert(n).second; }),
                  names.end());
    }
    if (names.empty()) return;
    const auto sent = SteadyClock::now();
    std::vector<Request> batch = core->layout_gets(names);
    std::weak_ptr<Core> weak = core;
    auto done = [weak, names, sent](std::vector<Reply>&& replies, std::exception_ptr error) {
      const auto c = weak.lock();
      if (!c) return;
      if (!error && replies.size() == names.size()) {
        for (std::size_t i = 0; i < names.size(); ++i) {
          if (replies[i].is_error()) continue;
          try {
            c->learn(names[i], sharded_detail::layout_text(replies[i]), sent);
          } catch (const Error&) {
            // A layout key that does not parse: the next blocking read reports it.
          }
        }
      }
      std::lock_guard<std::mutex> lock(c->layout_mu);
      for (const auto& n : names) c->refreshing.erase(n);
    };
    try {
      core->store->submit(std::move(batch), std::move(done));
    } catch (const Error&) {
      std::lock_guard<std::mutex> lock(core->layout_mu);
      for (const auto& n : names) core->refreshing.erase(n);
    }
  }

  std::vector<Request> layout_gets(const std::vector<std::string>& names) const {
    std::vector<Request> batch;
    for (const auto& n : names) batch.emplace_back(Command{{"GET", sharded_layout_key(options.prefix, n)}});
    return batch;
  }

  // Validates one increment; route() gives it its keys when it is sent.
  ShardedWrite resolve(std::string_view name, std::int64_t amount, std::string_view request_id) const {
    if (amount == 0) throw InvalidArgument("amount must not be 0 (use a positive or negative integer)");
    if (amount > kMaxShardedAmount || amount < -kMaxShardedAmount) {
      throw InvalidArgument("amount must be within +-(2**53 - 1), got " + std::to_string(amount));
    }
    if (!request_id.empty()) {
      validate_request_id(request_id);
      if (options.route == ShardedOptions::Route::Random) {
        throw InvalidArgument(
            "request_id needs route='request-id': with route='random' a retry could land on a shard "
            "that has not seen the id, and count twice");
      }
    }
    ShardedWrite w;
    w.name = std::string(name);
    w.amount = amount;
    w.request_id = std::string(request_id);
    return w;
  }

  std::vector<std::string> shard_keys(std::string_view name, const ShardLayout& l) const {
    std::vector<std::string> out;
    out.reserve(static_cast<std::size_t>(l.total()));
    for (std::int64_t i = 0; i < l.total(); ++i) out.push_back(sharded_value_key(options.prefix, name, i));
    return out;
  }

  void check_open() const {
    if (retry->closed()) throw Error("this counter is closed; create a new ShardedCounter");
  }
  void enqueue(std::vector<ShardedWrite> writes, const std::string& error);
};

}  // namespace redcount
