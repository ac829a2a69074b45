// The one place that turns a store's options into the topology that serves them:
//
//   auto target = redis::open_target(parse_url("redis+sentinel://s1:26379/cache"));
//
// - a cluster (redis+cluster://) or a client-side ring (StoreOptions::ring): a Cluster
//   router (topology/cluster.h), whose ring members are opened here too;
// - a Sentinel group (redis+sentinel://): a MasterFollower (topology/master_follower.h);
// - anything else: one server's Engine (io/engine.h).
// Validates the options; connects to nothing yet.
#pragma once

#include <memory>

#include "redcount/common/options.h"
#include "redcount/redis/io/target.h"

namespace redcount::redis {

std::shared_ptr<Target> open_target(const StoreOptions& options);

}  // namespace redcount::redis
