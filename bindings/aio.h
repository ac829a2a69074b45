// The asyncio completion runtime of the bindings: operations completed into an asyncio event
// loop without a Python thread per call and without one loop wake-up per reply. aio.cpp
// implements it; register_aio.cpp binds what Python calls.
//
// Binding one operation asynchronously is one call to submit_async():
//
//   .def("hit_async", [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost) {
//     auto limits = h.limits(limit);                       // convert arguments first (GIL held)
//     auto op = h.strategy->make_hit(limits->limits, text_arg(key, "key"), int_arg(cost, "cost"));
//     return aio::submit_async(h.store, std::move(op), [](Decision& d) { return py::cast(d); });
//   })
//
// and the Python side awaits what it returns when it is a future:
//
//   r = core.hit_async(limit, key, cost)
//   return (await r) if r.__class__ is _OpFuture else r
//
// submit_async() runs the operation with run_async(). When it completes before run_async()
// returns (the memory store, an error known at once, a store without an engine), the result
// is returned as is (or the error raised): no future, no loop round. Otherwise it returns a
// future of the running loop (redcount.aio._OpFuture); the store's I/O thread later pushes
// the completion to that loop's CompletionQueue without taking the GIL, and the loop drains
// the whole queue in one callback. Cancelling the future sets the operation's CancelFlag: a
// batch not yet written is dropped, a late reply discarded.
//
// Lifetimes. The garbage collector cannot see a reference held in C++, so none may close a
// cycle through the loop. A call in flight holds its future (and through it the loop, as
// asyncio's own I/O waits do) only until the future is cancelled or the queue closed; it
// holds its queue only weakly, so a late completion whose loop is gone is dropped. A loop's
// queue lives as long as the loop (redcount.aio keeps it in a WeakKeyDictionary) and is
// closed once the loop is: what it still holds is released then.
//
// `convert` turns the operation's result into a Python object; it runs with the GIL held on
// the loop's thread, may throw (a C++ error becomes the matching redcount exception), and
// must not capture Python objects (it may be destroyed on the store's I/O thread). What it
// needs from Python (e.g. incr_many's original key objects) goes in `context`, which it gets
// as a second argument: (T&, py::handle context) -> py::object.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"
#include "redcount/store/operation.h"
#include "redcount/store/store.h"

namespace redcount::bind::aio {

class CompletionQueue;

// One asynchronous call in flight: the operation's outcome and the future that awaits it.
class Completion {
 public:
  virtual ~Completion();
  // The operation's result as a Python object (GIL held); throws what the caller must see.
  virtual py::object result() = 0;

  std::exception_ptr error;
  CancelFlag cancelled = std::make_shared<std::atomic<bool>>(false);

  // GIL held: lets go of the future and the context, once the outcome will not be delivered
  // (the future was cancelled, or its loop closed).
  void release_python();

 protected:
  PyObject* context_ = nullptr;  // owned; released with the GIL held once the call settles

 private:
  friend py::object start(std::shared_ptr<Store> store, std::shared_ptr<Operation> op,
                          std::shared_ptr<Completion> c);
  friend class CompletionQueue;
  static void on_done(const std::shared_ptr<Completion>& c, std::exception_ptr e);
  py::object settle_inline();  // GIL held: the result or the error; releases the context

  enum : int { kSubmitting = 0, kInline = 1, kDetached = 2 };
  std::atomic<int> state_{kSubmitting};
  std::weak_ptr<CompletionQueue> queue_;  // set before detaching; gone with the loop
  PyObject* future_ = nullptr;            // owned while detached; released by the drain, a
                                          // cancel or the queue's close (GIL held)
};

// One event loop's queue of finished calls. push() may be called from any thread and never
// takes the GIL: it writes the eventfd only when the queue goes from empty to non-empty. The
// loop watches fd() (loop.add_reader); where it has no add_reader, a Python thread of
// redcount.aio waits on fd() and schedules drain() with loop.call_soon_threadsafe. drain()
// runs on the loop's thread with the GIL held. Thread-safe.
class CompletionQueue : public std::enable_shared_from_this<CompletionQueue> {
 public:
  explicit CompletionQueue(py::handle loop);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  int fd() const noexcept { return read_fd_; }
  void use_call_soon_threadsafe();  // GIL held
  // At most this many completions are delivered per drain; the rest in a later one, scheduled
  // with loop.call_soon, so timers and other tasks are not held up behind a burst.
  static constexpr std::size_t kMaxPerDrain = 8;
  bool uses_call_soon_threadsafe() const noexcept { return call_soon_.load(); }
  py::object new_future();  // GIL held
  void push(std::shared_ptr<Completion> c);
  void drain();  // GIL held, on the loop's thread
  // GIL held, once the loop is closed (it never drains again): releases the futures of the
  // calls still in flight for it and of those already queued; later completions are
  // dropped. The fds are closed with the queue.
  void close();
  bool closed() const noexcept { return closed_.load(); }

