#include "redcount/redis/sentinel.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "redcount/common/errors.h"
#include "redcount/redis/resolver.h"
#include "redcount/common/util.h"

namespace redcount::redis {
namespace {

int poll_timeout_ms(TimePoint deadline) {
  if (deadline == kNever) return -1;
  const auto left = deadline - SteadyClock::now();
  if (left <= SteadyClock::duration::zero()) return 0;
  // Rounded up: waking a little late is fine, spinning on a 0 ms timeout is not.
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left + std::chrono::microseconds(999));
  return static_cast<int>(std::min<std::int64_t>(ms.count(), 1'000'000'000));
}

enum class Waited { Ready, Timeout, Woken };

// Polls `fd` for `events` (and `wake_fd` for input, when >= 0) until `deadline`.
Waited wait_fd(int fd, short events, TimePoint deadline, int wake_fd = -1) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(p, wake_fd >= 0 ? 2 : 1, poll_timeout_ms(deadline));
    if (n > 0) {
      if (wake_fd >= 0 && (p[1].revents & POLLIN)) return Waited::Woken;
      return Waited::Ready;
    }
    if (n == 0) return Waited::Timeout;
    if (errno != EINTR) throw ConnectionError(std::string("poll failed: ") + std::strerror(errno));
  }
}

TimePoint deadline_after(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 ? SteadyClock::now() + timeout : kNever;
}

struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// A connected TCP socket to `address`, or the error saying why not.
int connect_tcp(const Address& address, const std::string& where, TimePoint deadline) {
  AddrList addrs;
  if (!resolve_numeric(address.host, address.port, addrs)) addrs = resolve(address.host, address.port);
  if (!addrs.list) throw ConnectionError("cannot resolve host '" + address.host + "' (" + addrs.error + ")");
  int last_err = 0;
  for (const addrinfo* a = addrs.list.get(); a != nullptr; a = a->ai_next) {
    FdGuard s{::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
    if (s.fd < 0) {
      last_err = errno;
      continue;
    }
    if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last_err = errno;
        continue;
      }
      if (wait_fd(s.fd, POLLOUT, deadline) == Waited::Timeout) {
        throw TimeoutError("timed out connecting to " + where);
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        last_err = err;
        continue;
      }
    }
    int one = 1;
    ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s.release();
  }
  if (last_err == ECONNREFUSED) throw ConnectionError("connection refused by " + where);
  throw ConnectionError("cannot connect to " + where + ": " + std::strerror(last_err));
}

const char* role_name(Role r) {
  switch (r) {
    case Role::Master:
      return "master";
    case Role::Replica:
      return "replica";
    case Role::Sentinel:
      return "sentinel";
    default:
      return "unknown";
  }
}

std::optional<int> parse_port(std::string_view s) {
  auto p = parse_int64(s);
  if (!p || *p < 1 || *p > 65535) return std::nullopt;
  return static_cast<int>(*p);
}

}  // namespace

SentinelOptions sentinel_options(const SentinelUrl& u, std::shared_ptr<TlsContext> tls) {
  SentinelOptions o;
  o.sentinels = u.sentinels;
  o.service = u.service;
  o.link.username = u.sentinel_username;
  o.link.password = u.sentinel_password;
  o.link.tls = std::move(tls);
  o.link.ssl_server_name = u.master.ssl_server_name;
  return o;
}

// --- ControlLink ---------------------------------------------------------------------------

ControlLink::ControlLink(const Address& address, const LinkOptions& options)
    : address_(address), options_(options), where_(address.to_string()) {
  const TimePoint deadline = deadline_after(options_.connect_timeout);
  const int fd = connect_tcp(address_, where_, deadline);
  if (options_.tls) {
    const std::string name = options_.ssl_server_name.empty() ? address_.host : options_.ssl_server_name;
    transport_ = make_tls_transport(fd, options_.tls, name);
    while (!transport_->handshake()) {
      const short ev = transport_->want() == Transport::Want::Read ? POLLIN : POLLOUT;
      if (wait_fd(transport_->fd(), ev, deadline) == Waited::Timeout) {
        throw TimeoutError("timed out in the TLS handshake with " + where_);
      }
    }
  } else {
    transport_ = make_plain_transport(fd);
  }
  if (!options_.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!options_.username.empty()) auth.push_back(options_.username);
    auth.push_back(options_.password);
    const Reply r = call(auth);
    if (r.is_error()) throw AuthenticationError(r.str + " (AUTH refused by " + where_ + ")");
  }
}

