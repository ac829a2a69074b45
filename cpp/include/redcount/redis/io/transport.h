// A byte stream to one Redis server over a connected, non-blocking socket: plain TCP or
// Unix, or TLS. The engine owns the polling (epoll) and the RESP framing; a transport only
// moves bytes and says which readiness it waits for.
//
//   auto t = make_plain_transport(fd);
//   while (!t->handshake()) wait_for(t->want());   // TLS: the handshake; plain: at once
//   std::size_t n = t->write(buf, len);             // < len: wait for want(), retry the rest
//   std::size_t got = t->read(in, sizeof in);       // 0 = would block: wait for want()
//
// A transport is used by one thread at a time (the engine's); it closes its fd on
// destruction. Errors throw ConnectionError (TimeoutError never: deadlines are the engine's)
// with a message naming the cause (refused certificate, hostname mismatch, reset...).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace redcount {

class Transport {
 public:
  enum class Want { Read, Write };
  virtual ~Transport() = default;
  virtual int fd() const noexcept = 0;
  // Drives the connection set-up (the TLS handshake); true when established, false when
  // it must wait for want() first.
  virtual bool handshake() = 0;
  // Up to `len` bytes into `buf`; 0 when it would block. Throws ConnectionError on EOF.
  virtual std::size_t read(char* buf, std::size_t len) = 0;
  // Writes up to `len` bytes; returns how many. Less than `len` (0 included) means it must
  // wait for want() first: the caller keeps the rest and retries with the same bytes. (A
  // failure after some bytes went out returns their count, and the retry throws.)
  virtual std::size_t write(const char* buf, std::size_t len) = 0;
  // After a read or handshake that returned 0 / false, or a write that returned less than
  // asked: the readiness that lets it make progress.
  virtual Want want() const noexcept = 0;
  // Bytes already received and decrypted but not yet returned by read(): epoll will not
  // report them, so the engine reads until read() returns 0.
  virtual bool has_buffered() const noexcept { return false; }
  // "TLS" or "plain", for messages.
  virtual std::string kind() const = 0;
};

struct StoreOptions;

// Takes ownership of a connected non-blocking socket.
std::unique_ptr<Transport> make_plain_transport(int fd);

// One store's TLS configuration (an SSL_CTX with its CA, client certificate and verify
// mode), shared by its connections. Throws InvalidArgument for unreadable or mismatched
// certificate files, naming the file.
class TlsContext;
std::shared_ptr<TlsContext> make_tls_context(const StoreOptions& options);
// Takes ownership of a connected non-blocking socket and starts TLS on it; handshake()
// then drives the TLS handshake. `server_name` is sent as SNI and, with
// ssl_check_hostname, must match the server's certificate.
std::unique_ptr<Transport> make_tls_transport(int fd, std::shared_ptr<TlsContext> context,
                                              const std::string& server_name);

}  // namespace redcount
