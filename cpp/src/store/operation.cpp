#include "redcount/store/operation.h"

#include "redcount/common/errors.h"

namespace redcount {
namespace {

// For a store that reads only text ARGV: typed script arguments rendered in place.
void render_typed(const Store& store, std::vector<Request>& batch) {
  if (store.accepts_typed_args()) return;
  for (Request& r : batch) {
    if (auto* call = std::get_if<ScriptCall>(&r); call && call->typed && call->args.empty()) {
      call->args = call->typed->render();
      call->typed.reset();
    }
  }
}

}  // namespace

// Runs the operation without counting it in the metrics.
static void run_unmetered(Store& store, Operation& op);

void run_operation(Store& store, Operation& op) {
  if (op.meter != Meter::None) {
    try {
      run_unmetered(store, op);
    } catch (const InvalidArgument&) {
      throw;  // the caller's mistake, not a failed write: the store was never asked
    } catch (...) {
      detail::count_operation(op.meter, op.meter_items, false);
      throw;
    }
    detail::count_operation(op.meter, op.meter_items, true);
    return;
  }
  run_unmetered(store, op);
}

void run_unmetered(Store& store, Operation& op) {
  std::vector<Request> batch = op.prepare();
  while (!batch.empty()) {
    render_typed(store, batch);
    std::vector<Reply> replies;
    try {
      replies = store.execute_owned(std::move(batch));
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
  render_typed(s, batch);
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
  if (op->meter != Meter::None) {
    done = [meter = op->meter, items = op->meter_items, inner = std::move(done)](std::exception_ptr error) {
      bool bad_input = false;
      if (error) {
        try {
          std::rethrow_exception(error);
        } catch (const InvalidArgument&) {
          bad_input = true;
        } catch (...) {
        }
      }
      if (!bad_input) detail::count_operation(meter, items, !error);
      inner(error);
    };
  }
  std::vector<Request> first;
  try {
    first = op->prepare();
  } catch (...) {
    return done(std::current_exception());
  }
  step(std::move(store), std::move(op), std::move(done), std::move(cancelled), std::move(first));
}

namespace detail {

std::shared_ptr<Op<std::monostate>> make_delete(std::vector<std::string> keys) {
  Command del{{"DEL"}};
  for (auto& k : keys) del.args.push_back(std::move(k));
  std::vector<Request> batch;
  batch.emplace_back(std::move(del));
  return make_batch_op<std::monostate>(std::move(batch), [](std::vector<Reply>&& replies) {
    for (const Reply& r : replies) r.check();
    return std::monostate{};
  });
}

}  // namespace detail
}  // namespace redcount
