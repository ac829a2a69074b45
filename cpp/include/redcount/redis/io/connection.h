// One connection to a Redis server: a non-blocking connect (TCP with TCP_NODELAY and
// keepalive, or a Unix socket), TLS when asked, then the handshake pipelined in one write
// (AUTH, SELECT, CLIENT SETNAME redcount, SCRIPT LOAD of every script), then the data path:
// an output buffer written in one syscall, a RESP parser, and the FIFO of replies it waits
// for.
//
//   Connection c(options, tls_context, wake);   // wake(): a host name has been resolved
//   c.open(now);                          // throws ConnectionError (refused at once...)
//   while (!c.ready()) { poll(c.fd(), c.wanted()); c.advance(now); }   // throws on failure
//   // (while resolving(), fd() is -1: call advance() after wake() ran)
//   start_round(job, c.out(), c.inflight(), c.stream_end());
//   c.flush();  c.read([&](Reply&& r) { ... });
//
// Not thread-safe: one thread at a time (the engine's reactor, or a caller that borrowed
// the idle connection from it) uses a connection.
#pragma once

#include <netdb.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "redcount/common/options.h"
#include "redcount/redis/io/pipeline.h"
#include "redcount/redis/io/resolver.h"
#include "redcount/redis/io/resp.h"
#include "redcount/redis/io/transport.h"

namespace redcount::redis {

class Connection {
 public:
  enum class State { Resolving, Connecting, Securing, Hello, Ready };

  // A host name that is not a numeric address is resolved on a thread of its own, and
  // `on_resolved` runs there when it is done; without it, open() resolves in place.
  Connection(const StoreOptions& options, std::shared_ptr<TlsContext> tls, std::function<void()> on_resolved = {});
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts connecting. Throws the user-facing error when that fails at once.
  void open(TimePoint now);
  // Makes progress on connect / TLS / handshake after a readiness event. Throws
  // ConnectionError, TimeoutError (never here: see expired()), AuthenticationError or
  // ReplyError (a refused SELECT) when the set-up failed.
  void advance();
  // The set-up did not finish within connect_timeout: the error to report.
  [[noreturn]] void throw_setup_timeout() const;

  State state() const noexcept { return state_; }
  bool ready() const noexcept { return state_ == State::Ready; }
  bool resolving() const noexcept { return state_ == State::Resolving; }
  // The socket (-1 while resolving). It changes when a connect falls back to the host's
  // next address; fd_epoch() counts the changes, so a poller can tell a reused number.
  int fd() const noexcept;
  std::uint64_t fd_epoch() const noexcept { return fd_epoch_; }
  // EPOLLIN/EPOLLOUT the current state needs (data path: EPOLLIN, plus EPOLLOUT while
  // output is pending).
  std::uint32_t wanted() const noexcept;
  TimePoint setup_deadline() const noexcept { return setup_deadline_; }
  // The server's major version from the handshake's INFO server (0: not known, e.g. INFO
  // refused by an ACL). Set once the connection is ready.
  int server_major() const noexcept { return server_major_; }

  // Data path.
  std::string& out() noexcept { return out_; }
  std::deque<Expect>& inflight() noexcept { return inflight_; }
  // Stream offsets: bytes ever appended to out() / handed to the kernel.
  std::uint64_t stream_end() const noexcept { return written_ + (out_.size() - out_pos_); }
  std::uint64_t written() const noexcept { return written_; }
  bool has_output() const noexcept { return out_pos_ < out_.size(); }
  // Drops output not yet written (the connection is being given up).
  void discard_output() noexcept {
    out_.clear();
    out_pos_ = 0;
  }
  bool idle() const noexcept { return inflight_.empty() && !has_output(); }
  // One write of everything pending; true when all of it went out. Throws ConnectionError.
  bool flush();
  // Reads what the socket has and hands every complete reply to on_reply. Throws
  // ConnectionError (EOF, reset) or ProtocolError.
  template <class F>
  void read(F&& on_reply) {
    for (;;) {
      const std::size_t n = transport_->read(buf_, sizeof buf_);
      if (n == 0) break;
      parser_.feed(buf_, n);
      last_progress_ = SteadyClock::now();
      while (auto r = parser_.next()) on_reply(std::move(*r));
      // A short read drained the socket; TLS may still hold decrypted bytes.
      if (n < sizeof buf_ && !transport_->has_buffered()) break;
    }
  }

