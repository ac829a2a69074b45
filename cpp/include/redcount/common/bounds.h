// The numeric bounds of redcount in one place: what a limit, a cost, a window or a script
// argument may be, and why. Validation (InvalidArgument) and the native scripts' argument
// checks both read them, so the two cannot drift.
//
//   if (l.amount > kMaxMembers) throw InvalidArgument("...");   // a strategy's check
//   auto w = detail::arg_in(args[5], 1, kMaxScriptSpanMs);              // a native twin's check
#pragma once

#include <cstdint>

namespace redcount {

// Lua numbers are doubles: integers up to 2^53 are exact, so anything a script computes
// with (times, counts, amounts) stays below it.
inline constexpr std::int64_t kMaxExact = std::int64_t{1} << 53;
// A limit's amount (and burst) as parsed: exact in a Lua double.
inline constexpr std::int64_t kMaxAmount = kMaxExact - 1;
// A limit's window as parsed (about 142,000 years): multiples of the largest unit stay
// far from int64 overflow.
inline constexpr std::int64_t kMaxWindowMs = std::int64_t{1} << 52;
// Windows a sliding, bucket or concurrency script works with (about 139 years).
inline constexpr std::int64_t kMaxScriptSpanMs = std::int64_t{1} << 42;
// A counter's window or grace (fixed-window and sliding counters): longer ones would
// overflow the millisecond clock arithmetic of their windows.
inline constexpr std::int64_t kMaxCounterSpanMs = std::int64_t{1} << 52;
// Lease timeouts, sliding-counter windows and GCRA windows (about 34 years): their
// products with amounts or µs stay exact.
inline constexpr std::int64_t kMaxLongTimeoutMs = std::int64_t{1} << 40;
// amount (or burst) times the window in ms, and a GCRA burst times its emission interval
// in µs: the largest product a script keeps exact.
inline constexpr std::int64_t kMaxExactProduct = std::int64_t{1} << 50;
// The exact log and the concurrency limiter store one set member per unit of cost, and
// Redis runs a script alone: these caps bound the work one call makes the server do (and
// so the stall every other client sees). A set holds at most kMaxMembers (one call may
// trim that many: ~0.15 s measured), one call adds at most kMaxMembersPerCall (~0.1 s).
// Strategies whose work does not grow with the cost have none of these caps.
inline constexpr std::int64_t kMaxMembers = 100'000;
inline constexpr std::int64_t kMaxMembersPerCall = 10'000;
// sliding-window-approx splits a window into at most this many sub-buckets.
inline constexpr std::int64_t kMaxSubBuckets = 60;
// The largest amount one SlidingWindowCounter::add may carry; sums stay exact in Lua.
inline constexpr std::int64_t kMaxSlidingAmount = std::int64_t{1} << 32;
// Limiter keys outlive their window by this much, like counters' grace: a hit from a
// client whose clock runs a little behind still finds its window's key.
inline constexpr std::int64_t kLimiterGraceMs = 1000;
// The bounds of a quota's value, amounts, floor and ceiling: exact as Lua numbers.
inline constexpr std::int64_t kMaxQuota = (std::int64_t{1} << 53) - 1;

}  // namespace redcount
