// The bindings' one GIL policy, for a call that blocks: on the network, or on one of the
// core's own threads (a retry thread, a flusher, a store's I/O thread). The core's own
// threads never take the GIL.
//
// Convert every Python argument to C++ values first (convert.h), with the GIL held; then
// hold a NetworkWait in an inner scope around the blocking call only, and build the Python
// result after that scope. Inside it no py::object may be touched.
//
//   std::vector<Reply> replies;
//   {
//     NetworkWait wait;
//     replies = store.execute(batch);
//   }
//   return replies_to_python(replies);
//
// The GIL is released so that other Python threads run while this one waits, and so that
// the core's threads, which may need the GIL to complete an asyncio future, are never
// blocked behind it.
//
// Taking the GIL back during interpreter exit. Once finalization has begun, a thread other
// than the finalizing one that asks for the GIL is never given it: CPython up to 3.13 ends
// the thread with pthread_exit (on glibc a forced unwind, which calls std::terminate when it
// reaches a noexcept frame such as a destructor: "terminate called without an active
// exception", exit status 134), and 3.14 parks it for good. Daemon threads inside a call at
// exit are the usual case. The one place where the bindings take the GIL back goes through
// park_if_ended(), which turns the first behaviour into the second: the thread is parked
// where it stands, with nothing unwound, until the process exits. So does the place where
// the bindings run Python code on what may be a daemon's thread (the asyncio drain resuming
// tasks, whose code may give the GIL up for a moment). Only the thread that asked is
// affected; the interpreter decides who must stop (never the finalizing thread itself, so
// a close() run by a finalizer on the main thread proceeds as usual).
#pragma once

#include <pybind11/pybind11.h>
#include <unistd.h>

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

namespace redcount::bind {

// Never returns: the thread sleeps until the process exits.
[[noreturn]] inline void park_thread_until_exit() noexcept {
  for (;;) pause();
}

// Runs `f`, which takes the GIL or runs Python code through the C API (and throws no C++
// exception), except that a thread the interpreter ends inside it is parked instead (see the
// top of this file).
template <class F>
inline auto park_if_ended(F f) noexcept {
#if defined(__GLIBCXX__)
  try {
    return f();
  } catch (abi::__forced_unwind&) {
    // Not rethrown: the unwind would stop at the first noexcept frame above (std::terminate)
    // or, if it got through, run destructors that touch Python without the GIL.
    park_thread_until_exit();
  }
#else
  return f();
#endif
}

class NetworkWait {
 public:
  // Releases the GIL until the end of the scope.
  NetworkWait() : saved_(PyEval_SaveThread()) {}
  // The same, except for a call on the memory store (`memory_store`): it never waits on I/O
  // and its lock is held only briefly, by threads that never need the GIL, so there a
  // release and retake would cost more than the call itself. For the per-request hot paths
  // (limiter checks, counter increments, asyncio submission).
  explicit NetworkWait(bool memory_store) : saved_(memory_store ? nullptr : PyEval_SaveThread()) {}
  ~NetworkWait() {
    if (saved_ != nullptr) park_if_ended([s = saved_] { PyEval_RestoreThread(s); });
  }
  NetworkWait(const NetworkWait&) = delete;
  NetworkWait& operator=(const NetworkWait&) = delete;

 private:
  PyThreadState* saved_;
};

}  // namespace redcount::bind
