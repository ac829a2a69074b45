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
//
// Naming: every public operation is built by a factory named `make_<method>` after the
// synchronous method it backs, with the same arguments, and the method is
// `return run(*store_, *make_<method>(...))`:
//   FixedWindowCounter    make_incr, make_incr_many, make_get, make_get_many, make_pttl
//   LimiterStrategy       make_hit, make_test, make_stats, make_reset, make_acquire,
//                         make_release, make_in_flight
//   SlidingWindowCounter  make_add, make_count, make_add_unique, make_count_unique, make_clear
// Factories validate their input (InvalidArgument) before anything is sent, may be called
// from any thread, and return an operation that owns copies of everything it needs, so it
// may outlive the caller's stack frame and the object that made it. An operation with no
// result value is an Op<std::monostate>.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "redcount/common/metrics.h"
#include "redcount/store/store.h"

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

  // What the drivers count this operation as in metrics_counts() (set by its factory),
  // and how many increments or reads it carries.
  Meter meter = Meter::None;
  std::uint32_t meter_items = 1;
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

// One batch, then `finish(std::vector<Reply>&&) -> T` on its replies: the shape of most
// reads (GET, PTTL, DEL). `finish` is stored in the operation, so it must own what it
// captures.
template <class T, class Finish>
class BatchOp final : public Op<T> {
 public:
  BatchOp(std::vector<Request> batch, Finish finish) : batch_(std::move(batch)), finish_(std::move(finish)) {}
  std::vector<Request> prepare() override { return std::move(batch_); }
  std::vector<Request> finish(std::vector<Reply> replies) override {
    this->complete(finish_(std::move(replies)));
    return {};
  }

 private:
  std::vector<Request> batch_;
  Finish finish_;
};

template <class T, class Finish>
std::shared_ptr<Op<T>> make_batch_op(std::vector<Request> batch, Finish finish) {
  return std::make_shared<BatchOp<T, Finish>>(std::move(batch), std::move(finish));
}

// `op` marked for the metrics (see metrics.h): `return with_meter(make_batch_op<T>(...), Meter::Read);`
template <class P>
P with_meter(P op, Meter meter, std::size_t items = 1) {
  op->meter = meter;
  op->meter_items = static_cast<std::uint32_t>(items);
  return op;
}

namespace detail {
// DEL of `keys` as an operation (a counter's or limiter's reset).
std::shared_ptr<Op<std::monostate>> make_delete(std::vector<std::string> keys);
}  // namespace detail

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
