// The asyncio completion runtime of the bindings (see aio.h): the per-loop CompletionQueue,
// submit_async's driver, and the hooks redcount.aio installs at import. What Python calls
// is bound in register_aio.cpp.
#include <fcntl.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/eventfd.h>
#endif

#include <optional>
#include <unordered_map>
#include <utility>

#include "aio.h"
#include "redcount/common/errors.h"

namespace redcount::bind::aio {
namespace {

// Set once by redcount.aio at import (setup()) and kept for the life of the process.
PyObject* g_future_type = nullptr;     // redcount.aio._OpFuture
PyObject* g_queue_provider = nullptr;  // redcount.aio._queue_for_running_loop
PyObject* g_get_running_loop = nullptr;  // asyncio.get_running_loop
PyObject* g_base_add_done_callback = nullptr;  // asyncio.Future.add_done_callback

// Names and argument tuples of the per-call Python calls, made once (interned) and kept for
// the life of the process: these calls run once per awaited operation.
struct Names {
  PyObject* done = PyUnicode_InternFromString("done");
  PyObject* set_result = PyUnicode_InternFromString("set_result");
  PyObject* set_exception = PyUnicode_InternFromString("set_exception");
  PyObject* loop_kwnames = Py_BuildValue("(s)", "loop");
  PyObject* context = PyUnicode_InternFromString("context");
  PyObject* context_kwnames = Py_BuildValue("(O)", context);
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

// A future awaiting an operation: the flag that cancels the operation (for
// _OpFuture.cancel), and what _OpFuture.add_done_callback saw: how many callbacks were added
// and the first one, with its context. The drain runs that callback itself when it is the
// only one (see take_only_callback).
struct Awaiting {
  CancelFlag cancelled;
  std::weak_ptr<Completion> completion;
  const CompletionQueue* queue = nullptr;  // identity only: the queue that completes it
  int callbacks = 0;
  py::object callback, context;
};

// Futures awaiting an operation. Touched only with the GIL held (an entry holds Python
// references). Never destroyed: it may be used during interpreter exit.
std::unordered_map<PyObject*, Awaiting>& inflight() {
  static auto* futures = new std::unordered_map<PyObject*, Awaiting>();
  return *futures;
}

bool interpreter_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() != 0 && Py_IsFinalizing() == 0;
#else
  return Py_IsInitialized() != 0 && _Py_IsFinalizing() == 0;
#endif
}

// References dropped on a thread that may not touch Python now (a store's I/O thread that
// ends up the last owner of a completion or a queue) are released later on the interpreter's
// main thread, with the GIL, by a pending call. During interpreter exit, or when the
// interpreter's few pending-call slots are all taken, the reference is left: a small leak,
// never a crash.
int release_future_pending(void* future) {
  auto* fut = static_cast<PyObject*>(future);
  inflight().erase(fut);
  Py_DECREF(fut);
  return 0;
}

int release_pending(void* object) {
  Py_DECREF(static_cast<PyObject*>(object));
  return 0;
}

void release_later(PyObject* object, int (*release)(void*)) {
  if (object != nullptr && interpreter_usable()) (void)Py_AddPendingCall(release, object);
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

// _OpFuture.add_done_callback(fn, *, context=None): asyncio.Future's, noting on the way the
// callbacks added to a future that awaits an operation. A C method, so that the task that
// awaits the future (which calls this through the attribute, the future not being exactly
// an asyncio.Future) runs no Python frame for it.
PyObject* add_done_callback(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const Names& n = names();
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  const bool usual = nargs == 1 && (nkw == 0 || (nkw == 1 && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0),
                                                                               n.context) == 0));
  if (!usual) {  // asyncio's own method says what is wrong with the call
    PyErr_Clear();
    std::vector<PyObject*> stack{self};
    stack.insert(stack.end(), args, args + nargs + nkw);
    return PyObject_Vectorcall(g_base_add_done_callback, stack.data(), static_cast<std::size_t>(1 + nargs),
                               kwnames);
  }
  PyObject* fn = args[0];
  // The context the callback will run in, as asyncio would pick it, made explicit so that
  // the drain runs the callback in the same one.
  py::object context = py::reinterpret_borrow<py::object>(nkw == 1 ? args[1] : Py_None);
  if (context.is_none()) {
    context = py::reinterpret_steal<py::object>(PyContext_CopyCurrent());
    if (!context) return nullptr;
  }
  auto it = inflight().find(self);
  if (it != inflight().end() && it->second.callbacks++ == 0) {
    it->second.callback = py::reinterpret_borrow<py::object>(fn);
    it->second.context = context;
  }
  PyObject* stack[] = {self, fn, context.ptr()};
  return PyObject_Vectorcall(g_base_add_done_callback, stack, 2, n.context_kwnames);
}

PyMethodDef g_add_done_callback_def = {
    "add_done_callback",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&add_done_callback)),
    METH_FASTCALL | METH_KEYWORDS,
    "Add a callback to be run when the future becomes done (asyncio.Future.add_done_callback).",
};

}  // namespace

