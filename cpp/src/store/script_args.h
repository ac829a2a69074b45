// What a script's operation and its native twin share: the typed argument lists
// (ScriptArgs) of the scripts that have them, the argument checks and the saturating
// arithmetic both sides use, so that the operation that builds a call and the memory
// store's twin that reads it agree by construction.
//
//   auto args = std::make_shared<IncrArgs>();   // an operation fills it
//   call.typed = args;                          // the twin reads it as it is; Redis gets render()
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redcount/common/bounds.h"
#include "redcount/common/util.h"
#include "redcount/store/store.h"

namespace redcount::detail {

// count + cost > limit, exact for every int64 (a foreign write can leave any count).
inline bool exceeds(std::int64_t count, std::int64_t cost, std::int64_t limit) {
  std::int64_t sum = 0;
  if (__builtin_add_overflow(count, cost, &sum)) return cost > 0;
  return sum > limit;
}

// max(0, limit - count), saturating.
inline std::int64_t remaining_of(std::int64_t limit, std::int64_t count) {
  std::int64_t rem = 0;
  if (__builtin_sub_overflow(limit, count, &rem)) return std::numeric_limits<std::int64_t>::max();
  return rem < 0 ? 0 : rem;
}

// ceil(a / b) for b > 0 and any a.
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

// Saturating arithmetic for native scripts working on values read from the store: a
// foreign write can leave any int64 there, and Lua (doubles) never overflows either.
inline std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}
inline std::int64_t sat_sub(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}
inline std::int64_t sat_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) == (b < 0) ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}

// now + ttl as a PXAT deadline, or nullopt when that does not fit in int64: there the
// script's SET ... PXAT fails on Redis too (the deadline is no longer an integer).
inline std::optional<std::int64_t> deadline_after(std::int64_t now, std::int64_t ttl) noexcept {
  if (ttl > 0 && now > std::numeric_limits<std::int64_t>::max() - ttl) return std::nullopt;
  return now + ttl;
}

// A numeric script argument within [lo, hi], or nullopt. Native scripts only accept the
// ranges the strategies ever send, so malformed calls get an error reply, never UB.
inline std::optional<std::int64_t> arg_in(const std::string& arg, std::int64_t lo, std::int64_t hi) {
  auto v = parse_int64(arg);
  if (!v || *v < lo || *v > hi) return std::nullopt;
  return v;
}
using ::redcount::kMaxExact;
using ::redcount::kMaxScriptSpanMs;
using ::redcount::kMaxMembers;
using ::redcount::kMaxMembersPerCall;

// Unique member ids: a random per-process base plus a counter, unique across processes;
// `in_process` gives a short id (the counter alone) unique within this process only.
std::string unique_id(bool in_process = false);
// The same id before it is formatted: global() is unique_id(), local() unique_id(true).
struct UniqueId {
  std::uint64_t n = 0;
  std::string global() const;
  std::string local() const;
};
UniqueId next_unique_id();

// The time a native script runs at: the argument, or the store's clock for "" (the Lua
// twin reads TIME then). `scale` 1000 gives microseconds. nullopt for a malformed one.
std::optional<std::int64_t> script_time(Keyspace& ks, const std::string& arg, std::int64_t scale = 1);

// A vector that keeps up to N elements inline: the per-call lists of a hit (one entry per
// limit, a reply's integers) rarely exceed a few, and the memory store's hot paths
// should not pay an allocation for each.
template <class T, std::size_t N>
class SmallVec {
 public:
  void push_back(const T& v) {
    if (heap_.empty() && n_ < N) {
      inline_[n_++] = v;
      return;
    }
    if (heap_.empty()) heap_.assign(inline_.begin(), inline_.begin() + static_cast<std::ptrdiff_t>(n_));
    heap_.push_back(v);
    ++n_;
  }
  void assign(std::size_t n, const T& v) {
    clear();
    if (n <= N) {
      std::fill_n(inline_.begin(), n, v);
      n_ = n;
      return;
    }
    heap_.assign(n, v);
    n_ = n;
  }
  void clear() {
    n_ = 0;
    heap_.clear();
  }
  std::size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }
  T* data() noexcept { return heap_.empty() ? inline_.data() : heap_.data(); }
  const T* data() const noexcept { return heap_.empty() ? inline_.data() : heap_.data(); }
  T& operator[](std::size_t i) noexcept { return data()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data()[i]; }
  T& back() noexcept { return data()[n_ - 1]; }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + n_; }

 private:
  std::array<T, N> inline_;  // (not value-initialised: only [0, n_) is ever read)
  std::size_t n_ = 0;
  std::vector<T> heap_;
};

// A script reply's integers.
using Ints = SmallVec<std::int64_t, 24>;

// A native script's integers as its array reply.
Reply int_array(const Ints& v);

// Reply::of_error for a native script given arguments it cannot parse.
Reply malformed(std::string_view script);

