#include "redcount/redis/io/connection.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "redcount/redis/io/role.h"

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

// Polls one fd; false on timeout. EINTR restarts with the remaining time.
bool wait_fd(int fd, short events, TimePoint deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) throw ConnectionError(std::string("poll failed: ") + std::strerror(errno));
  }
}

}  // namespace

std::string server_name(const StoreOptions& options) {
  if (options.kind == StoreOptions::Kind::Unix) return "unix socket " + options.unix_path;
  if (options.host.find(':') != std::string::npos) return "[" + options.host + "]:" + std::to_string(options.port);
  return options.host + ":" + std::to_string(options.port);
}

Connection::Connection(const StoreOptions& options, std::shared_ptr<TlsContext> tls,
                       std::function<void()> on_resolved)
    : options_(options), tls_(std::move(tls)), where_(server_name(options)), on_resolved_(std::move(on_resolved)) {}

Connection::~Connection() {
  if (!transport_ && fd_ >= 0) ::close(fd_);
}

int Connection::fd() const noexcept { return transport_ ? transport_->fd() : fd_; }

void Connection::open(TimePoint now) {
  setup_deadline_ = options_.connect_timeout.count() > 0 ? now + options_.connect_timeout : kNever;
  last_progress_ = now;
  if (options_.kind == StoreOptions::Kind::Unix) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (options_.unix_path.size() >= sizeof addr.sun_path) {
      throw ConnectionError("cannot connect to " + where_ + ": the path is longer than " +
                            std::to_string(sizeof addr.sun_path - 1) + " bytes");
    }
    std::memcpy(addr.sun_path, options_.unix_path.c_str(), options_.unix_path.size() + 1);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail_connect(errno);
    ++fd_epoch_;
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return on_connected();
    if (errno == EINPROGRESS) return;
    fail_connect(errno);
  }
  AddrList numeric;
  if (resolve_numeric(options_.host, options_.port, numeric)) return connect_to(std::move(numeric));
  if (!on_resolved_) return connect_to(resolve(options_.host, options_.port));  // nobody else to serve
  // getaddrinfo() may wait seconds on DNS: it runs on a thread of its own, and advance()
  // goes on once on_resolved_ has woken the reactor.
  try {
    resolution_ = Resolution::start(options_.host, options_.port, on_resolved_);
  } catch (const std::system_error& e) {
    throw ConnectionError("cannot resolve host '" + options_.host + "': no thread to resolve it on (" + e.what() + ")");
  }
  state_ = State::Resolving;
}

void Connection::connect_to(AddrList addrs) {
  resolution_.reset();
  if (!addrs.list) {
    throw ConnectionError("cannot resolve host '" + options_.host + "' (" + addrs.error +
                          "); check the host name in the URL");
  }
  addrs_ = std::move(addrs);
  next_addr_ = addrs_.list.get();
  state_ = State::Connecting;
  start_connect();
}

void Connection::start_connect() {
  while (next_addr_ != nullptr) {
    const addrinfo* a = next_addr_;
    fd_ = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ >= 0) {
      ++fd_epoch_;
      if (::connect(fd_, a->ai_addr, a->ai_addrlen) == 0) return on_connected();
      if (errno == EINPROGRESS) return;
    }
    last_errno_ = errno;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    next_addr_ = next_addr_->ai_next;
  }
  fail_connect(last_errno_);
}

void Connection::fail_connect(int err) const {
  const std::string why = std::strerror(err);
  if (err == ECONNREFUSED) {
    throw ConnectionError("connection refused by " + where_ + ": is redis-server running there? (" + why + ")");
  }
  if (err == ETIMEDOUT) {
    throw TimeoutError("timed out connecting to " + where_ + " (" + why + ")");
  }
  if (options_.kind == StoreOptions::Kind::Unix) {
    throw ConnectionError("cannot connect to " + where_ + ": " + why + "; check the socket path and permissions");
  }
  throw ConnectionError("cannot connect to " + where_ + ": " + why);
}

void Connection::throw_setup_timeout() const {
  const std::string ms = std::to_string(options_.connect_timeout.count());
  switch (state_) {
    case State::Resolving:
      throw TimeoutError("timed out resolving host '" + options_.host + "' after " + ms + " ms (connect_timeout)");
    case State::Connecting:
      throw TimeoutError("timed out connecting to " + where_ + " after " + ms + " ms (connect_timeout)");
    case State::Securing:
      throw TimeoutError("timed out in the TLS handshake with " + where_ + " after " + ms + " ms (connect_timeout)");
    default:
      throw TimeoutError("timed out in the connection handshake with " + where_ + " after " + ms +
                         " ms (connect_timeout): AUTH, SELECT and SCRIPT LOAD went unanswered");
  }
}