  // Debug counters: signals sent (eventfd writes), drains that
  // found work, and completions delivered through the queue.
  std::uint64_t signals() const noexcept { return signals_.load(); }
  std::uint64_t wakeups() const noexcept { return wakeups_.load(); }
  std::uint64_t delivered() const noexcept { return delivered_.load(); }

 private:
  void signal();
  // Completes c's future. With `wake_now`, a future whose only callback is the awaiting
  // task's wake-up has it returned (with its context) instead of scheduled: drain() runs it
  // at once, sparing a loop.call_soon and a loop iteration per operation.
  struct Wake {
    py::object callback, context, future;
  };
  Wake deliver(Completion& c, bool wake_now);
  py::handle drain_callable();  // GIL held: drain() as a Python callable (created once)

  std::mutex mu_;
  std::vector<std::shared_ptr<Completion>> items_;
  int read_fd_ = -1;
  int write_fd_ = -1;  // == read_fd_ for an eventfd
  std::atomic<bool> call_soon_{false};
  std::atomic<bool> closed_{false};
  PyObject* loop_ref_ = nullptr;  // a weak reference to the loop (owned)
  PyObject* drain_fn_ = nullptr;  // drain() for loop.call_soon; holds only a weak_ptr to this
  std::atomic<std::uint64_t> signals_{0};
  std::atomic<std::uint64_t> wakeups_{0};
  std::atomic<std::uint64_t> delivered_{0};
};

// redcount.aio's hooks, installed once at its import (_core._aio_setup): `future_type` is
// the future class to make (redcount.aio._OpFuture, an asyncio.Future subclass), which
// gets an add_done_callback of ours (a C method: asyncio's, noting what was added, so that
// a drain can run the awaiting task's wake-up itself), and `queue_provider` returns the
// running loop's CompletionQueue.
void setup(py::handle future_type, py::handle queue_provider);
// Cancels the operation behind `future` (_OpFuture.cancel); false if it has none (any more).
bool cancel(py::handle future);
// Futures still waiting for an operation (for the tests: none may be left behind).
std::size_t inflight_count();
// Whether this thread may touch Python objects now (a late completion may end on an I/O
// thread, whose references are then released by a pending call on the main thread; during
// interpreter exit they are left).
bool gil_held_and_alive();

// Runs `op` on `store` for the completion `c` (see submit_async).
py::object start(std::shared_ptr<Store> store, std::shared_ptr<Operation> op, std::shared_ptr<Completion> c);

template <class OpT, class Convert>
class OpCompletion final : public Completion {
 public:
  OpCompletion(std::shared_ptr<OpT> op, Convert convert, py::object context)
      : op_(std::move(op)), convert_(std::move(convert)) {
    if (context) context_ = context.release().ptr();
  }
  py::object result() override {
    using T = typename OpT::Result;
    if constexpr (std::is_invocable_v<Convert&, T&, py::handle>) {
      return py::object(convert_(op_->result(), py::handle(context_ != nullptr ? context_ : Py_None)));
    } else {
      return py::object(convert_(op_->result()));
    }
  }

 private:
  std::shared_ptr<OpT> op_;
  Convert convert_;
};

// See the top of this file. OpT is an Op<T>; convert: (T&) -> py::object, or
// (T&, py::handle context) -> py::object.
template <class OpT, class Convert>
py::object submit_async(std::shared_ptr<Store> store, std::shared_ptr<OpT> op, Convert convert,
                        py::object context = py::object()) {
  static_assert(std::is_base_of_v<Operation, OpT>, "submit_async runs an Operation");
  auto c = std::make_shared<OpCompletion<OpT, Convert>>(op, std::move(convert), std::move(context));
  return start(std::move(store), std::move(op), std::move(c));
}

}  // namespace redcount::bind::aio
