// The memory store's native twins of fixed_window_incr.lua (the fixed-window counter) and
// fixed_window_hit.lua (the fixed-window limiter): the same reads and writes on the keyspace,
// in C++. Keep each in step with its Lua file; the parity tests run both against the same
// inputs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include <optional>

#include "memory/twins/twins.h"
#include "redcount/common/bounds.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "store/script_args.h"

namespace redcount::twins {

using detail::ceil_div;
using detail::exceeds;
using detail::remaining_of;

// One item of fixed_window_incr on the memory store, as the Lua loop body does it: its
// reply. Both twins run it, so they stay in step with each other and with the script.
Reply incr_item(Keyspace& ks, const std::string& key, std::int64_t amount, const std::string* rid,
                std::int64_t deadline) {
  if (rid && !ks.set_nx_pxat(*rid, "1", deadline)) {
    ks.hold_expiry(*rid, deadline);
    ks.hold_expiry(key, deadline);
    try {
      auto v = ks.get(key);
      return v ? Reply::of_string(*v) : Reply::of_integer(0);
    } catch (const ReplyError& e) {
      return Reply::of_error(e.what());
    }
  }
  try {
    const std::int64_t v = ks.incrby(key, amount);
    ks.hold_expiry(key, deadline);
    return Reply::of_integer(v);
  } catch (const ReplyError& e) {
    if (rid) ks.del(*rid);
    ks.hold_expiry(key, deadline);
    return Reply::of_error(e.what());
  }
}

// Request-id keys by item (nullptr: none); one inline slot covers incr().
using RidKeys = detail::SmallVec<const std::string*, 1>;

// The memory store's twin of fixed_window_incr.lua; keep the two in step.
Reply native_fixed_window_incr(Keyspace& ks, const std::vector<std::string>& keys,
                               const std::vector<std::string>& args) {
  auto bad = [] { return Reply::of_error("ERR fixed_window_incr: malformed arguments"); };
  if (args.size() < 2) return bad();
  auto n = parse_int64(args[0]);
  auto deadline = parse_int64(args[1]);
  if (!n || !deadline || *n < 0 || static_cast<std::size_t>(*n) > keys.size()) return bad();
  const std::size_t count = static_cast<std::size_t>(*n);
  const std::size_t ids = keys.size() - count;
  // One amount per item, or ARGV[3] for every item (the same for count 1), as the script.
  const bool each = args.size() == 2 + count + ids;
  if (count == 0 ? !each : (!each && args.size() != 3 + ids)) return bad();
  const std::size_t first_id = each ? 2 + count : 3;
  RidKeys rid;
  rid.assign(count, nullptr);
  for (std::size_t j = 0; j < ids; ++j) {
    auto item = parse_int64(args[first_id + j]);
    if (!item || *item < 1 || static_cast<std::size_t>(*item) > count) return bad();
    rid[static_cast<std::size_t>(*item) - 1] = &keys[count + j];
  }
  std::vector<Reply> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    auto amount = parse_int64(args[each ? 2 + i : 2]);
    if (!amount) return bad();
    out.push_back(incr_item(ks, keys[i], *amount, rid[i], *deadline));
  }
  return Reply::of_array(std::move(out));
}

// The typed twin: the same items with no text to format or parse.
Reply typed_fixed_window_incr(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& a) {
  const auto& c = static_cast<const IncrArgs&>(a);
  const std::size_t count = c.amounts.size();
  if (keys.size() != count + c.rid_items.size()) {
    return Reply::of_error("ERR fixed_window_incr: malformed arguments");
  }
  RidKeys rid;
  rid.assign(count, nullptr);
  for (std::size_t j = 0; j < c.rid_items.size(); ++j) {
    const std::int64_t item = c.rid_items[j];
    if (item < 1 || static_cast<std::size_t>(item) > count) {
      return Reply::of_error("ERR fixed_window_incr: malformed arguments");
    }
    rid[static_cast<std::size_t>(item) - 1] = &keys[count + j];
  }
  c.replies.clear();
  for (std::size_t i = 0; i < count; ++i) c.replies.push_back(incr_item(ks, keys[i], c.amounts[i], rid[i], c.deadline));
  c.answered = true;
  return Reply::of_status(std::string(kAnsweredInPlace));
}

// fixed_window_hit.lua on the memory store, for both twins: `out` gets the reply's integers.
void fixed_window_hit_core(Keyspace& ks, const std::vector<std::string>& keys, const HitArgs& call,
                           detail::Ints& out) {
  const std::size_t n = keys.size();
  out.assign(1 + n, 0);
  bool allowed = true;
  for (std::size_t i = 0; i < n; ++i) {
    auto v = ks.or_reset(keys[i], [&] { return ks.get(keys[i]); });
    auto c = v ? parse_int64(*v) : std::optional<std::int64_t>(0);
    if (!c) {  // a foreign value that is no number is garbage: start the window afresh
      ks.del(keys[i]);
      c = 0;
    }
    out[1 + i] = *c;
    if (exceeds(*c, call.cost, call.limits[i].amount)) allowed = false;
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (allowed) out[1 + i] = ks.incrby(keys[i], call.cost);
    ks.hold_expiry(keys[i], call.limits[i].expire_at);
  }
  out[0] = allowed ? 1 : 0;
}

// The memory store's twin of fixed_window_hit.lua; keep the two in step.
Reply native_fixed_window_hit(Keyspace& ks, const std::vector<std::string>& keys,
                              const std::vector<std::string>& args) {
  const std::size_t n = keys.size();
  if (args.size() != 1 + 2 * n) return Reply::of_error("ERR fixed_window_hit: malformed arguments");
  auto cost = parse_int64(args[0]);
  if (!cost) return Reply::of_error("ERR fixed_window_hit: malformed arguments");
  HitArgs call;
  call.cost = *cost;
  for (std::size_t i = 0; i < n; ++i) {
    auto limit = parse_int64(args[1 + 2 * i]);
    if (!limit) return Reply::of_error("ERR fixed_window_hit: malformed arguments");
    call.limits.push_back({*limit, parse_int64(args[2 + 2 * i]).value_or(0)});
  }
  detail::Ints out;
  fixed_window_hit_core(ks, keys, call, out);
  return detail::int_array(out);
}

// The typed twin: the same decision with no text to format or parse.
Reply typed_fixed_window_hit(Keyspace& ks, const std::vector<std::string>& keys, const ScriptArgs& args) {
  const auto& c = static_cast<const HitArgs&>(args);
  if (c.limits.size() != keys.size()) return Reply::of_error("ERR fixed_window_hit: malformed arguments");
  fixed_window_hit_core(ks, keys, c, c.ints);
  c.answered = true;
  return Reply::of_status(std::string(kAnsweredInPlace));
}

}  // namespace redcount::twins
