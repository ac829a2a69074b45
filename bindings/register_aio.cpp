// Native asyncio: the per-loop CompletionQueue, submit_async's driver (see aio.h), the
// store-level async calls (execute_async, execute_many_async, ping_async) and, for tests,
// a store that completes batches on a worker thread.
#include <fcntl.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/eventfd.h>
#endif

#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>

#include "aio.h"
#include "redcount/common/errors.h"

namespace redcount::bind::aio {
namespace {

// Set once by redcount.aio at import (_aio_setup) and kept for the life of the process.
PyObject* g_future_type = nullptr;     // redcount.aio._OpFuture
PyObject* g_queue_provider = nullptr;  // redcount.aio._queue_for_running_loop
PyObject* g_get_running_loop = nullptr;  // asyncio.get_running_loop

// Names and argument tuples of the per-call Python calls, made once (interned) and kept for
// the life of the process: these calls run once per awaited operation.
struct Names {
  PyObject* done = PyUnicode_InternFromString("done");
  PyObject* set_result = PyUnicode_InternFromString("set_result");
  PyObject* set_exception = PyUnicode_InternFromString("set_exception");
  PyObject* loop_kwnames = Py_BuildValue("(s)", "loop");
  PyObject* callbacks = PyUnicode_InternFromString("_callbacks");
  PyObject* remove_done_callback = PyUnicode_InternFromString("remove_done_callback");
  PyObject* run = PyUnicode_InternFromString("run");
};
const Names& names() {
  static const Names* n = new Names();  // GIL held; never destroyed (used during interpreter exit)
  return *n;
}

// The queue of the loop last asked for (GIL held): most processes run one loop, and this
// spares a Python call per operation. A weak reference, so a new loop at the dead one's
// address is never taken for it.
PyObject* g_last_loop = nullptr;  // weakref, owned
std::weak_ptr<CompletionQueue>* g_last_queue = nullptr;  // the loop's dict in redcount.aio owns it

// Futures awaiting an operation, with the flag that cancels it (for _OpFuture.cancel).
// Touched only with the GIL held. Never destroyed: it may be used during interpreter exit.
std::unordered_map<PyObject*, CancelFlag>& inflight() {
  static auto* futures = new std::unordered_map<PyObject*, CancelFlag>();
  return *futures;
}

// Whether this thread may touch Python objects now (a late completion may end on an I/O
// thread, or during interpreter exit, where references are leaked instead of released).
bool gil_held_and_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing() != 0;
#else
  const bool finalizing = _Py_IsFinalizing() != 0;
#endif
  return Py_IsInitialized() != 0 && !finalizing && PyGILState_Check() != 0;
}

bool interpreter_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() != 0 && Py_IsFinalizing() == 0;
#else
  return Py_IsInitialized() != 0 && _Py_IsFinalizing() == 0;
#endif
}

std::shared_ptr<CompletionQueue> queue_for_running_loop() {
  if (g_queue_provider == nullptr || g_get_running_loop == nullptr) {
    throw py::import_error("the *_async functions of redcount._core need redcount.aio: import redcount.aio first");
  }
  // Raises RuntimeError outside a running loop, before anything is sent.
  py::object loop = py::reinterpret_steal<py::object>(PyObject_CallNoArgs(g_get_running_loop));
  if (!loop) throw py::error_already_set();
  if (g_last_loop != nullptr && PyWeakref_GetObject(g_last_loop) == loop.ptr()) {
    if (auto q = g_last_queue->lock()) return q;
  }
  py::object q = py::handle(g_queue_provider)();  // makes and registers the loop's queue once
  auto queue = q.cast<std::shared_ptr<CompletionQueue>>();
  PyObject* ref = PyWeakref_NewRef(loop.ptr(), nullptr);
  if (ref == nullptr) {
    PyErr_Clear();  // a loop without weak references: no cache, the provider each time
    return queue;
  }
  Py_XDECREF(std::exchange(g_last_loop, ref));
  if (g_last_queue == nullptr) g_last_queue = new std::weak_ptr<CompletionQueue>();  // never destroyed
  *g_last_queue = queue;
  return queue;
}

#ifndef __linux__
void set_nonblocking_cloexec(int fd) {
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  const int fdl = fcntl(fd, F_GETFD);
  if (fdl >= 0) fcntl(fd, F_SETFD, fdl | FD_CLOEXEC);
}
#endif

}  // namespace

