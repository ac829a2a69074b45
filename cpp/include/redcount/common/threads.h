// Threads the core starts for itself take no asynchronous signals.
//
//   thread_ = start_thread([this] { run(); });   // as std::thread(...), signals blocked in it
//
// A signal sent to the process (SIGINT from Ctrl-C, SIGTERM, SIGCHLD...) goes to one thread
// that does not block it. Were it one of ours, the application would not see it in time: a
// Python program's handlers run, and its blocking calls (time.sleep, a lock's wait) are
// interrupted, only in its main thread, so Ctrl-C would wait until the main thread woke up
// on its own. Blocked in every thread the core starts, such signals reach the application's
// threads. Faults raised by a thread's own code (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
// SIGSYS, SIGABRT) stay unblocked, so crashes and the sanitizers' reports work as before.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace redcount {

template <class F>
std::thread start_thread(F&& body) {
  sigset_t blocked, old;
  sigfillset(&blocked);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&blocked, sig);
  pthread_sigmask(SIG_SETMASK, &blocked, &old);  // the new thread inherits the caller's mask
  try {
    std::thread t(std::forward<F>(body));
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return t;
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
}

}  // namespace redcount