// A typed script argument list that carries the time: the memory store's twin reads it
// as it is; a network store gets render(). `now` nullopt = the script reads TIME. The
// typed twins of the limiters answer in place (see ScriptArgs): the integers the Lua
// script would return go to `ints`.
struct TimedArgs : ScriptArgs {
  std::optional<std::int64_t> now;
  mutable Ints ints;
  mutable bool answered = false;
  std::string now_text() const { return now ? std::to_string(*now) : std::string(); }
  std::optional<Reply> answer() const override {
    if (!answered) return std::nullopt;
    return int_array(ints);
  }
  // What a typed twin returns once it wrote `ints` (ok) or found its arguments malformed.
  Reply answer_with(bool ok, std::string_view script) const;
};

}  // namespace redcount::detail

namespace redcount {

// fixed_window_incr's ARGV in typed form (see ScriptArgs): the typed twin reads the numbers
// as they are and answers in place, leaving the per-item replies in `replies`.
struct IncrArgs final : ScriptArgs {
  std::int64_t deadline = 0;
  detail::SmallVec<std::int64_t, 1> amounts;    // per item
  detail::SmallVec<std::int64_t, 1> rid_items;  // per request-id key: its item, 1-based
  mutable detail::SmallVec<Reply, 1> replies;
  mutable bool answered = false;

  std::vector<std::string> render() const override {
    std::vector<std::string> out;
    out.reserve(3 + amounts.size() + rid_items.size());
    out.push_back(std::to_string(amounts.size()));
    out.push_back(std::to_string(deadline));
    // Items that all add the same send that amount once (the script's short form).
    const bool same = std::all_of(amounts.begin(), amounts.end(), [&](std::int64_t a) { return a == amounts[0]; });
    if (same && !amounts.empty()) {
      out.push_back(std::to_string(amounts[0]));
    } else {
      for (std::int64_t a : amounts) out.push_back(std::to_string(a));
    }
    for (std::int64_t j : rid_items) out.push_back(std::to_string(j));
    return out;
  }
  std::optional<Reply> answer() const override {
    if (!answered) return std::nullopt;
    return Reply::of_array(std::vector<Reply>(replies.begin(), replies.end()));
  }
};

// fixed_window_hit's ARGV in typed form (see ScriptArgs): the typed twin reads the numbers
// as they are and answers in place, leaving the reply's integers (allowed, then the count
// per limit) in `ints`.
struct HitArgs final : ScriptArgs {
  struct Limit {
    std::int64_t amount, expire_at;
  };
  std::int64_t cost = 1;
  detail::SmallVec<Limit, 2> limits;
  mutable detail::Ints ints;
  mutable bool answered = false;

  std::vector<std::string> render() const override {
    std::vector<std::string> out;
    out.reserve(1 + 2 * limits.size());
    out.push_back(std::to_string(cost));
    for (const Limit& l : limits) {
      out.push_back(std::to_string(l.amount));
      out.push_back(std::to_string(l.expire_at));
    }
    return out;
  }
  std::optional<Reply> answer() const override {
    if (!answered) return std::nullopt;
    return detail::int_array(ints);
  }
};

// The exact log's decision on the memory store: sliding_log.lua's twin, keep the two in
// step. Returns the Lua reply's integers, or nullopt for arguments the strategy never sends.
struct LogArgs final : detail::TimedArgs {
  bool hit = false;
  std::int64_t cost = 0;
  // A lease's hit: its entries are stamped this time (>= now) instead of now.
  std::optional<std::int64_t> stamp_at;
  detail::UniqueId id;
  detail::SmallVec<std::int64_t, 4> amount, window;
  std::vector<std::string> render() const override {
    std::vector<std::string> out{now_text(),
                                 stamp_at ? "lease:" + std::to_string(*stamp_at) : hit ? "hit" : "test",
                                 std::to_string(cost), id.global()};
    for (std::size_t i = 0; i < amount.size(); ++i) {
      out.push_back(std::to_string(amount[i]));
      out.push_back(std::to_string(window[i]));
    }
    return out;
  }
};

// The approximate window's decision on the memory store: sliding_approx.lua's twin, keep
// the two in step. Returns the Lua reply's integers, or nullopt for bad arguments.
struct ApproxArgs final : detail::TimedArgs {
  struct Limit {
    std::int64_t amount, bucket, k;
  };
  bool hit = false;
  std::int64_t cost = 0;
  detail::SmallVec<Limit, 4> limits;
  std::vector<std::string> render() const override {
    std::vector<std::string> out{now_text(), hit ? "hit" : "test", std::to_string(cost)};
    for (const auto& l : limits) {
      out.push_back(std::to_string(l.amount));
      out.push_back(std::to_string(l.bucket));
      out.push_back(std::to_string(l.k));
    }
    return out;
  }
};

}  // namespace redcount
