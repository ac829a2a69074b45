#include "redcount/store/store.h"

#include "redcount/common/errors.h"

namespace redcount {

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
