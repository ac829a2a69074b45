// The memory store's native twins of lease_take.lua and lease_give_back.lua (leased
// fixed-window and approximate sliding-window limits): the same reads and writes on the keyspace, in C++. Keep each in step
// with its Lua file; the parity tests run both against the same inputs.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memory/twins/twins.h"
#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "store/script_args.h"

namespace redcount::twins {
namespace {

// A window key's count; nullopt for a foreign value (another type, or no number).
std::optional<std::int64_t> count_of(Keyspace& ks, const std::string& key) {
  try {
    auto v = ks.get(key);
    return v ? parse_int64(*v) : std::optional<std::int64_t>(0);
  } catch (const ReplyError&) {
    return std::nullopt;
  }
}

}  // namespace

Reply native_lease_take(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  const std::size_t n = keys.size();
  if (args.size() != 2 + 2 * n) return detail::malformed("lease_take");
  auto least = parse_int64(args[0]);
  auto most = parse_int64(args[1]);
  if (!least || !most) return detail::malformed("lease_take");
  std::vector<std::int64_t> limits(n), expire_at(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto l = parse_int64(args[2 + 2 * i]);
    auto e = parse_int64(args[3 + 2 * i]);
    if (!l || !e) return detail::malformed("lease_take");
    limits[i] = *l;
    expire_at[i] = *e;
  }
  detail::Ints out;
  out.assign(1 + n, 0);
  std::optional<std::int64_t> remaining;
  for (std::size_t i = 0; i < n; ++i) {
    auto c = count_of(ks, keys[i]);
    if (!c) {  // garbage: start the window afresh
      ks.del(keys[i]);
      c = 0;
    }
    out[1 + i] = *c;
    std::int64_t left = 0;  // as Lua's doubles do, a difference past int64 saturates
    if (__builtin_sub_overflow(limits[i], *c, &left)) left = *c < 0 ? INT64_MAX : INT64_MIN;
    if (!remaining || left < *remaining) remaining = left;
  }
  std::int64_t granted = 0;
  if (remaining && *remaining >= *least) {
    // floor(remaining / 2) for a negative remaining cannot happen here: remaining >= least
    // and the caller's least is >= 1.
    granted = std::max(std::min(*most, *remaining / 2), *least);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (granted > 0) out[1 + i] = ks.incrby(keys[i], granted);
    ks.hold_expiry(keys[i], expire_at[i]);
  }
  out[0] = granted;
  return detail::int_array(out);
}

Reply native_lease_give_back(Keyspace& ks, const std::vector<std::string>& keys,
                             const std::vector<std::string>& args) {
  // One field per key: the hashes of the approximate sliding window; else window keys.
  const bool fields = !keys.empty() && args.size() == keys.size() + 1;
  if (args.size() != 1 && !fields) return detail::malformed("lease_give_back");
  auto units = parse_int64(args[0]);
  if (!units || *units < 0) return detail::malformed("lease_give_back");
  std::int64_t first = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::optional<std::int64_t> c;
    if (fields) {
      try {
        auto v = ks.hget(keys[i], args[i + 1]);
        if (v) c = parse_int64(*v);
      } catch (const ReplyError&) {
        // another type: nothing to give back to
      }
    } else {
      c = count_of(ks, keys[i]);
    }
    std::int64_t take = 0;
    if (c && *c > 0) {
      take = std::min(*units, *c);
      if (fields) {
        ks.hincrby(keys[i], args[i + 1], -take);
      } else {
        ks.incrby(keys[i], -take);
      }
    }
    if (i == 0) first = take;
  }
  return Reply::of_integer(first);
}

}  // namespace redcount::twins