ControlLink::~ControlLink() = default;

int ControlLink::fd() const noexcept { return transport_->fd(); }

TimePoint ControlLink::command_deadline() const { return deadline_after(options_.command_timeout); }

void ControlLink::write_all(const std::string& bytes, TimePoint deadline) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t n = transport_->write(bytes.data() + done, bytes.size() - done);
    done += n;
    if (n == 0) {
      const short ev = transport_->want() == Transport::Want::Read ? POLLIN : POLLOUT;
      if (wait_fd(transport_->fd(), ev, deadline) == Waited::Timeout) {
        throw TimeoutError("timed out writing to " + where_, done > 0);
      }
    }
  }
}

void ControlLink::send(const std::vector<std::string>& args) {
  std::string out;
  resp::format_args(out, args);
  try {
    write_all(out, command_deadline());
  } catch (const TimeoutError&) {
    throw;
  } catch (const ConnectionError& e) {
    throw ConnectionError(std::string(e.what()) + " (" + where_ + ")");
  }
}

std::optional<Reply> ControlLink::next(TimePoint deadline, int wake_fd) {
  char buf[16384];
  for (;;) {
    if (auto r = parser_.next()) return r;
    std::size_t n = 0;
    try {
      n = transport_->read(buf, sizeof buf);
    } catch (const ConnectionError& e) {
      throw ConnectionError(std::string(e.what()) + " (" + where_ + ")", true);
    }
    if (n > 0) {
      parser_.feed(buf, n);
      continue;
    }
    const short ev = transport_->want() == Transport::Want::Read ? POLLIN : POLLOUT;
    switch (wait_fd(transport_->fd(), ev, deadline, wake_fd)) {
      case Waited::Ready:
        break;
      case Waited::Timeout:
      case Waited::Woken:
        return std::nullopt;
    }
  }
}

Reply ControlLink::call(const std::vector<std::string>& args) {
  send(args);
  auto r = next(command_deadline());
  if (!r) {
    throw TimeoutError("no reply from " + where_ + " to " + printable(args.empty() ? "" : args[0]) + " within " +
                           std::to_string(options_.command_timeout.count()) + " ms",
                       true);
  }
  return std::move(*r);
}

// --- roles ---------------------------------------------------------------------------------

Command role_command() { return Command{{"ROLE"}}; }

Role parse_role(const Reply& reply) {
  if (reply.type != Reply::Type::Array || reply.elements.empty()) return Role::Unknown;
  const Reply& first = reply.elements.front();
  if (first.type != Reply::Type::String && first.type != Reply::Type::Status) return Role::Unknown;
  if (first.str == "master") return Role::Master;
  if (first.str == "slave" || first.str == "replica") return Role::Replica;
  if (first.str == "sentinel") return Role::Sentinel;
  return Role::Unknown;
}

void expect_master(const Reply& reply, const std::string& where) {
  if (reply.is_error()) throw_reply_error(reply.str + " (ROLE at " + where + ")");
  const Role role = parse_role(reply);
  if (role == Role::Master) return;
  throw ConnectionError(where + " is not the master (ROLE says " + role_name(role) +
                        "): the service failed over, or is failing over; re-resolve the master");
}

Role probe_role(const Address& address, const LinkOptions& options) {
  ControlLink link(address, options);
  const Reply r = link.call({"ROLE"});
  if (r.is_error()) throw_reply_error(r.str + " (ROLE at " + address.to_string() + ")");
  return parse_role(r);
}

// --- SentinelResolver ----------------------------------------------------------------------

SentinelResolver::SentinelResolver(SentinelOptions options) : options_(std::move(options)) {
  if (options_.sentinels.empty()) throw InvalidArgument("a Sentinel service needs at least one sentinel address");
  if (options_.service.empty()) throw InvalidArgument("a Sentinel service needs the master's service name");
  for (const auto& s : options_.sentinels) {
    if (s.host.empty()) throw InvalidArgument("a sentinel address has an empty host");
    if (s.port < 1 || s.port > 65535) {
      throw InvalidArgument("sentinel " + s.to_string() + ": port must be 1-65535");
    }
  }
  order_ = options_.sentinels;
}

std::vector<Address> SentinelResolver::sentinels() const {
  std::lock_guard lock(mu_);
  return order_;
}

void SentinelResolver::promote(const Address& sentinel) {
  std::lock_guard lock(mu_);
  auto it = std::find(order_.begin(), order_.end(), sentinel);
  if (it != order_.end()) std::rotate(order_.begin(), it, it + 1);
}