// ------------------------------------------------------------------------------ Completion

Completion::~Completion() {
  // Still owning a future means the queue was dropped before it drained this completion.
  if ((future_ != nullptr || context_ != nullptr) && gil_held_and_alive()) {
    if (future_ != nullptr) inflight().erase(future_);
    Py_XDECREF(future_);
    Py_XDECREF(context_);
  }
}

void Completion::on_done(const std::shared_ptr<Completion>& c, std::exception_ptr e) {
  c->error = std::move(e);
  int expected = kSubmitting;
  if (c->state_.compare_exchange_strong(expected, kInline, std::memory_order_acq_rel)) return;
  // The caller already returned a future (state kDetached): hand over to its loop.
  std::shared_ptr<CompletionQueue> q = std::move(c->queue_);
  q->push(c);
}

py::object Completion::settle_inline() {
  struct ReleaseContext {
    PyObject*& context;
    ~ReleaseContext() { Py_CLEAR(context); }
  } release{context_};
  if (error) std::rethrow_exception(error);
  return result();
}

py::object start(std::shared_ptr<Store> store, std::shared_ptr<Operation> op, std::shared_ptr<Completion> c) {
  if (!store) throw InvalidArgument("store must not be None");
  const bool memory = store->is_memory();
  std::shared_ptr<CompletionQueue> q;
  // Outside a running loop this raises before anything is sent. The memory store always
  // completes inline, so it needs no loop (and skips the lookup).
  if (!memory) q = queue_for_running_loop();
  {
    std::optional<py::gil_scoped_release> release;
    if (!memory) release.emplace();  // a store without an engine runs the batch right here
    run_async(
        std::move(store), std::move(op), [c](std::exception_ptr e) { Completion::on_done(c, std::move(e)); },
        c->cancelled);
  }
  if (c->state_.load(std::memory_order_acquire) == Completion::kInline) return c->settle_inline();

  if (!q) q = queue_for_running_loop();
  py::object fut = q->new_future();
  c->queue_ = q;
  c->future_ = fut.inc_ref().ptr();
  inflight().insert_or_assign(fut.ptr(), c->cancelled);
  int expected = Completion::kSubmitting;
  if (!c->state_.compare_exchange_strong(expected, Completion::kDetached, std::memory_order_acq_rel)) {
    // Completed while the future was being made: on_done took the inline path.
    inflight().erase(fut.ptr());
    c->queue_.reset();
    Py_DECREF(std::exchange(c->future_, nullptr));
    return c->settle_inline();
  }
  return fut;
}

// ------------------------------------------------------------------------- CompletionQueue

CompletionQueue::CompletionQueue(py::handle loop) {
  loop_ref_ = PyWeakref_NewRef(loop.ptr(), nullptr);
  if (loop_ref_ == nullptr) throw py::error_already_set();
#ifdef __linux__
  read_fd_ = write_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (read_fd_ < 0) {
    Py_CLEAR(loop_ref_);
    PyErr_SetFromErrno(PyExc_OSError);
    throw py::error_already_set();
  }
#else
  int fds[2];
  if (pipe(fds) != 0) {
    Py_CLEAR(loop_ref_);
    PyErr_SetFromErrno(PyExc_OSError);
    throw py::error_already_set();
  }
  set_nonblocking_cloexec(fds[0]);
  set_nonblocking_cloexec(fds[1]);
  read_fd_ = fds[0];
  write_fd_ = fds[1];
#endif
}

CompletionQueue::~CompletionQueue() {
  if (gil_held_and_alive()) {
    Py_XDECREF(loop_ref_);
    Py_XDECREF(drain_fn_);
  }  // else: dropped by a late completion on an I/O thread; the two small objects leak
  if (write_fd_ >= 0 && write_fd_ != read_fd_) close(write_fd_);
  if (read_fd_ >= 0) close(read_fd_);
}

py::handle CompletionQueue::drain_callable() {
  if (drain_fn_ == nullptr) {
    std::weak_ptr<CompletionQueue> weak = weak_from_this();
    py::cpp_function fn([weak]() {
      if (auto q = weak.lock()) q->drain();
    });
    drain_fn_ = fn.release().ptr();
  }
  return py::handle(drain_fn_);
}

void CompletionQueue::use_call_soon_threadsafe() {
  drain_callable();
  call_soon_.store(true, std::memory_order_release);
}