bool gil_held_and_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing() != 0;
#else
  const bool finalizing = _Py_IsFinalizing() != 0;
#endif
  return Py_IsInitialized() != 0 && !finalizing && PyGILState_Check() != 0;
}

void setup(py::handle future_type, py::handle queue_provider) {
  if (!PyType_Check(future_type.ptr())) throw py::type_error("future_type must be a class");
  auto* type = reinterpret_cast<PyTypeObject*>(future_type.ptr());
  if (type->tp_base == nullptr) throw py::type_error("future_type must derive from asyncio.Future");
  py::object base_add = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(type->tp_base))
                            .attr("add_done_callback");
  py::object method = py::reinterpret_steal<py::object>(PyDescr_NewMethod(type, &g_add_done_callback_def));
  if (!method) throw py::error_already_set();
  if (PyObject_SetAttrString(future_type.ptr(), "add_done_callback", method.ptr()) != 0) {
    throw py::error_already_set();
  }
  names();
  // Kept for the life of the process.
  g_base_add_done_callback = base_add.release().ptr();
  g_future_type = py::reinterpret_borrow<py::object>(future_type).release().ptr();
  g_queue_provider = py::reinterpret_borrow<py::object>(queue_provider).release().ptr();
  g_get_running_loop = py::object(py::module_::import("asyncio").attr("get_running_loop")).release().ptr();
}

namespace {

// GIL held. The call behind an entry of inflight() is cancelled and its completion lets go
// of the future: nothing is delivered any more, so nothing in C++ may keep the future (and
// its loop) alive until a late reply. What the entry held is released by the caller.
void forget(Awaiting& a) {
  a.cancelled->store(true);
  if (auto c = a.completion.lock()) c->release_python();
}

}  // namespace

bool cancel(py::handle future) {
  auto& futures = inflight();
  auto it = futures.find(future.ptr());
  if (it == futures.end()) return false;
  auto entry = futures.extract(it);
  forget(entry.mapped());
  return true;
}

std::size_t inflight_count() { return inflight().size(); }

// ------------------------------------------------------------------------------ Completion

Completion::~Completion() {
  // Still owning a future means the queue was dropped before it drained this completion.
  if (future_ == nullptr && context_ == nullptr) return;
  if (gil_held_and_alive()) {
    if (future_ != nullptr) inflight().erase(future_);
    Py_XDECREF(future_);
    Py_XDECREF(context_);
  } else {
    release_later(future_, &release_future_pending);
    release_later(context_, &release_pending);
  }
}

void Completion::release_python() {
  Py_CLEAR(future_);
  Py_CLEAR(context_);
}

void Completion::on_done(const std::shared_ptr<Completion>& c, std::exception_ptr e) {
  c->error = std::move(e);
  int expected = kSubmitting;
  if (c->state_.compare_exchange_strong(expected, kInline, std::memory_order_acq_rel)) return;
  // The caller already returned a future (state kDetached): hand over to its loop, unless
  // the loop is gone (then so is everything that awaited this call).
  if (std::shared_ptr<CompletionQueue> q = c->queue_.lock()) q->push(c);
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
    NetworkWait wait(memory);  // a store without an engine runs the batch right here
    run_async(
        std::move(store), std::move(op), [c](std::exception_ptr e) { Completion::on_done(c, std::move(e)); },
        c->cancelled);
  }
  if (c->state_.load(std::memory_order_acquire) == Completion::kInline) return c->settle_inline();

  if (!q) q = queue_for_running_loop();
  py::object fut = q->new_future();
  c->queue_ = q;
  c->future_ = fut.inc_ref().ptr();
  Awaiting awaiting;
  awaiting.cancelled = c->cancelled;
  awaiting.completion = c;
  awaiting.queue = q.get();
  inflight().insert_or_assign(fut.ptr(), std::move(awaiting));
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
  } else {  // dropped by a late completion on an I/O thread
    release_later(loop_ref_, &release_pending);
    release_later(drain_fn_, &release_pending);
  }
  if (write_fd_ >= 0 && write_fd_ != read_fd_) ::close(write_fd_);
  if (read_fd_ >= 0) ::close(read_fd_);
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
    if (closed_.load(std::memory_order_relaxed)) return;  // its Python references are gone already
    was_empty = items_.empty();
    items_.push_back(std::move(c));
  }
  // Only the first completion after a drain signals: the drain takes everything queued.
  if (was_empty) signal();
}

