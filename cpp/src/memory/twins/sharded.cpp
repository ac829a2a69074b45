// The memory store's native twins of sharded_incr.lua, sharded_claim.lua, sharded_reshard.lua (the sharded
// counter) and quota.lua: the same reads and writes on the keyspace, in C++. Keep each in step
// with its Lua file; the parity tests run both against the same inputs.
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

// The memory store's twin of sharded_incr.lua; keep the two in step.
Reply native_sharded_incr(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  auto bad = [] { return Reply::of_error("ERR sharded_incr: malformed arguments"); };
  if (args.size() < 3) return bad();
  auto n = parse_int64(args[0]);
  auto ttl = parse_int64(args[1]);
  auto maxlen = parse_int64(args[2]);
  if (!n || !ttl || !maxlen || *n < 0 || *ttl < 1 || *maxlen < 0 || args.size() < 4) return bad();
  if (!detail::deadline_after(ks.now_ms(), *ttl)) return bad();
  const auto count = static_cast<std::size_t>(*n);
  const bool wide = args[3] == "4";
  if (!wide && args[3] != "2") return bad();
  const std::size_t per = wide ? 4 : 2;
  if (args.size() != 4 + per * count) return bad();
  static const std::string kNoReason;
  std::vector<Reply> out;
  out.reserve(count);
  std::size_t k = 0;
  std::vector<const std::string*> ids;
  auto forget = [&] {
    for (const std::string* id : ids) ks.del(*id);
  };
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t a = 4 + per * i;
    const std::string& amount_text = args[a];
    const std::string& rid = args[a + 1];
    auto extra = wide ? parse_int64(args[a + 2]) : std::optional<std::int64_t>(0);
    const std::string& reason = wide ? args[a + 3] : kNoReason;
    if (!extra || *extra < 0) return bad();
    const std::size_t nids = rid.empty() ? 0 : 1 + static_cast<std::size_t>(*extra);
    if (k + 2 + nids > keys.size()) return bad();
    const std::string& value = keys[k];
    const std::string& log = keys[k + 1];
    ids.clear();
    for (std::size_t j = 0; j < nids; ++j) ids.push_back(&keys[k + 2 + j]);
    k += 2 + nids;
    bool seen = false, claimed = false;
    // A key holding the claim marker (sharded_claim.lua): GET errs on a key of another type
    // (pcall in the script), which counts as seen, not as the marker.
    auto is_marker = [&](const std::string& key) {
      try {
        return ks.get(key) == std::optional<std::string>("n");
      } catch (const ReplyError&) {
        return false;
      }
    };
    if (!ids.empty()) {
      const std::int64_t until = ks.now_ms() + *ttl;
      if (!ks.set_nx_pxat(*ids[0], "1", until)) {
        claimed = is_marker(*ids[0]);
        seen = !claimed;
      } else {
        for (std::size_t j = 1; j < ids.size(); ++j) seen = (ks.exists(*ids[j]) && !is_marker(*ids[j])) || seen;
        if (seen) {
          ks.del(*ids[0]);
        } else {
          for (std::size_t j = 1; j < ids.size(); ++j) {
            ks.del(*ids[j]);  // SET without NX replaces a value of any type, as here
            ks.set_nx_pxat(*ids[j], "1", until);
          }
        }
      }
    }
    if (claimed || seen) {
      out.push_back(Reply::of_integer(claimed ? -1 : 0));
      continue;
    }
    auto amount = parse_int64(amount_text);
    if (!amount) {
      forget();
      out.push_back(Reply::of_error("ERR value is not an integer or out of range"));
      continue;
    }
    try {
      ks.incrby(value, *amount);
    } catch (const ReplyError& e) {
      forget();
      out.push_back(Reply::of_error(e.what()));
      continue;
    }
    try {
      std::vector<std::pair<std::string, std::string>> fields{{"delta", amount_text}, {"request_id", rid}};
      if (!reason.empty()) fields.emplace_back("reason", reason);
      ks.xadd(log, fields, *maxlen);
    } catch (const ReplyError& e) {
      ks.incrby(value, -*amount);  // the log refused it: the value must not keep it either
      forget();
      out.push_back(Reply::of_error(e.what()));
      continue;
    }
    out.push_back(Reply::of_integer(1));
  }
  return Reply::of_array(std::move(out));
}