py::object CompletionQueue::new_future() {
  py::object loop = py::reinterpret_steal<py::object>(PyObject_CallNoArgs(loop_ref_));
  if (!loop) throw py::error_already_set();
  if (loop.is_none()) throw py::value_error("this completion queue's event loop no longer exists");
  if (g_future_type == nullptr) throw py::import_error("import redcount.aio first");
  PyObject* args[] = {loop.ptr()};  // _OpFuture(loop=loop)
  PyObject* fut = PyObject_Vectorcall(g_future_type, args, 0, names().loop_kwnames);
  if (fut == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fut);
}

void CompletionQueue::push(std::shared_ptr<Completion> c) {
  bool was_empty = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = items_.empty();
    items_.push_back(std::move(c));
  }
  // Only the first completion after a drain signals: the drain takes everything queued.
  if (was_empty) signal();
}

void CompletionQueue::signal() {
  signals_.fetch_add(1, std::memory_order_relaxed);
  if (!call_soon_.load(std::memory_order_acquire)) {
#ifdef __linux__
    const std::uint64_t one = 1;
    if (write(write_fd_, &one, sizeof one) < 0) {
    }  // EAGAIN: the counter is full, so a wake-up is pending anyway
#else
    const char one = 1;
    if (write(write_fd_, &one, 1) < 0) {
    }  // EAGAIN: the pipe is full, so a wake-up is pending anyway
#endif
    return;
  }
  if (!interpreter_usable()) return;
  py::gil_scoped_acquire gil;  // the loop has no add_reader: call_soon_threadsafe needs the GIL
  py::object loop = py::reinterpret_steal<py::object>(PyObject_CallNoArgs(loop_ref_));
  if (!loop) {
    PyErr_Clear();
    return;
  }
  if (loop.is_none()) return;
  try {
    loop.attr("call_soon_threadsafe")(py::handle(drain_fn_));
  } catch (py::error_already_set& e) {
    if (!py::bool_(loop.attr("is_closed")())) e.discard_as_unraisable("redcount.aio: waking the event loop");
  }
}

namespace {

// When `fut`'s callbacks are exactly one (the awaiting task's wake-up), removes it and
// returns it with its context; otherwise changes nothing and returns nothing. Only
// redcount.aio's own coroutines await an _OpFuture, so one callback is the rule.
std::pair<py::object, py::object> take_only_callback(PyObject* fut) {
  const Names& n = names();
  py::object cbs = py::reinterpret_steal<py::object>(PyObject_GetAttr(fut, n.callbacks));
  if (!cbs) {
    PyErr_Clear();
    return {};
  }
  if (!PyList_Check(cbs.ptr()) || PyList_GET_SIZE(cbs.ptr()) != 1) return {};
  PyObject* item = PyList_GET_ITEM(cbs.ptr(), 0);
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) return {};
  py::object callback = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(item, 0));
  py::object context = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(item, 1));
  py::object removed =
      py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(fut, n.remove_done_callback, callback.ptr()));
  if (!removed) {
    PyErr_Clear();
    return {};
  }
  if (PyLong_AsLong(removed.ptr()) != 1) {  // not there after all: leave it to set_result
    PyErr_Clear();
    return {};
  }
  return {std::move(callback), std::move(context)};
}

}  // namespace

