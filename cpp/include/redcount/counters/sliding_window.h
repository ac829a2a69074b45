// Sliding-window counters: the events, or the distinct items, of the last `window` ms.
//
//   SlidingWindowCounter logins(store, "logins", 60'000);
//   logins.add("user:42");              // -> events of user:42 in the last 60 s
//   logins.add_unique("page:/", "ip:1.2.3.4");  // -> distinct ips of the last 60 s
//
// Redis layout (the window size is part of every key, so one business key can have
// counters of several granularities):
//   <prefix>:<name>:{<key>}:<window_ms>:log     sorted set of events, score = time (ms),
//                                              member = "<time>:<unique id>" (no two
//                                              events collide, even in one millisecond)
//   <prefix>:<name>:{<key>}:<window_ms>:log:w   extra weight of events added with
//                                              amount > 1 (member "...*<amount>"), only
//                                              while such events are in the window
//   <prefix>:<name>:{<key>}:<window_ms>:uniq    sorted set of items, score = last seen
// Every write runs one script (sliding_counter.lua; native twin on the memory store) that
// trims what left the window, adds, sets the key's TTL to the window and returns the count.
// Each method is also an operation (operation.h): make_add(key, amount) and so on.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "redcount/common/bounds.h"
#include "redcount/store/operation.h"
#include "redcount/store/store.h"
#include "redcount/store/scripts.h"
#include "redcount/store/time_source.h"

namespace redcount {



class SlidingWindowCounter {
 public:
  SlidingWindowCounter(std::shared_ptr<Store> store, std::string name, std::int64_t window_ms,
                       std::string prefix = "redcount", ClockMode clock = ClockMode::Client);

  // Records `amount` events (1 .. kMaxSlidingAmount) now; returns the window's total.
  std::int64_t add(std::string_view key, std::int64_t amount = 1);
  std::int64_t count(std::string_view key);
  // Records that `item` was seen now; returns the distinct items of the window.
  std::int64_t add_unique(std::string_view key, std::string_view item);
  std::int64_t count_unique(std::string_view key);
  // Forgets the key's events and items.
  void clear(std::string_view key);

  // The same as operations (validated here; nothing sent until run).
  std::shared_ptr<Op<std::int64_t>> make_add(std::string_view key, std::int64_t amount = 1);
  std::shared_ptr<Op<std::int64_t>> make_count(std::string_view key);
  std::shared_ptr<Op<std::int64_t>> make_add_unique(std::string_view key, std::string_view item);
  std::shared_ptr<Op<std::int64_t>> make_count_unique(std::string_view key);
  std::shared_ptr<Op<std::monostate>> make_clear(std::string_view key);

  std::string events_key(std::string_view key) const;
  std::string weight_key(std::string_view key) const;
  std::string unique_key(std::string_view key) const;

  const std::string& name() const noexcept { return name_; }
  const std::string& prefix() const noexcept { return prefix_; }
  std::int64_t window_ms() const noexcept { return window_ms_; }
  ClockMode clock() const noexcept { return time_.effective(); }
  const std::shared_ptr<Store>& store() const noexcept { return store_; }

 private:
  std::shared_ptr<Op<std::int64_t>> script_op(const char* op, std::vector<std::string> keys, std::string arg);

  std::shared_ptr<Store> store_;
  std::string name_;
  std::int64_t window_ms_;
  std::string prefix_;
  TimeSource time_;
};

}  // namespace redcount
