#include "redcount/redis/io/resolver.h"

#include <thread>
#include <utility>

#include "redcount/common/threads.h"

namespace redcount::redis {
namespace {

AddrList lookup(const std::string& host, int port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  const std::string service = std::to_string(port);
  addrinfo* found = nullptr;
  AddrList out;
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    out.error = gai_strerror(rc);
    return out;
  }
  out.list.reset(found);
  return out;
}

std::mutex hook_mu;
std::shared_ptr<ResolveHook> hook;

}  // namespace

void set_resolve_hook_for_tests(ResolveHook h) {
  std::lock_guard<std::mutex> lock(hook_mu);
  hook = h ? std::make_shared<ResolveHook>(std::move(h)) : nullptr;
}

bool resolve_numeric(const std::string& host, int port, AddrList& out) {
  AddrList numeric = lookup(host, port, AI_NUMERICHOST | AI_NUMERICSERV);
  if (!numeric.list) return false;
  out = std::move(numeric);
  return true;
}

AddrList resolve(const std::string& host, int port) {
  std::shared_ptr<ResolveHook> h;
  {
    std::lock_guard<std::mutex> lock(hook_mu);
    h = hook;
  }
  if (h) return (*h)(host, port);
  return lookup(host, port, AI_NUMERICSERV);
}

std::shared_ptr<Resolution> Resolution::start(std::string host, int port, std::function<void()> on_done) {
  auto r = std::make_shared<Resolution>();
  // The thread holds its own reference, so the owner may drop the resolution early.
  start_thread([r, host = std::move(host), port, on_done = std::move(on_done)] {
    AddrList found = resolve(host, port);
    {
      std::lock_guard<std::mutex> lock(r->mu_);
      r->result_ = std::move(found);
      r->done_ = true;
    }
    if (on_done) on_done();
  }).detach();
  return r;
}

bool Resolution::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

AddrList Resolution::take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) {
    AddrList none;
    none.error = "still resolving";
    return none;
  }
  return std::move(result_);
}

}  // namespace redcount::redis