void CompletionQueue::drain() {
  if (!call_soon_.load(std::memory_order_acquire)) {
    char buf[64];
    while (read(read_fd_, buf, sizeof buf) > 0) {
    }  // an eventfd is reset by one read; a pipe may hold several bytes
  }
  std::vector<std::shared_ptr<Completion>> batch;
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (items_.size() <= kMaxPerDrain) {
      batch.swap(items_);
    } else {
      // Take the oldest kMaxPerDrain; the rest stay queued (so push() sends no signal for
      // them) and a drain is scheduled behind the loop's other ready callbacks.
      const auto cut = items_.begin() + static_cast<std::ptrdiff_t>(kMaxPerDrain);
      batch.assign(std::make_move_iterator(items_.begin()), std::make_move_iterator(cut));
      items_.erase(items_.begin(), cut);
      more = true;
    }
  }
  if (batch.empty()) return;
  if (more) {
    // Every future completed here wakes a task in the loop's next iteration; a thousand at
    // once would make that iteration (and every timer due meanwhile) wait for a thousand task
    // steps. In slices, the loop's other work runs between them.
    py::object loop = py::reinterpret_steal<py::object>(PyObject_CallNoArgs(loop_ref_));
    if (!loop) throw py::error_already_set();
    if (!loop.is_none()) loop.attr("call_soon")(drain_callable());
  }
  wakeups_.fetch_add(1, std::memory_order_relaxed);
  delivered_.fetch_add(batch.size(), std::memory_order_relaxed);
  // Each awaiting task is woken here, in order, as the loop would have woken it in its next
  // iteration. A task step that raises (only KeyboardInterrupt or SystemExit escape one)
  // stops that: the rest complete the usual way, and the exception goes to the loop.
  bool wake_now = true;
  std::optional<py::error_already_set> raised;
  for (auto& c : batch) {
    const Wake w = deliver(*c, wake_now);
    if (!w.callback) continue;
    PyObject* out = w.context.is_none() ? PyObject_CallOneArg(w.callback.ptr(), w.future.ptr())
                                        : PyObject_CallMethodObjArgs(w.context.ptr(), names().run, w.callback.ptr(),
                                                                     w.future.ptr(), nullptr);
    if (out == nullptr) {
      raised.emplace();
      wake_now = false;
    }
    Py_XDECREF(out);
  }
  if (raised) throw std::move(*raised);
}

CompletionQueue::Wake CompletionQueue::deliver(Completion& c, bool wake_now) {
  PyObject* raw = std::exchange(c.future_, nullptr);
  if (raw == nullptr) return {};
  inflight().erase(raw);
  py::object fut = py::reinterpret_steal<py::object>(raw);
  const Names& n = names();
  try {
    py::object done = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(fut.ptr(), n.done));
    if (!done) throw py::error_already_set();
    if (PyObject_IsTrue(done.ptr()) != 0) {  // cancelled: the outcome is dropped
      Py_CLEAR(c.context_);
      return {};
    }
    py::object value;
    try {
      value = c.settle_inline();
    } catch (...) {
      py::object err = exception_object(std::current_exception());
      py::object r =
          py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(fut.ptr(), n.set_exception, err.ptr()));
      if (!r) throw py::error_already_set();
      return {};
    }
    Wake wake;
    if (wake_now) std::tie(wake.callback, wake.context) = take_only_callback(fut.ptr());
    py::object r = py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(fut.ptr(), n.set_result, value.ptr()));
    if (!r) {
      if (!wake.callback) throw py::error_already_set();
      // Its callback is ours now: the task must still wake (and find the future's state).
      py::error_already_set().discard_as_unraisable("redcount.aio: completing a future");
    }
    if (wake.callback) wake.future = std::move(fut);
    return wake;
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("redcount.aio: completing a future");
  }
  return {};
}

// --------------------------------------------------------------------------- test support

namespace {

// Runs another store's batches on one worker thread, in order, and completes them there:
// the shape of completion the I/O engine will have, so that the completion queue and
// cancellation can be tested on any store today. hold() stops the worker between batches.
// Thread-safe.
class DeferredStore final : public Store {
 public:
  explicit DeferredStore(std::shared_ptr<Store> inner) : state_(std::make_shared<State>()) {
    if (!inner) throw InvalidArgument("store must not be None");
    state_->inner = std::move(inner);
    worker_ = std::thread([s = state_] { run(*s); });
  }
  ~DeferredStore() override { stop(); }

