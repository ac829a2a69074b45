#include "redcount/memory_store.h"
#include "redcount/redis_store.h"
#include "redcount/store.h"

namespace redcount {

std::shared_ptr<Store> open_store(const StoreOptions& options) {
  if (options.kind == StoreOptions::Kind::Memory) return std::make_shared<MemoryStore>(options);
  return std::make_shared<RedisStore>(options);
}

}  // namespace redcount
