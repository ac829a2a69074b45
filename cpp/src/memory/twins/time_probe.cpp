// The memory store's native twins of time_probe.lua (the server-clock probe): the same reads
// and writes on the keyspace, in C++. Keep each in step with its Lua file; the parity tests
// run both against the same inputs.
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

Reply native_time_probe(Keyspace& ks, const std::vector<std::string>&, const std::vector<std::string>&) {
  const std::int64_t now = ks.now_ms();
  return Reply::of_array({Reply::of_integer(now / 1000), Reply::of_integer((now % 1000) * 1000)});
}

}  // namespace redcount::twins