// The memory store's twin of sharded_claim.lua; keep the two in step.
Reply native_sharded_claim(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  if (args.size() != 1) return Reply::of_error("ERR sharded_claim: malformed arguments");
  auto ttl = parse_int64(args[0]);
  const auto deadline = ttl && *ttl >= 1 ? detail::deadline_after(ks.now_ms(), *ttl) : std::nullopt;
  if (!deadline) return Reply::of_error("ERR sharded_claim: malformed arguments");
  const std::int64_t until = *deadline;
  std::vector<Reply> out;
  out.reserve(keys.size());
  for (const auto& key : keys) {
    const std::optional<std::string> v = ks.get(key);  // WRONGTYPE propagates, as in the script
    if (v && *v != "n") {
      out.push_back(Reply::of_integer(1));
    } else {
      ks.del(key);
      ks.set_nx_pxat(key, "n", until);
      out.push_back(Reply::of_integer(0));
    }
  }
  return Reply::of_array(std::move(out));
}

// The memory store's twin of sharded_reshard.lua.
Reply native_sharded_reshard(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  if (keys.size() != 1 || args.size() != 2) return Reply::of_error("ERR sharded_reshard: malformed arguments");
  const std::string cur = ks.get(keys[0]).value_or(std::string());
  std::vector<Reply> out;
  if (cur != args[0]) {
    out.push_back(Reply::of_integer(0));
    out.push_back(Reply::of_string(cur));
    return Reply::of_array(std::move(out));
  }
  ks.del(keys[0]);
  ks.set_nx_pxat(keys[0], args[1], 0);
  out.push_back(Reply::of_integer(1));
  out.push_back(Reply::of_string(args[1]));
  return Reply::of_array(std::move(out));
}

// The memory store's twin of quota.lua; keep the two in step.
Reply native_quota(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  auto bad = [] { return Reply::of_error("ERR quota: malformed arguments"); };
  if (keys.empty() || keys.size() > 2 || (args.size() != 5 && args.size() != 7)) return bad();
  // A quota reset by a calendar: the value its period starts at, and the key's deadline.
  std::optional<std::int64_t> start, expire_at;
  if (args.size() == 7) {
    start = parse_int64(args[5]);
    expire_at = parse_int64(args[6]);
    if (!start || !expire_at || *start > kMaxQuota || *start < -kMaxQuota) return bad();
  }
  auto n = parse_int64(args[1]);
  auto floor = parse_int64(args[2]);
  auto ceiling = parse_int64(args[3]);
  if (!n || !floor || !ceiling || (args[0] != "take" && args[0] != "give")) return bad();
  // What the client sends is within +-(2^53 - 1); anything else could overflow below.
  for (auto v : {*n, *floor, *ceiling}) {
    if (v > kMaxQuota || v < -kMaxQuota) return bad();
  }
  // The id's deadline is checked before anything is written.
  std::optional<std::int64_t> rid_deadline;
  if (keys.size() == 2) {
    auto ttl = parse_int64(args[4]);
    rid_deadline = ttl && *ttl >= 1 ? detail::deadline_after(ks.now_ms(), *ttl) : std::nullopt;
    if (!rid_deadline) return bad();
  }
  const std::string& key = keys[0];
  std::int64_t cur = start.value_or(0);
  const bool exists = !start || ks.exists(key);  // only a reset quota needs to know
  if (auto raw = ks.get(key)) {
    auto parsed = parse_int64(*raw);
    if (!parsed || *parsed > kMaxQuota || *parsed < -kMaxQuota) return Reply::of_error("ERR quota value is not an integer: " + key);
    cur = *parsed;
  }
  auto reply = [](std::int64_t applied, std::int64_t value, std::int64_t duplicate) {
    return Reply::of_array({Reply::of_integer(applied), Reply::of_integer(value), Reply::of_integer(duplicate)});
  };
  const std::string* rid = keys.size() == 2 ? &keys[1] : nullptr;
  if (rid && ks.exists(*rid)) return reply(1, cur, 1);
  // Amounts and bounds are within +-(2^53 - 1) (checked above), so no overflow.
  const bool take = args[0] == "take";
  const std::int64_t after = take ? cur - *n : cur + *n;
  if (take ? after < *floor : after > *ceiling) return reply(0, cur, 0);
  if (!exists && start) {
    ks.set_nx_pxat(key, std::to_string(after), *expire_at);
  } else {
    ks.incrby(key, take ? -*n : *n);
    if (expire_at) ks.pexpireat(key, *expire_at);
  }
  if (rid) {
    ks.del(*rid);
    ks.set_nx_pxat(*rid, "1", *rid_deadline);
  }
  return reply(1, after, 0);
}

}  // namespace redcount::twins
