// The memory store's native twins of token_bucket.lua and gcra.lua (the bucket limiters): the
// same reads and writes on the keyspace, in C++. Keep each in step with its Lua file; the
// parity tests run both against the same inputs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/twins/twins.h"
#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "store/script_args.h"

namespace redcount::twins {

using detail::ceil_div;
using detail::exceeds;
using detail::remaining_of;

// The memory store's twin of token_bucket.lua; keep the two in step.
Reply native_token_bucket(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  const std::size_t n = keys.size();
  if (args.size() != 3 + 3 * n) return detail::malformed("token_bucket");
  auto now = detail::script_time(ks, args[0]);
  auto cost = detail::arg_in(args[2], 1, detail::kMaxExact);
  if (!now || !cost) return detail::malformed("token_bucket");
  const bool hit = args[1] == "hit";
  std::vector<std::int64_t> amount(n), window(n), full(n), level(n);
  bool allowed = true;
  for (std::size_t i = 0; i < n; ++i) {
    auto a = detail::arg_in(args[3 + 3 * i], 1, detail::kMaxExact);
    auto w = detail::arg_in(args[4 + 3 * i], 1, detail::kMaxScriptSpanMs);
    auto cap = detail::arg_in(args[5 + 3 * i], 1, detail::kMaxExact);
    if (!a || !w || !cap || __builtin_mul_overflow(*cap, *w, &full[i]) || full[i] > detail::kMaxExact) {
      return detail::malformed("token_bucket");
    }
    amount[i] = *a;
    window[i] = *w;
    const std::int64_t t =
        parse_int64(ks.or_reset(keys[i], [&] { return ks.hget(keys[i], "tokens"); }).value_or("")).value_or(-1);
    const auto s = parse_int64(ks.hget(keys[i], "ts").value_or(""));
    const auto was = parse_int64(ks.hget(keys[i], "cap").value_or(""));
    const std::int64_t stamp = s.value_or(0);
    std::int64_t lv = 0;
    if (t < 0 || !s) {  // absent (or not ours): a full bucket
      lv = full[i];
    } else {
      // The same tokens used under a changed capacity, clamped to [0, full].
      std::int64_t held = t;
      if (was && *was != full[i]) held = std::max<std::int64_t>(0, detail::sat_add(t, detail::sat_sub(full[i], *was)));
      held = std::min(held, full[i]);
      if (*now > stamp) {
        const std::int64_t elapsed = detail::sat_sub(*now, stamp);
        lv = (elapsed >= ceil_div(full[i] - held, amount[i])) ? full[i] : held + elapsed * amount[i];
      } else {
        lv = held;
      }
    }
    level[i] = std::min(lv, full[i]);
    if (level[i] < detail::sat_mul(*cost, window[i])) allowed = false;
  }
  std::vector<Reply> out{Reply::of_integer(*now), Reply::of_integer(allowed ? 1 : 0)};
  for (std::size_t i = 0; i < n; ++i) {
    if (allowed && hit) {
      level[i] -= *cost * window[i];
      ks.hset(keys[i], "tokens", std::to_string(level[i]));
      ks.hset(keys[i], "ts", std::to_string(*now));
      ks.hset(keys[i], "cap", std::to_string(full[i]));
      ks.pexpireat(keys[i], ks.now_ms() + std::max<std::int64_t>(1, ceil_div(full[i] - level[i], amount[i])));
    } else if (hit) {
      ks.hold_expiry(keys[i], ks.now_ms() + std::max<std::int64_t>(1, ceil_div(full[i] - level[i], amount[i])));
    }
    out.push_back(Reply::of_integer(level[i]));
  }
  return Reply::of_array(std::move(out));
}

// The memory store's twin of gcra.lua; keep the two in step.
Reply native_gcra(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  const std::size_t n = keys.size();
  if (args.size() != 3 + 2 * n) return detail::malformed("gcra");
  auto now = detail::script_time(ks, args[0], 1000);
  auto cost = detail::arg_in(args[2], 1, detail::kMaxExact);
  if (!now || !cost) return detail::malformed("gcra");
  const bool hit = args[1] == "hit";
  std::vector<std::int64_t> interval(n), tats(n);
  bool allowed = true;
  for (std::size_t i = 0; i < n; ++i) {
    auto t = detail::arg_in(args[3 + 2 * i], 1, detail::kMaxExact);
    auto burst = detail::arg_in(args[4 + 2 * i], 1, detail::kMaxExact);
    if (!t || !burst) return detail::malformed("gcra");
    interval[i] = *t;
    auto raw = ks.or_reset(keys[i], [&] { return ks.get(keys[i]); });
    auto tat = raw ? parse_int64(*raw) : std::optional<std::int64_t>(0);
    if (!tat) {  // a foreign value that is no number is garbage: start afresh
      ks.del(keys[i]);
      tat = 0;
    }
    using detail::sat_add;
    using detail::sat_mul;
    tats[i] = std::max(*tat, *now);
    if (detail::sat_sub(sat_add(tats[i], sat_mul(*cost, *t)), *now) > sat_mul(*burst, *t)) allowed = false;
  }
  std::vector<Reply> out{Reply::of_integer(*now), Reply::of_integer(allowed ? 1 : 0)};
  for (std::size_t i = 0; i < n; ++i) {
    if (allowed && hit) {
      tats[i] = detail::sat_add(tats[i], detail::sat_mul(*cost, interval[i]));
      ks.del(keys[i]);  // SET key tat PX ttl, as del + set-if-absent
      ks.set_nx_pxat(keys[i], std::to_string(tats[i]), ks.now_ms() + ceil_div(tats[i] - *now, 1000));
    } else if (hit) {
      ks.hold_expiry(keys[i], ks.now_ms() + std::max<std::int64_t>(1, ceil_div(tats[i] - *now, 1000)));
    }
    out.push_back(Reply::of_integer(tats[i]));
  }
  return Reply::of_array(std::move(out));
}

}  // namespace redcount::twins