void Connection::advance() {
  switch (state_) {
    case State::Resolving:
      if (resolution_->done()) connect_to(resolution_->take());
      return;
    case State::Connecting: {
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err == 0) return on_connected();
      if (options_.kind == StoreOptions::Kind::Unix || next_addr_ == nullptr) fail_connect(err);
      last_errno_ = err;
      ::close(fd_);
      fd_ = -1;
      next_addr_ = next_addr_->ai_next;
      return start_connect();
    }
    case State::Securing:
      if (transport_->handshake()) send_hello();
      return;
    case State::Hello:
      if (has_output()) flush();
      read([this](Reply&& r) { check_hello(hello_seen_++, r); });
      return;
    case State::Ready:
      return;
  }
}

void Connection::on_connected() {
  addrs_ = AddrList{};
  next_addr_ = nullptr;
  if (options_.kind == StoreOptions::Kind::Tcp) {
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // requests are whole messages
    if (options_.keepalive) {
      // Finds a peer that vanished without a word (a host that died) within about 30 s.
      int idle = 15, interval = 5, count = 3;
      ::setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
      ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
      ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
      ::setsockopt(fd_, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    }
  }
  const int fd = fd_;
  fd_ = -1;
  if (options_.tls) {
    const std::string name = options_.ssl_server_name.empty() ? options_.host : options_.ssl_server_name;
    transport_ = make_tls_transport(fd, tls_, name);
    state_ = State::Securing;
    if (transport_->handshake()) send_hello();
    return;
  }
  // Blocking mode with a receive timeout: see read_until(). Every other read and write
  // passes MSG_DONTWAIT.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(options_.command_timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((options_.command_timeout.count() % 1000) * 1000);
    blocking_recv_ = ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0;
    recv_timeout_ = options_.command_timeout;
  }
  transport_ = make_plain_transport(fd);
  send_hello();
}

void Connection::send_hello() {
  std::vector<std::vector<std::string_view>> cmds;
  if (!options_.password.empty()) {
    if (options_.username.empty()) {
      cmds.push_back({"AUTH", options_.password});
    } else {
      cmds.push_back({"AUTH", options_.username, options_.password});
    }
  }
  const std::string db = std::to_string(options_.db);
  if (options_.db != 0) cmds.push_back({"SELECT", db});
  cmds.push_back({"CLIENT", "SETNAME", "redcount"});
  // The version decides which command forms this connection may use (PEXPIREAT ... LT
  // needs 7.0).
  cmds.push_back({"INFO", "server"});
  // Behind Sentinel the address came from a sentinel and may be stale (a failover since):
  // a connection that reached a replica must not carry writes.
  if (options_.sentinel) cmds.push_back({"ROLE"});
  // Scripts are not replicated since Redis 7.0: a promoted replica has none, so every
  // connection loads them up front (the NOSCRIPT reload path stays for SCRIPT FLUSH).
  for (const Script* s : all_scripts()) cmds.push_back({"SCRIPT", "LOAD", s->source});
  for (const auto& c : cmds) {
    resp::format_args(out_, c);
    hello_.emplace_back(c[0] == "CLIENT" ? "CLIENT" : std::string(c[0]));
  }
  state_ = State::Hello;
  flush();
}

