// The memory store's native twins of concurrency.lua (the concurrency limiter): the same reads
// and writes on the keyspace, in C++. Keep each in step with its Lua file; the parity tests
// run both against the same inputs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include <limits>

#include "memory/twins/twins.h"
#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "store/script_args.h"

namespace redcount::twins {

using detail::ceil_div;
using detail::exceeds;
using detail::remaining_of;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The memory store's twin of concurrency.lua; keep the two in step.
Reply native_concurrency(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  if (keys.size() != 1 || args.size() != 6) return detail::malformed("concurrency");
  auto now = detail::script_time(ks, args[0]);
  auto max = detail::arg_in(args[2], 1, detail::kMaxMembers);
  auto timeout = detail::arg_in(args[3], 1, detail::kMaxScriptSpanMs);
  auto cost = detail::arg_in(args[5], 1, detail::kMaxMembersPerCall);
  if (!now || !max || !timeout || !cost) return detail::malformed("concurrency");
  const std::string& op = args[1];
  const std::string& key = keys[0];
  auto member = [&](std::int64_t j) { return *cost == 1 ? args[4] : args[4] + ":" + std::to_string(j); };
  auto live = [&] {
    return static_cast<std::int64_t>(ks.zrangebyscore(key, static_cast<double>(*now + 1), kInf).size());
  };
  std::int64_t count = ks.or_reset(key, live);  // a foreign value of another type is garbage
  if (op == "acquire") ks.zremrangebyscore(key, -kInf, static_cast<double>(*now));
  std::int64_t ok = 0, need_at = 0;
  if (op == "release") {
    for (std::int64_t j = 1; j <= *cost; ++j) ok += ks.zrem(key, member(j)) ? 1 : 0;
    ok = ok > 0 ? 1 : 0;
    count = live();
  } else if (count + *cost <= *max) {
    ok = 1;
    if (op == "acquire") {
      for (std::int64_t j = 1; j <= *cost; ++j) ks.zadd(key, static_cast<double>(*now + *timeout), member(j));
      count += *cost;
    }
  } else {
    auto gone = ks.zrangebyscore(key, static_cast<double>(*now + 1), kInf, count + *cost - *max);
    if (static_cast<std::int64_t>(gone.size()) != count + *cost - *max) {
      return detail::malformed("concurrency");  // cost > max: the Lua twin fails here too
    }
    need_at = static_cast<std::int64_t>(gone.back().second);
  }
  std::int64_t latest = 0;
  auto last = ks.zrange(key, -1, -1);
  if (!last.empty() && last[0].second > static_cast<double>(*now)) latest = static_cast<std::int64_t>(last[0].second);
  if (latest > 0 && op != "test") {
    if (ok == 1) {
      ks.pexpireat(key, ks.now_ms() + latest - *now);
    } else {
      ks.hold_expiry(key, ks.now_ms() + latest - *now);
    }
  }
  return Reply::of_array({Reply::of_integer(*now), Reply::of_integer(ok), Reply::of_integer(count),
                          Reply::of_integer(need_at), Reply::of_integer(latest)});
}

}  // namespace redcount::twins
