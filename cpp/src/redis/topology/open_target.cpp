#include "redcount/redis/topology/open_target.h"

#include "redcount/redis/topology/cluster.h"
#include "redcount/redis/io/engine.h"
#include "redcount/redis/topology/master_follower.h"

namespace redcount::redis {

std::shared_ptr<Target> open_target(const StoreOptions& options) {
  if (options.cluster || !options.ring.empty()) return std::make_shared<Cluster>(options);
  if (options.sentinel) return std::make_shared<MasterFollower>(options);
  return std::make_shared<Engine>(options);
}

}  // namespace redcount::redis
