// The memory store's native twins of pn_merge.lua (the PN-counter): the same reads and writes
// on the keyspace, in C++. Keep each in step with its Lua file; the parity tests run both
// against the same inputs.
#include <algorithm>
#include <map>
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

// The memory store's twin of pn_merge.lua; keep the two in step.
Reply native_pn_merge(Keyspace& ks, const std::vector<std::string>& keys, const std::vector<std::string>& args) {
  auto bad = [] { return Reply::of_error("ERR pn_merge: malformed arguments"); };
  if (keys.size() != 2 || args.size() % 3 != 0) return bad();
  std::vector<std::pair<int, std::string>> order;
  std::map<std::string, std::string> latest[2];
  for (std::size_t i = 0; i < args.size(); i += 3) {
    const std::string& region = args[i];
    for (int c = 0; c < 2; ++c) {
      const std::string& v = args[i + 1 + static_cast<std::size_t>(c)];
      if (!canonical_uint(v)) return bad();
      auto it = latest[c].find(region);
      std::optional<std::string> cur;
      if (it != latest[c].end()) {
        cur = it->second;
      } else {
        cur = ks.hget(keys[static_cast<std::size_t>(c)], region);
        if (cur && !canonical_uint(*cur)) {
          return Reply::of_error("ERR pn component is not a non-negative integer: " + keys[static_cast<std::size_t>(c)]);
        }
      }
      if (decimal_greater(v, cur ? std::string_view(*cur) : std::string_view("0"))) {
        if (it == latest[c].end()) order.emplace_back(c, region);
        latest[c][region] = v;
      }
    }
  }
  for (const auto& [c, region] : order) ks.hset(keys[static_cast<std::size_t>(c)], region, latest[c][region]);
  return Reply::of_integer(static_cast<std::int64_t>(order.size()));
}

}  // namespace redcount::twins