std::optional<Address> SentinelResolver::parse_master_reply(const Reply& reply) {
  if (reply.is_nil()) return std::nullopt;
  if (reply.type == Reply::Type::Array && reply.elements.empty()) return std::nullopt;  // RESP3-ish empty
  if (reply.type != Reply::Type::Array || reply.elements.size() != 2 ||
      reply.elements[0].type != Reply::Type::String || reply.elements[1].type != Reply::Type::String) {
    throw ProtocolError("unexpected reply to SENTINEL get-master-addr-by-name (expected [host, port])");
  }
  auto port = parse_port(reply.elements[1].str);
  if (!port || reply.elements[0].str.empty()) {
    throw ProtocolError("SENTINEL get-master-addr-by-name gave an invalid address");
  }
  return Address{reply.elements[0].str, *port};
}

Address SentinelResolver::resolve() {
  const std::vector<Address> order = sentinels();
  std::string failures;
  bool all_auth = true;
  for (const auto& s : order) {
    std::string why;
    try {
      ControlLink link(s, options_.link);
      const Reply r = link.call({"SENTINEL", "get-master-addr-by-name", options_.service});
      if (r.is_error()) {
        why = s.to_string() + ": " + printable(r.str);
        all_auth = false;
      } else if (auto master = parse_master_reply(r)) {
        promote(s);
        return *master;
      } else {
        why = s.to_string() + ": knows no master named '" + printable(options_.service) + "'";
        all_auth = false;
      }
    } catch (const AuthenticationError& e) {
      why = e.what();
    } catch (const Error& e) {  // ConnectionError, TimeoutError, ProtocolError
      why = e.what();
      all_auth = false;
    }
    if (!failures.empty()) failures += "; ";
    // Every failure names its sentinel (a TLS error, for one, names only the host).
    if (why.find(s.to_string()) == std::string::npos) failures += s.to_string() + ": ";
    failures += why;
  }
  const std::string message = "no sentinel gave the master of service '" + printable(options_.service) +
                              "': " + failures;
  if (all_auth) throw AuthenticationError(message);
  throw ConnectionError(message);
}

// --- SwitchMasterWatcher -------------------------------------------------------------------

SwitchMasterWatcher::SwitchMasterWatcher(std::shared_ptr<SentinelResolver> resolver, Callback on_switch,
                                         std::chrono::milliseconds ping_interval)
    : resolver_(std::move(resolver)), on_switch_(std::move(on_switch)), ping_interval_(ping_interval) {
  if (!resolver_) throw InvalidArgument("SwitchMasterWatcher needs a SentinelResolver");
  if (!on_switch_) throw InvalidArgument("SwitchMasterWatcher needs a callback");
  if (ping_interval_.count() <= 0) throw InvalidArgument("ping_interval must be > 0 ms");
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

SwitchMasterWatcher::~SwitchMasterWatcher() {
  stop();
  ::close(wake_fd_);
}

void SwitchMasterWatcher::start(std::optional<Address> known) {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  drain_wake();
  stopping_ = false;
  thread_ = std::thread([this, known = std::move(known)] { run(known); });
}

void SwitchMasterWatcher::stop() {
  std::thread t;
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    t = std::move(thread_);
  }
  stopping_ = true;
  wake();
  t.join();
}

void SwitchMasterWatcher::request_resolve() noexcept {
  resolve_requested_ = true;
  wake();
}

void SwitchMasterWatcher::wake() noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto ignored = ::write(wake_fd_, &one, sizeof one);
}

void SwitchMasterWatcher::drain_wake() noexcept {
  std::uint64_t count = 0;
  [[maybe_unused]] auto ignored = ::read(wake_fd_, &count, sizeof count);
}

std::optional<Address> SwitchMasterWatcher::subscribed_to() const {
  std::lock_guard lock(mu_);
  return current_;
}

std::optional<Address> SwitchMasterWatcher::parse_switch(std::string_view payload, std::string_view service) {
  std::vector<std::string_view> parts;
  while (!payload.empty()) {
    auto sp = payload.find(' ');
    if (sp != 0) parts.push_back(payload.substr(0, sp));
    if (sp == std::string_view::npos) break;
    payload = payload.substr(sp + 1);
  }
  if (parts.size() != 5 || parts[0] != service) return std::nullopt;
  auto port = parse_port(parts[4]);
  if (!port) return std::nullopt;
  return Address{std::string(parts[3]), *port};
}

