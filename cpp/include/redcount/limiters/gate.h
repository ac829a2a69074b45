// A penalty's block check folded into a limiter decision's own round trip.
//
//   auto op = make_gated(limiter->make_hit(limits, key, 1), {"redcount:lim:pen:{ip:1.2.3.4}:b"});
//   Gated g = run(*store, *op);
//   if (g.blocked_ms > 0) ...  // blocked: nothing was read or charged
//   else use(*g.decision);
//
// The hit scripts (fixed_window_hit, sliding_log, sliding_approx, token_bucket, gcra and
// their native twins) take block keys after their own keys, flagged by a last argument
// "gate:<n>": while a block key lives they change nothing and reply {-1, its PTTL}, so the
// check and the decision are one atomic script call. A batch that carries no such script
// (fixed-window test reads with GET) gets a PTTL of each block key in front, in the same
// round trip (a read next to reads). The block keys must be in the slot of the script's
// keys (on a single server any keys are).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "redcount/limiters/limiter.h"
#include "redcount/store/operation.h"

namespace redcount {

struct Gated {
  std::optional<Decision> decision;  // the decision, when no block was in force
  std::int64_t blocked_ms = 0;       // > 0: the longest block in force, in ms (nothing decided)
};

// `decision` (a hit, test, hit_all or test_all operation) behind the block keys `gates`.
// Throws InvalidArgument when `gates` is empty.
std::shared_ptr<Op<Gated>> make_gated(std::shared_ptr<Op<Decision>> decision, std::vector<std::string> gates);

}  // namespace redcount
