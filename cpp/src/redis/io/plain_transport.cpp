// The plain (unencrypted) transport over a TCP or Unix socket. Every call passes
// MSG_DONTWAIT, so the socket itself may stay in blocking mode: that lets a synchronous
// caller that borrowed an idle connection block in recv() for its reply (one syscall)
// while the engine's reactor never blocks on the same socket.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "redcount/common/errors.h"
#include "redcount/redis/io/transport.h"

namespace redcount {
namespace {

class PlainTransport final : public Transport {
 public:
  explicit PlainTransport(int fd) : fd_(fd) {}
  ~PlainTransport() override { ::close(fd_); }
  PlainTransport(const PlainTransport&) = delete;
  PlainTransport& operator=(const PlainTransport&) = delete;

  int fd() const noexcept override { return fd_; }
  bool handshake() override { return true; }

  std::size_t read(char* buf, std::size_t len) override {
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, len, MSG_DONTWAIT);
      if (n > 0) return static_cast<std::size_t>(n);
      if (n == 0) throw ConnectionError("the server closed the connection");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        want_ = Want::Read;
        return 0;
      }
      throw ConnectionError(std::string("read failed: ") + std::strerror(errno));
    }
  }

  // Sends until all of it is out or the socket buffer is full. A short count always means
  // "full": want() is then Write, so a caller polls for writability, not for a reply that
  // cannot come before the rest of the request is sent.
  std::size_t write(const char* buf, std::size_t len) override {
    std::size_t put = 0;
    while (put < len) {
      const ssize_t n = ::send(fd_, buf + put, len - put, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n >= 0) {
        put += static_cast<std::size_t>(n);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        want_ = Want::Write;
        return put;
      }
      if (put > 0) {
        // Count what went out (the server may run it), and fail on the retry of the rest.
        want_ = Want::Write;
        return put;
      }
      throw ConnectionError(std::string("write failed: ") + std::strerror(errno));
    }
    want_ = Want::Read;  // nothing left to write: only replies are awaited
    return put;
  }

  Want want() const noexcept override { return want_; }
  std::string kind() const override { return "plain"; }

 private:
  int fd_;
  Want want_ = Want::Read;
};

}  // namespace

std::unique_ptr<Transport> make_plain_transport(int fd) { return std::make_unique<PlainTransport>(fd); }

}  // namespace redcount