void CompletionQueue::signal() {
  // Never the GIL here: this is a store's I/O thread. A loop without add_reader has a Python
  // thread of redcount.aio's waiting on the fd, which calls loop.call_soon_threadsafe(drain).
  signals_.fetch_add(1, std::memory_order_relaxed);
#ifdef __linux__
  const std::uint64_t one = 1;
  if (write(write_fd_, &one, sizeof one) < 0) {
  }  // EAGAIN: the counter is full, so a wake-up is pending anyway
#else
  const char one = 1;
  if (write(write_fd_, &one, 1) < 0) {
  }  // EAGAIN: the pipe is full, so a wake-up is pending anyway
#endif
}

namespace {

// When `fut`'s callbacks are exactly one (the awaiting task's wake-up), removes it and
// returns it with its context; otherwise changes nothing and returns nothing. Only
// redcount.aio's own coroutines await an _OpFuture, so one callback is the rule. One
// callback was added (`a`, kept by _OpFuture.add_done_callback) and removing it removes
// one: then it was the only one.
std::pair<py::object, py::object> take_only_callback(PyObject* fut, Awaiting& a) {
  if (a.callbacks != 1 || !a.callback) return {};
  const Names& n = names();
  py::object removed =
      py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(fut, n.remove_done_callback, a.callback.ptr()));
  if (!removed) {
    PyErr_Clear();
    return {};
  }
  if (PyLong_AsLong(removed.ptr()) != 1) {  // removed since: nothing to wake
    PyErr_Clear();
    return {};
  }
  return {std::move(a.callback), std::move(a.context)};
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
    // The task step may end this thread (a daemon's loop at interpreter exit): see gil.h.
    PyObject* out = park_if_ended([&w] {
      return w.context.is_none() ? PyObject_CallOneArg(w.callback.ptr(), w.future.ptr())
                                 : PyObject_CallMethodObjArgs(w.context.ptr(), names().run, w.callback.ptr(),
                                                              w.future.ptr(), nullptr);
    });
    if (out == nullptr) {
      raised.emplace();
      wake_now = false;
    }
    Py_XDECREF(out);
  }
  if (raised) throw std::move(*raised);
}

void CompletionQueue::close() {
  std::vector<std::shared_ptr<Completion>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.store(true, std::memory_order_relaxed);
    queued.swap(items_);
  }
  // The calls still in flight for this loop: their completions are dropped when they come.
  std::vector<Awaiting> forgotten;
  auto& futures = inflight();
  for (auto it = futures.begin(); it != futures.end();) {
    if (it->second.queue == this) {
      forgotten.push_back(std::move(it->second));
      it = futures.erase(it);
    } else {
      ++it;
    }
  }
  // Released here, with the GIL, outside the map: a future's dealloc may run Python code.
  for (auto& a : forgotten) forget(a);
  forgotten.clear();
  queued.clear();
}

CompletionQueue::Wake CompletionQueue::deliver(Completion& c, bool wake_now) {
  PyObject* raw = std::exchange(c.future_, nullptr);
  if (raw == nullptr) return {};
  auto awaiting = inflight().extract(raw);  // empty once cancelled
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
#if defined(__GLIBCXX__)
    } catch (abi::__forced_unwind&) {
      throw;  // never swallowed (see gil.h)
#endif
    } catch (...) {
      py::object err = exception_object(std::current_exception());
      py::object r =
          py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(fut.ptr(), n.set_exception, err.ptr()));
      if (!r) throw py::error_already_set();
      return {};
    }
    Wake wake;
    if (wake_now && awaiting) std::tie(wake.callback, wake.context) = take_only_callback(fut.ptr(), awaiting.mapped());
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

}  // namespace redcount::bind::aio
