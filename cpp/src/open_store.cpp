// open_store(): the one place that knows every Store implementation. It sits above the
// layers (store/ declares it; memory/ and redis/ implement the stores it makes), so that
// nothing under store/ includes a concrete store.
#include "redcount/memory/memory_store.h"
#include "redcount/redis/redis_store.h"
#include "redcount/store/store.h"

namespace redcount {

std::shared_ptr<Store> open_store(const StoreOptions& options) {
  if (options.kind == StoreOptions::Kind::Memory) return std::make_shared<MemoryStore>(options);
  return std::make_shared<RedisStore>(options);
}

}  // namespace redcount
