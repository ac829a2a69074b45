#include "redcount/operation.h"

#include "redcount/errors.h"

namespace redcount {

void run_operation(Store& store, Operation& op) {
  std::vector<Request> batch = op.prepare();
  while (!batch.empty()) {
    std::vector<Reply> replies;
    try {
      replies = store.execute(batch);
    } catch (const Error&) {
      batch = op.fail(std::current_exception());
      continue;
    }
    batch = op.finish(std::move(replies));
  }
}

namespace {

// One step of an asynchronous run: submits `batch`, and from its completion either
// submits the next batch or calls done.
void step(std::shared_ptr<Store> store, std::shared_ptr<Operation> op, OperationDone done, CancelFlag cancelled,
          std::vector<Request> batch) {
  if (batch.empty()) return done(nullptr);
  Store& s = *store;
  s.submit(
      std::move(batch),
      [store = std::move(store), op = std::move(op), done = std::move(done), cancelled](
          std::vector<Reply>&& replies, std::exception_ptr error) mutable {
        std::vector<Request> next;
        try {
          next = error ? op->fail(error) : op->finish(std::move(replies));
        } catch (...) {
          return done(std::current_exception());
        }
        step(std::move(store), std::move(op), std::move(done), std::move(cancelled), std::move(next));
      },
      cancelled);
}

}  // namespace

void run_async(std::shared_ptr<Store> store, std::shared_ptr<Operation> op, OperationDone done, CancelFlag cancelled) {
  std::vector<Request> first;
  try {
    first = op->prepare();
  } catch (...) {
    return done(std::current_exception());
  }
  step(std::move(store), std::move(op), std::move(done), std::move(cancelled), std::move(first));
}

}  // namespace redcount
