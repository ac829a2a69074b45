// Host name resolution off the reactor thread. getaddrinfo() blocks (DNS can take seconds,
// and glibc has no non-blocking form that fits an epoll loop), so each resolution of a
// name that is not a numeric address runs on a short-lived thread of its own; the reactor
// keeps serving the other connections and learns of the result through a callback that
// wakes it.
//
//   auto r = Resolution::start("cache.internal", 6379, [w = waker] { w->notify(); });
//   ...                                   // later, on the reactor, after the wake-up:
//   if (r->done()) { AddrList a = r->take(); /* a.list, or a.error */ }
//
// Thread-safe: the resolving thread and the owner share the state under a mutex; the
// owner may drop its Resolution at any time (the thread then frees what it found).
#pragma once

#include <netdb.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace redcount::redis {

// The result of getaddrinfo(): a list (owned, freed with freeaddrinfo) or an error text.
struct AddrList {
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list{nullptr, freeaddrinfo};
  std::string error;  // gai_strerror() text when `list` is empty
};

// Resolves at once, without any network traffic, when `host` is a numeric IPv4 or IPv6
// address; returns false (and leaves `out` alone) when it is a name.
bool resolve_numeric(const std::string& host, int port, AddrList& out);
// Resolves in place (blocking: DNS may take seconds).
AddrList resolve(const std::string& host, int port);

// Tests only: replaces getaddrinfo() for names (not numeric addresses) until reset with
// an empty function, so a test can hold a resolution open. Thread-safe.
using ResolveHook = std::function<AddrList(const std::string& host, int port)>;
void set_resolve_hook_for_tests(ResolveHook hook);

class Resolution {
 public:
  // Starts resolving on a detached thread; `on_done` runs on that thread when the result
  // is in. Throws std::system_error when no thread can be started.
  static std::shared_ptr<Resolution> start(std::string host, int port, std::function<void()> on_done);

  bool done() const;
  // The result, once done() (empty and with an error text otherwise).
  AddrList take();

 private:
  mutable std::mutex mu_;
  bool done_ = false;
  AddrList result_;
};

}  // namespace redcount::redis
