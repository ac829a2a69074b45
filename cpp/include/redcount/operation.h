// Sans-I/O operations: what a counter or limiter call asks of a store, with no I/O inside.
//
//   auto op = limiter.make_hit(limits, key, 1);      // validates the input; nothing sent yet
//   Decision d = run(*store, *op);                    // the synchronous driver
//   run_async(store, op, [op](std::exception_ptr e) { /* op->result() or e */ });
//
// An operation alternates two pure steps: prepare() returns the first batch of requests;
// finish(replies) consumes that batch's replies and returns the next batch, or an empty
// one when the operation is complete (then result() holds its outcome). Follow-up steps
// that belong to the operation (a commands-mode TTL repair, the server-clock probe and the
// rerun it decides) are such a next batch; a NOSCRIPT reload is the store's business and
// never reaches an operation. fail(error) is told of a transport failure of the last batch
// and may complete the operation anyway (the fixed-window counter's retry queue) or ask
// for another batch; by default it rethrows.
//
// Neither step knows which store runs it: the memory store and Redis get the same
// requests. Operations are used by one driver at a time (not thread-safe themselves).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "redcount/store.h"

namespace redcount {

class Operation {
 public:
  virtual ~Operation() = default;
  // The first batch. Throws InvalidArgument for bad input before anything is sent.
  virtual std::vector<Request> prepare() = 0;
  // The last batch's replies, in request order; returns the next batch or {} when done.
  // Throws the error the caller must see.
  virtual std::vector<Request> finish(std::vector<Reply> replies) = 0;
  // The last batch failed in transport (ConnectionError, TimeoutError, Cancelled...):
  // returns the next batch, or {} when the operation completed anyway. Default: rethrow.
  virtual std::vector<Request> fail(std::exception_ptr error) { std::rethrow_exception(error); }
};

// An operation with a typed outcome, set by complete() before finish() returns {}.
template <class T>
class Op : public Operation {
 public:
  using Result = T;
  bool done() const noexcept { return result_.has_value(); }
  T& result() { return *result_; }
  T take() { return std::move(*result_); }

 protected:
  void complete(T value) { result_ = std::move(value); }

 private:
  std::optional<T> result_;
};

// Raw commands as an operation: the replies, error replies included, in order.
class CommandsOp final : public Op<std::vector<Reply>> {
 public:
  explicit CommandsOp(std::vector<Request> batch) : batch_(std::move(batch)) {}
  std::vector<Request> prepare() override { return std::move(batch_); }
  std::vector<Request> finish(std::vector<Reply> replies) override {
    complete(std::move(replies));
    return {};
  }

 private:
  std::vector<Request> batch_;
};

// Runs `op` to completion on `store`, blocking the calling thread.
void run_operation(Store& store, Operation& op);

template <class O>
typename O::Result run(Store& store, O& op) {
  run_operation(store, op);
  return op.take();
}

// Runs `op` on `store` without blocking: every batch goes through Store::submit, and
// `done(nullptr)` (complete) or `done(error)` is called exactly once, on the store's I/O
// thread or on the calling thread (memory store). `op` is kept alive until then. With
// `cancelled` set, batches not yet sent are dropped and done(Cancelled) is called.
using OperationDone = std::function<void(std::exception_ptr error)>;
void run_async(std::shared_ptr<Store> store, std::shared_ptr<Operation> op, OperationDone done,
               CancelFlag cancelled = nullptr);

}  // namespace redcount