  // For a synchronous caller that borrowed this idle connection: true when the socket
  // looks usable (no EOF or stray bytes waiting); one non-blocking peek.
  bool alive() const noexcept;
  // Writes everything pending, waiting for the socket until `deadline`. False on timeout.
  bool flush_until(TimePoint deadline);
  // Waits for bytes until `deadline` and feeds them to the parser, handing complete
  // replies to on_reply. False on timeout. Until `spin_until` (if later than now) it polls
  // the socket without sleeping first.
  template <class F>
  bool read_until(TimePoint deadline, F&& on_reply, TimePoint spin_until = TimePoint{}) {
    const TimePoint now = SteadyClock::now();
    if (now >= deadline) return false;  // a reply trickling in must not outlast its deadline
    if (blocking_recv_ && deadline - now >= recv_timeout_ - std::chrono::milliseconds(1)) {
      // Plain sockets stay in blocking mode (the reactor passes MSG_DONTWAIT), so a caller
      // waits in recv() itself, bounded by SO_RCVTIMEO = command_timeout: one syscall. Only
      // while that ends by the deadline (give or take 1 ms): a later read of the same reply
      // (a large one, or one arriving in pieces) polls until the deadline instead.
      const std::size_t n = recv_blocking(deadline, spin_until);
      if (n == 0) return SteadyClock::now() < deadline;
      parser_.feed(buf_, n);
      last_progress_ = SteadyClock::now();
      while (auto r = parser_.next()) on_reply(std::move(*r));
      if (n == sizeof buf_) read(on_reply);
      return true;
    }
    if (!wait_readable(deadline, spin_until)) return false;
    read(on_reply);
    return true;
  }

  TimePoint last_progress() const noexcept { return last_progress_; }
  void touch(TimePoint now) noexcept { last_progress_ = now; }
  // Where this connection goes, for messages ("127.0.0.1:6379", "unix socket /x.sock").
  const std::string& where() const noexcept { return where_; }
  // Half-closes the socket so that a caller blocked on it wakes up (close()).
  void interrupt() noexcept;

 private:
  void connect_to(AddrList addrs);
  void start_connect();
  void on_connected();
  void send_hello();
  void check_hello(std::size_t index, const Reply& reply);
  // Until `deadline`; polling without sleeping until spin_until first.
  bool wait_readable(TimePoint deadline, TimePoint spin_until);
  // One blocking recv into buf_ (after polling without sleeping until spin_until); 0 when
  // it timed out. Throws on EOF and errors.
  std::size_t recv_blocking(TimePoint deadline, TimePoint spin_until);
  [[noreturn]] void fail_connect(int err) const;

  const StoreOptions& options_;
  std::shared_ptr<TlsContext> tls_;
  std::string where_;
  State state_ = State::Connecting;
  int fd_ = -1;  // until the transport owns it
  std::unique_ptr<Transport> transport_;
  std::function<void()> on_resolved_;
  std::shared_ptr<Resolution> resolution_;
  AddrList addrs_;
  addrinfo* next_addr_ = nullptr;
  std::uint64_t fd_epoch_ = 0;
  int last_errno_ = 0;
  bool blocking_recv_ = false;
  std::chrono::milliseconds recv_timeout_{0};  // SO_RCVTIMEO when blocking_recv_ (0: none)
  TimePoint setup_deadline_ = kNever;

  std::vector<std::string> hello_;  // the first word of each handshake command
  std::size_t hello_seen_ = 0;
  int server_major_ = 0;

  resp::Parser parser_;
  std::string out_;
  std::size_t out_pos_ = 0;
  std::uint64_t written_ = 0;
  std::deque<Expect> inflight_;
  TimePoint last_progress_{};
  char buf_[16384];
};

// "127.0.0.1:6379" or "unix socket /path": how messages name the server.
std::string server_name(const StoreOptions& options);

}  // namespace redcount::redis