void SwitchMasterWatcher::report(const Address& a, std::optional<Address>& last) {
  if (last && *last == a) return;
  last = a;
  try {
    on_switch_(a);
  } catch (...) {
    // The callback's contract is not to throw; the watcher keeps following regardless.
  }
}

void SwitchMasterWatcher::run(std::optional<Address> known) {
  std::optional<Address> last = std::move(known);
  const LinkOptions& link_options = resolver_->options().link;
  const std::string& service = resolver_->options().service;
  std::chrono::milliseconds backoff{100};
  while (!stopping_) {
    bool subscribed = false;
    for (const Address& s : resolver_->sentinels()) {
      if (stopping_) return;
      try {
        ControlLink link(s, link_options);
        link.send({"SUBSCRIBE", "+switch-master"});
        // Not woken by request_resolve(): the wait is short, and a session answers requests.
        auto confirm = link.next(deadline_after(link_options.command_timeout));
        if (stopping_) return;
        if (!confirm) throw TimeoutError("no SUBSCRIBE confirmation from " + s.to_string());
        if (confirm->is_error()) throw_reply_error(confirm->str);
        // Subscribed first, asked second: a switch before the question shows in its answer,
        // one after it arrives as a message.
        std::optional<Address> now_master;
        {
          ControlLink ask(s, link_options);
          now_master = SentinelResolver::parse_master_reply(
              ask.call({"SENTINEL", "get-master-addr-by-name", service}).check());
        }
        if (!now_master) continue;  // this sentinel does not monitor the service
        resolver_->promote(s);
        {
          std::lock_guard lock(mu_);
          current_ = s;
        }
        ++subscriptions_;
        subscribed = true;
        backoff = std::chrono::milliseconds(100);
        report(*now_master, last);
        session(link, last);
      } catch (const std::exception&) {
        // This sentinel is unreachable or failed: the next one in the order takes over.
      }
      {
        std::lock_guard lock(mu_);
        current_.reset();
      }
      if (stopping_) return;
    }
    if (!subscribed) {
      // Every sentinel failed in a row: wait before the next pass (stop() ends the wait).
      const TimePoint until = SteadyClock::now() + jittered(backoff);
      while (!stopping_ && SteadyClock::now() < until) {
        pollfd p{wake_fd_, POLLIN, 0};
        ::poll(&p, 1, poll_timeout_ms(until));
        drain_wake();  // a resolve request waits for the next session, which reports the master anyway
      }
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    }
  }
}

void SwitchMasterWatcher::session(ControlLink& link, std::optional<Address>& last) {
  const std::string& service = resolver_->options().service;
  const auto timeout = resolver_->options().link.command_timeout;
  const auto pong_wait = timeout.count() > 0 ? timeout : 3 * ping_interval_;
  TimePoint next_ping = SteadyClock::now() + ping_interval_;
  TimePoint pong_deadline = kNever;
  TimePoint resolve_at = kNever;
  while (!stopping_) {
    TimePoint now = SteadyClock::now();
    if (resolve_requested_.exchange(false) && resolve_at == kNever) {
      resolve_at = std::max(now, last_resolve_ + kMinResolveSpacing);
    }
    if (now >= resolve_at) {
      resolve_at = kNever;
      last_resolve_ = now;
      try {
        report(resolver_->resolve(), last);
      } catch (const std::exception&) {
        // No sentinel answered now: the next request, or +switch-master, will.
      }
      continue;
    }
    auto message = link.next(std::min(pong_deadline != kNever ? pong_deadline : next_ping, resolve_at), wake_fd_);
    if (stopping_) return;
    drain_wake();
    now = SteadyClock::now();
    if (!message) {
      if (pong_deadline != kNever) {
        if (now >= pong_deadline) throw TimeoutError("sentinel " + link.address().to_string() + " left a PING unanswered");
      } else if (now >= next_ping) {
        link.send({"PING"});
        pong_deadline = now + pong_wait;
        next_ping = now + ping_interval_;
      }
      continue;
    }
    if (message->type != Reply::Type::Array || message->elements.empty()) continue;
    const auto& e = message->elements;
    if (e[0].str == "pong") {
      pong_deadline = kNever;
    } else if (e[0].str == "message" && e.size() >= 3 && e[1].str == "+switch-master") {
      if (auto a = parse_switch(e[2].str, service)) report(*a, last);
    }
  }
}

}  // namespace redcount::redis
