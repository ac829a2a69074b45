#include "redcount/store/store.h"

#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "redcount/redis/redis_store.h"

namespace redcount {

std::shared_ptr<Store> open_store(const StoreOptions& options) {
  if (options.kind == StoreOptions::Kind::Memory) return std::make_shared<MemoryStore>(options);
  return std::make_shared<RedisStore>(options);
}

void Store::submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) {
  if (cancelled && cancelled->load()) return done({}, std::make_exception_ptr(Cancelled("cancelled before it was sent")));
  std::vector<Reply> replies;
  try {
    replies = execute(batch);
  } catch (...) {
    return done({}, std::current_exception());
  }
  done(std::move(replies), nullptr);
}

}  // namespace redcount
