// The memory store's native twin of penalty.lua (escalating penalties): the same reads and
// writes on the keyspace, in C++. Keep the two in step; the parity tests run both against
// the same inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memory/twins/twins.h"
#include "redcount/common/errors.h"

namespace redcount::twins {

namespace {

std::optional<double> number(const std::string& s) {
  if (s.empty()) return std::nullopt;
  try {
    std::size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v)) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// SET key value PX ms (overwriting, as the script does).
void set_px(Keyspace& ks, const std::string& key, std::int64_t value, std::int64_t ms) {
  ks.del(key);
  ks.set_nx_pxat(key, std::to_string(value), ks.now_ms() + ms);
}

}  // namespace

Reply native_penalty(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  auto bad = [] { return Reply::of_error("ERR penalty: malformed arguments"); };
  if (keys.size() != 3 || args.size() != 5) return bad();
  const auto after = number(args[0]), within = number(args[1]), block = number(args[2]);
  const auto factor = number(args[3]), max = number(args[4]);
  // Spans are whole ms up to 2^42 (about 139 years), so every sum below stays exact.
  auto span = [](const std::optional<double>& x) {
    return x && *x >= 1 && *x <= 4398046511104.0 && std::floor(*x) == *x;
  };
  if (!after || !span(within) || !span(block) || !factor || !span(max) || *after < 1 || *factor < 1 ||
      *factor > 1e6 || *max < *block) {
    return bad();
  }
  // Arguments first, then the block: a malformed call is refused whether or not one is in force.
  const std::int64_t left = ks.pttl(keys[0]);
  if (left > 0) return Reply::of_array({Reply::of_integer(left), Reply::of_integer(0)});
  const auto within_ms = static_cast<std::int64_t>(*within);
  ks.set_nx_pxat(keys[1], "0", ks.now_ms() + within_ms);
  const std::int64_t n = ks.incrby(keys[1], 1);
  if (static_cast<double>(n) < *after) return Reply::of_array({Reply::of_integer(0), Reply::of_integer(0)});
  double len = *block;
  if (const auto raw = ks.get(keys[2])) {
    // A last length that is no length (a foreign value below 1 ms) starts again from `block`.
    if (const auto last = number(*raw); last && *last >= 1) len = std::min(std::floor(*last * *factor), *max);
  }
  const auto ms = static_cast<std::int64_t>(len);
  set_px(ks, keys[0], ms, ms);
  set_px(ks, keys[2], ms, ms + within_ms);
  ks.del(keys[1]);
  return Reply::of_array({Reply::of_integer(ms), Reply::of_integer(1)});
}

}  // namespace redcount::twins