  std::vector<Reply> execute(const std::vector<Request>& batch) override { return state_->inner->execute(batch); }
  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->stopping) {
        state_->jobs.push_back(Job{std::move(batch), std::move(done), std::move(cancelled)});
        if (!state_->held) state_->cv.notify_all();  // a held worker is woken by resume()
        return;
      }
    }
    done({}, std::make_exception_ptr(ConnectionError("the store is closed")));
  }
  std::int64_t now_ms() const override { return state_->inner->now_ms(); }
  std::string describe() const override { return state_->inner->describe(); }
  bool is_memory() const noexcept override { return false; }
  void close() override {
    stop();
    state_->inner->close();
  }

  void hold(bool on) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->held = on;
    state_->cv.notify_all();
  }
  // Waits (GIL released by the caller) until every submitted batch has completed.
  void wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (state_->held && !state_->jobs.empty()) throw InvalidArgument("wait_idle() while held: call resume() first");
    if (!state_->cv.wait_for(lock, timeout, [&] { return state_->jobs.empty() && !state_->busy; })) {
      throw TimeoutError("the deferred store's worker did not finish in time");
    }
  }
  std::size_t queued() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->jobs.size();
  }
  std::size_t executed() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->executed;
  }
  std::size_t dropped() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->dropped;
  }

 private:
  struct Job {
    std::vector<Request> batch;
    BatchDone done;
    CancelFlag cancelled;
  };
  // Shared with the worker, which never touches the DeferredStore itself: the last
  // reference to the store may be dropped by a completion on the worker thread.
  struct State {
    std::shared_ptr<Store> inner;
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;
    bool held = false;
    bool stopping = false;
    bool busy = false;
    std::size_t executed = 0;
    std::size_t dropped = 0;
  };

  static void run(State& s) {
    for (;;) {
      Job job;
      bool closing = false;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.cv.wait(lock, [&] { return s.stopping || (!s.held && !s.jobs.empty()); });
        if (s.jobs.empty()) return;  // stopping, nothing left
        closing = s.stopping;
        job = std::move(s.jobs.front());
        s.jobs.pop_front();
        s.busy = true;
      }
      if (closing) {
        job.done({}, std::make_exception_ptr(ConnectionError("the store was closed before the batch was sent")));
      } else if (job.cancelled && job.cancelled->load()) {
        {
          std::lock_guard<std::mutex> lock(s.mu);
          ++s.dropped;
        }
        job.done({}, std::make_exception_ptr(Cancelled("cancelled before it was sent")));
      } else {
        std::vector<Reply> replies;
        std::exception_ptr error;
        try {
          replies = s.inner->execute(job.batch);
        } catch (...) {
          error = std::current_exception();
        }
        {
          std::lock_guard<std::mutex> lock(s.mu);
          ++s.executed;
        }
        job.done(std::move(replies), error);
      }
      job = Job{};  // drop the callbacks before saying the batch is done
      std::lock_guard<std::mutex> lock(s.mu);
      s.busy = false;
      s.cv.notify_all();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stopping = true;
      state_->held = false;
      state_->cv.notify_all();
    }
    if (!worker_.joinable()) return;
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();  // dropped by its own completion; the worker exits on its own
    } else if (gil_held_and_alive()) {
      py::gil_scoped_release release;  // the worker may be waiting for the GIL to wake a loop
      worker_.join();
    } else {
      worker_.join();
    }
  }

  std::shared_ptr<State> state_;
  std::thread worker_;
};

std::vector<Request> one_command(const py::args& args) {
  Command cmd;
  for (auto a : args) cmd.args.push_back(command_arg(a));
  if (cmd.args.empty()) throw InvalidArgument("execute() needs a command name");
  std::vector<Request> batch;
  batch.emplace_back(std::move(cmd));
  return batch;
}

}  // namespace

}  // namespace redcount::bind::aio