void Connection::check_hello(std::size_t index, const Reply& reply) {
  if (index >= hello_.size()) throw ProtocolError("unexpected reply from " + where_ + " during the handshake");
  if (hello_[index] == "ROLE") {
    expect_master(reply, where_);  // throws ConnectionError (not applied) unless master
  } else if (reply.is_error()) {
    const std::string& cmd = hello_[index];
    const std::string& text = reply.str;
    const std::string user = options_.username.empty() ? "default" : options_.username;
    if (cmd == "AUTH") {
      throw AuthenticationError("authentication to " + where_ + " as user '" + user + "' failed: " + text +
                                "; check the user name and password in the URL");
    }
    if (text.starts_with("NOAUTH")) {
      throw AuthenticationError(where_ + " requires a password (" + text +
                                "); put it in the URL: redis://[user]:password@host:port");
    }
    if (cmd == "SELECT") {
      // Redis answers "ERR SELECT is not allowed in cluster mode" (its text is the only sign).
      const bool cluster = text.find("cluster mode") != std::string::npos;
      throw ReplyError("cannot select database " + std::to_string(options_.db) + " on " + where_ + ": " + text +
                       (cluster ? "; this server does not support databases in cluster mode (Valkey 9 does, with "
                                  "cluster-databases in its configuration): use /0 or no /db in the URL"
                                : "; check the /db part of the URL"));
    }
    // CLIENT SETNAME, INFO or SCRIPT LOAD refused (an ACL without them, a server still
    // loading): harmless here; a script call then meets NOSCRIPT or LOADING and deals with
    // it, and an unknown version means the forms every version has.
  } else if (hello_[index] == "INFO" && reply.type == Reply::Type::String) {
    const std::string_view text = reply.str;
    const std::size_t at = text.find("redis_version:");
    if (at != std::string_view::npos) {
      int major = 0;
      for (std::size_t i = at + 14; i < text.size() && text[i] >= '0' && text[i] <= '9' && major < 1000; ++i) {
        major = major * 10 + (text[i] - '0');
      }
      server_major_ = major;
    }
  }
  if (index + 1 == hello_.size()) {
    hello_.clear();
    hello_seen_ = 0;
    state_ = State::Ready;
  }
}

std::uint32_t Connection::wanted() const noexcept {
  switch (state_) {
    case State::Resolving:
      return 0;
    case State::Connecting:
      return EPOLLOUT;
    case State::Securing:
      return transport_->want() == Transport::Want::Write ? EPOLLOUT : EPOLLIN;
    default: {
      std::uint32_t ev = EPOLLIN;
      if (has_output() || transport_->want() == Transport::Want::Write) ev |= EPOLLOUT;
      return ev;
    }
  }
}

bool Connection::flush() {
  if (!has_output()) return true;
  const std::size_t n = transport_->write(out_.data() + out_pos_, out_.size() - out_pos_);
  out_pos_ += n;
  written_ += n;
  if (out_pos_ < out_.size()) return false;
  out_pos_ = 0;
  if (out_.capacity() > (1u << 20)) {
    std::string().swap(out_);  // do not keep a huge batch's buffer for ever
  } else {
    out_.clear();
  }
  return true;
}

bool Connection::alive() const noexcept {
  // Readable while idle means EOF (the server closed it: restart, CLIENT KILL, timeout)
  // or bytes nobody asked for; either way the connection must not carry a request.
  pollfd p{fd(), POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 0;
}

bool Connection::flush_until(TimePoint deadline) {
  while (!flush()) {
    const short ev = transport_->want() == Transport::Want::Read ? POLLIN : POLLOUT;
    if (!wait_fd(fd(), ev, deadline)) return false;
  }
  return true;
}

std::size_t Connection::recv_blocking(TimePoint deadline, TimePoint spin_until) {
  // The poll: non-blocking reads until the reply's first bytes or spin_until (never past the
  // deadline), so a reply that comes back within it costs no sleep and no wake-up.
  const TimePoint until = std::min(spin_until, deadline);
  while (SteadyClock::now() < until) {
    const ssize_t n = ::recv(fd(), buf_, sizeof buf_, MSG_DONTWAIT);
    if (n > 0) return static_cast<std::size_t>(n);
    if (n == 0) throw ConnectionError("the server closed the connection");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      throw ConnectionError(std::string("read failed: ") + std::strerror(errno));
    }
    ::sched_yield();  // a process or thread waiting for this CPU runs first
  }
  for (;;) {
    const ssize_t n = ::recv(fd(), buf_, sizeof buf_, 0);
    if (n > 0) return static_cast<std::size_t>(n);
    if (n == 0) throw ConnectionError("the server closed the connection");
    if (errno == EINTR) {
      if (SteadyClock::now() >= deadline) return 0;
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw ConnectionError(std::string("read failed: ") + std::strerror(errno));
  }
}

bool Connection::wait_readable(TimePoint deadline, TimePoint spin_until) {
  if (transport_->has_buffered()) return true;
  const short ev = transport_->want() == Transport::Want::Write ? POLLOUT : POLLIN;
  const TimePoint until = std::min(spin_until, deadline);
  while (SteadyClock::now() < until) {  // the poll before sleeping, as recv_blocking() does
    pollfd p{fd(), ev, 0};
    if (::poll(&p, 1, 0) > 0) return true;
    ::sched_yield();  // a process or thread waiting for this CPU runs first
  }
  return wait_fd(fd(), ev, deadline);
}

void Connection::interrupt() noexcept {
  if (fd() >= 0) ::shutdown(fd(), SHUT_RDWR);
}

}  // namespace redcount::redis