namespace redcount::bind {

void register_aio(py::module_& m) {
  using aio::CompletionQueue;

  py::class_<CompletionQueue, std::shared_ptr<CompletionQueue>>(
      m, "CompletionQueue",
      "Finished asynchronous calls waiting for one event loop; redcount.aio makes one per loop. "
      "Thread-safe.")
      .def(py::init<py::handle>(), py::arg("loop"))
      .def_property_readonly("fd", &CompletionQueue::fd, "The fd to watch with loop.add_reader(fd, drain).")
      .def("drain", &CompletionQueue::drain, "Complete the futures of every finished call (on the loop's thread).")
      .def("use_call_soon_threadsafe", &CompletionQueue::use_call_soon_threadsafe,
           "For a loop without add_reader: wake it with loop.call_soon_threadsafe(drain) instead.")
      .def_property_readonly("uses_call_soon_threadsafe", &CompletionQueue::uses_call_soon_threadsafe)
      .def_property_readonly("signals", &CompletionQueue::signals,
                             "Wake-ups requested: eventfd writes or call_soon_threadsafe calls.")
      .def_property_readonly("wakeups", &CompletionQueue::wakeups, "Drains that found finished calls.")
      .def_property_readonly("delivered", &CompletionQueue::delivered, "Calls completed through this queue.");

  m.def(
      "execute_async",
      [](std::shared_ptr<Store> store, py::args args) {
        return aio::submit_async(std::move(store), std::make_shared<CommandsOp>(aio::one_command(args)),
                                 [](std::vector<Reply>& replies) { return to_python(replies.front()); });
      },
      py::arg("store"),
      "Store.execute() for asyncio: the reply, or a future of it (use redcount.aio.AsyncStore).");
  m.def(
      "execute_many_async",
      [](std::shared_ptr<Store> store, const std::vector<py::tuple>& commands) {
        std::vector<Request> batch;
        for (const auto& t : commands) {
          Command cmd;
          for (auto a : t) cmd.args.push_back(command_arg(a));
          if (cmd.args.empty()) throw InvalidArgument("execute_many() got an empty command");
          batch.emplace_back(std::move(cmd));
        }
        return aio::submit_async(std::move(store), std::make_shared<CommandsOp>(std::move(batch)),
                                 [](std::vector<Reply>& replies) {
                                   py::list out;
                                   for (const auto& r : replies) {
                                     out.append(r.is_error() ? py::object(py::str(r.str)) : to_python(r));
                                   }
                                   return out;
                                 });
      },
      py::arg("store"), py::arg("commands"),
      "Store.execute_many() for asyncio: the replies, or a future of them.");
  m.def(
      "ping_async",
      [](std::shared_ptr<Store> store) {
        std::vector<Request> batch;
        batch.emplace_back(Command{{"PING"}});
        return aio::submit_async(std::move(store), std::make_shared<CommandsOp>(std::move(batch)),
                                 [](std::vector<Reply>& replies) {
                                   replies.front().check();
                                   return py::bool_(true);
                                 });
      },
      py::arg("store"), "Store.ping() for asyncio: True, or a future of it.");

  m.def(
      "_aio_setup",
      [](py::object future_type, py::object queue_provider) {
        aio::g_future_type = future_type.release().ptr();  // kept for the life of the process
        aio::g_queue_provider = queue_provider.release().ptr();
        aio::g_get_running_loop = py::object(py::module_::import("asyncio").attr("get_running_loop")).release().ptr();
        aio::names();
      },
      py::arg("future_type"), py::arg("queue_provider"),
      "Called once by redcount.aio: the future class to make, and how to find the running loop's queue.");
  m.def(
      "_aio_cancel",
      [](py::handle future) {
        auto& futures = aio::inflight();
        auto it = futures.find(future.ptr());
        if (it == futures.end()) return false;
        it->second->store(true);
        futures.erase(it);
        return true;
      },
      py::arg("future"), "Cancel the operation behind `future` (called by _OpFuture.cancel).");
  m.def("_aio_inflight", [] { return aio::inflight().size(); }, "Futures still waiting for an operation.");
  m.def(
      "_aio_echo_async",
      [](std::shared_ptr<Store> store, py::object value) {
        std::vector<Request> batch;
        batch.emplace_back(Command{{"PING"}});
        return aio::submit_async(
            std::move(store), std::make_shared<CommandsOp>(std::move(batch)),
            [](std::vector<Reply>&, py::handle context) { return py::reinterpret_borrow<py::object>(context); },
            std::move(value));
      },
      py::arg("store"), py::arg("value"),
      "Test support: a PING whose result is `value`, handed through submit_async's context.");

  py::class_<aio::DeferredStore, Store, std::shared_ptr<aio::DeferredStore>>(
      m, "_DeferredStore",
      "Test support: runs another store's batches on a worker thread, as the I/O engine will, so "
      "that async completion can be tested on any store. Thread-safe.")
      .def(py::init<std::shared_ptr<Store>>(), py::arg("store"))
      .def("hold", [](aio::DeferredStore& s) { s.hold(true); }, "Stop the worker before its next batch.")
      .def("resume", [](aio::DeferredStore& s) { s.hold(false); }, "Let the worker go on.")
      .def(
          "wait_idle",
          [](aio::DeferredStore& s, double timeout) {
            py::gil_scoped_release release;  // the worker may need the GIL to wake a loop
            s.wait_idle(std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000)));
          },
          py::arg("timeout") = 10.0, "Wait until every submitted batch has completed.")
      .def_property_readonly("queued", &aio::DeferredStore::queued, "Batches waiting for the worker.")
      .def_property_readonly("executed", &aio::DeferredStore::executed, "Batches run on the inner store.")
      .def_property_readonly("dropped", &aio::DeferredStore::dropped, "Batches dropped as cancelled before sending.");
}

}  // namespace redcount::bind
