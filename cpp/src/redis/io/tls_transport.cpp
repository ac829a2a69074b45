// TLS over a non-blocking socket with OpenSSL 3: the TlsContext (one SSL_CTX per store) and
// the TlsTransport (one SSL per connection). See transport.h for how the engine drives it.
//
// Two decisions that are easy to get wrong:
// - The socket is reached through our own BIO that uses send(MSG_NOSIGNAL)/recv: OpenSSL's
//   socket BIO calls write(), and a write to a connection the server has closed would raise
//   SIGPIPE and kill a process that has not ignored it (Python ignores it; C++ hosts may not).
// - Every failure becomes a ConnectionError in one function, describe_failure(), which names
//   the cause from the certificate verification result, what the handshake observed, and
//   the OpenSSL error queue (read by reason code, never by message text).
#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/redis/io/transport.h"

namespace redcount {
namespace {

struct SslCtxDeleter {
  void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
};
struct SslDeleter {
  void operator()(SSL* s) const noexcept { SSL_free(s); }
};
struct BioDeleter {
  void operator()(BIO* b) const noexcept { BIO_free(b); }
};

// What the handshake saw, for naming the cause of a failure afterwards. Filled by the
// OpenSSL callbacks below (on the engine's thread, inside SSL_do_handshake/SSL_read).
struct Observed {
  int verify_error = X509_V_OK;   // the first certificate the verifier refused...
  std::string verify_subject;     // ...its subject...
  std::string verify_not_after;   // ...its expiry date...
  std::string verify_names;       // ...and the names it lists (its subjectAltName)
  bool client_cert_requested = false;  // the server asked for a certificate we do not have
};

std::string openssl_reason(unsigned long e) {
  const char* r = ERR_reason_error_string(e);
  if (r) return r;
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

// The OpenSSL error queue is per thread: every call below clears it first, so what is
// there afterwards belongs to that call.
std::string take_error_queue() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    if (!out.empty()) out += "; ";
    out += openssl_reason(e);
  }
  return out;
}

std::string name_of(X509_NAME* name) {
  if (!name) return "?";
  std::unique_ptr<BIO, BioDeleter> mem(BIO_new(BIO_s_mem()));
  if (!mem || X509_NAME_print_ex(mem.get(), name, 0, XN_FLAG_RFC2253) < 0) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(mem.get(), &data);
  return n > 0 ? std::string(data, static_cast<std::size_t>(n)) : std::string();
}

std::string time_of(const ASN1_TIME* t) {
  if (!t) return "?";
  std::unique_ptr<BIO, BioDeleter> mem(BIO_new(BIO_s_mem()));
  if (!mem || ASN1_TIME_print(mem.get(), t) != 1) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(mem.get(), &data);
  return n > 0 ? std::string(data, static_cast<std::size_t>(n)) : std::string();
}

// "DNS:a, IP:127.0.0.1": what a certificate may be used for, for a hostname mismatch.
std::string alt_names_of(X509* cert) {
  std::string out;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (!names) return out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    std::string one;
    if (n->type == GEN_DNS) {
      const ASN1_STRING* dns = n->d.dNSName;
      one = "DNS:" + std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                                 static_cast<std::size_t>(ASN1_STRING_length(dns)));
    } else if (n->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = n->d.iPAddress;
      char text[INET6_ADDRSTRLEN] = "?";
      const int len = ASN1_STRING_length(ip);
      if (len == 4 || len == 16) inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(ip), text, sizeof text);
      one = std::string("IP:") + text;
    }
    if (one.empty()) continue;
    if (!out.empty()) out += ", ";
    out += one;
  }
  GENERAL_NAMES_free(names);
  return out;
}

bool is_ip_literal(const std::string& host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

int observed_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

Observed* observed_of(SSL* ssl) { return static_cast<Observed*>(SSL_get_ex_data(ssl, observed_index())); }

// Keeps OpenSSL's verdict; only remembers which certificate failed and why.
int verify_callback(int ok, X509_STORE_CTX* store) {
  if (ok) return ok;
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  Observed* seen = ssl ? observed_of(ssl) : nullptr;
  if (seen && seen->verify_error == X509_V_OK) {
    seen->verify_error = X509_STORE_CTX_get_error(store);
    if (X509* cert = X509_STORE_CTX_get_current_cert(store)) {
      seen->verify_subject = name_of(X509_get_subject_name(cert));
      seen->verify_not_after = time_of(X509_get0_notAfter(cert));
      seen->verify_names = alt_names_of(cert);
    }
  }
  return ok;
}

// Installed only when no client certificate is configured: OpenSSL calls it when the
// server sends a CertificateRequest. Sending none is still right (the server may only
// want one optionally); a later refusal can then say what was missing.
int client_cert_callback(SSL* ssl, X509**, EVP_PKEY**) {
  if (Observed* seen = observed_of(ssl)) seen->client_cert_requested = true;
  return 0;
}

// A private key protected by a passphrase would make OpenSSL prompt on the terminal; we
// have no passphrase option, so refuse and remember that one was asked for.
int no_passphrase_callback(char*, int, int, void* asked) {
  *static_cast<bool*>(asked) = true;
  return -1;
}

// --- a BIO over the socket that never raises SIGPIPE ------------------------------------
int bio_fd(BIO* b) { return static_cast<int>(reinterpret_cast<std::intptr_t>(BIO_get_data(b))); }

bool would_block(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

int bio_write(BIO* b, const char* data, int len) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::send(bio_fd(b), data, static_cast<std::size_t>(len), MSG_NOSIGNAL);
  if (n < 0 && would_block(errno)) BIO_set_retry_write(b);
  return static_cast<int>(n);
}

int bio_read(BIO* b, char* data, int len) {
  BIO_clear_retry_flags(b);
  const ssize_t n = ::recv(bio_fd(b), data, static_cast<std::size_t>(len), 0);
  if (n < 0 && would_block(errno)) BIO_set_retry_read(b);
  return static_cast<int>(n);
}

int bio_puts(BIO* b, const char* s) { return bio_write(b, s, static_cast<int>(std::strlen(s))); }

long bio_ctrl(BIO*, int cmd, long, void*) {
  // FLUSH must succeed (the data is already in the kernel); everything else (kTLS,
  // pending counts, push/pop) is "not supported", which OpenSSL handles.
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

int bio_create(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

struct BioMethod {
  BIO_METHOD* method = nullptr;
  BioMethod() {
    method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "redcount socket");
    if (!method || !BIO_meth_set_write(method, bio_write) || !BIO_meth_set_read(method, bio_read) ||
        !BIO_meth_set_puts(method, bio_puts) || !BIO_meth_set_ctrl(method, bio_ctrl) ||
        !BIO_meth_set_create(method, bio_create)) {
      BIO_meth_free(method);
      method = nullptr;
    }
  }
  ~BioMethod() { BIO_meth_free(method); }
  BioMethod(const BioMethod&) = delete;
  BioMethod& operator=(const BioMethod&) = delete;
};

BIO* socket_bio(int fd) {
  static const BioMethod m;
  if (!m.method) return nullptr;
  BIO* b = BIO_new(m.method);
  if (b) BIO_set_data(b, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)));
  return b;
}

void require_readable(const std::string& path, const char* option) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || ::access(path.c_str(), R_OK) != 0) {
    throw InvalidArgument(std::string("cannot read ") + option + " '" + path + "': " + std::strerror(errno));
  }
}

}  // namespace

// Immutable after construction, so one context is shared by every connection of a store
// and used from any thread (SSL_new on a configured SSL_CTX is thread-safe).
class TlsContext {
 public:
  explicit TlsContext(const StoreOptions& o)
      : verify_(o.ssl_cert_reqs != StoreOptions::CertReqs::None),
        check_hostname_(verify_ && o.ssl_check_hostname),
        has_client_cert_(!o.ssl_certfile.empty()),
        ca_certs_(o.ssl_ca_certs),
        certfile_(o.ssl_certfile),
        server_name_(o.ssl_server_name) {
    ERR_clear_error();
    ctx_.reset(SSL_CTX_new(TLS_client_method()));
    if (!ctx_) throw Error("TLS: cannot create an SSL_CTX: " + take_error_queue());
    SSL_CTX_set_min_proto_version(ctx_.get(), TLS1_2_VERSION);
    // Partial writes: the engine keeps the unwritten rest. Moving buffer: its write buffer
    // may be reallocated between a WANT_WRITE and the retry.
    SSL_CTX_set_mode(ctx_.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_default_passwd_cb(ctx_.get(), no_passphrase_callback);
    SSL_CTX_set_default_passwd_cb_userdata(ctx_.get(), &passphrase_asked_);

    if (!o.ssl_ca_certs.empty()) {
      require_readable(o.ssl_ca_certs, "ssl_ca_certs");
      struct stat st {};
      const bool is_dir = ::stat(o.ssl_ca_certs.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
      const int ok = is_dir ? SSL_CTX_load_verify_locations(ctx_.get(), nullptr, o.ssl_ca_certs.c_str())
                            : SSL_CTX_load_verify_locations(ctx_.get(), o.ssl_ca_certs.c_str(), nullptr);
      if (ok != 1) {
        throw InvalidArgument("ssl_ca_certs '" + o.ssl_ca_certs + "' holds no usable PEM CA certificate: " +
                              take_error_queue());
      }
    } else if (SSL_CTX_set_default_verify_paths(ctx_.get()) != 1) {
      throw InvalidArgument("TLS: cannot load the system's trusted CA certificates (" + take_error_queue() +
                            "); pass ssl_ca_certs");
    }

    if (!o.ssl_keyfile.empty() && o.ssl_certfile.empty()) {
      throw InvalidArgument("ssl_keyfile '" + o.ssl_keyfile + "' needs ssl_certfile (the client certificate)");
    }
    if (has_client_cert_) {
      const std::string& keyfile = o.ssl_keyfile.empty() ? o.ssl_certfile : o.ssl_keyfile;
      const char* key_option = o.ssl_keyfile.empty() ? "ssl_certfile (no ssl_keyfile given)" : "ssl_keyfile";
      require_readable(o.ssl_certfile, "ssl_certfile");
      require_readable(keyfile, key_option);
      if (SSL_CTX_use_certificate_chain_file(ctx_.get(), o.ssl_certfile.c_str()) != 1) {
        throw InvalidArgument("ssl_certfile '" + o.ssl_certfile + "' holds no usable PEM certificate: " +
                              take_error_queue());
      }
      const std::string mismatch = std::string(key_option) + " '" + keyfile +
                                   "' does not match the certificate in ssl_certfile '" + o.ssl_certfile + "'";
      if (SSL_CTX_use_PrivateKey_file(ctx_.get(), keyfile.c_str(), SSL_FILETYPE_PEM) != 1) {
        const unsigned long first = ERR_peek_error();
        if (ERR_GET_LIB(first) == ERR_LIB_X509 &&
            (ERR_GET_REASON(first) == X509_R_KEY_VALUES_MISMATCH || ERR_GET_REASON(first) == X509_R_KEY_TYPE_MISMATCH)) {
          ERR_clear_error();
          throw InvalidArgument(mismatch);
        }
        const std::string why = take_error_queue();
        if (passphrase_asked_) {
          throw InvalidArgument(std::string(key_option) + " '" + keyfile +
                                "' is encrypted with a passphrase; redcount needs an unencrypted key "
                                "(protect the file with its permissions instead)");
        }
        throw InvalidArgument(std::string(key_option) + " '" + keyfile + "' holds no usable PEM private key: " + why);
      }
      if (SSL_CTX_check_private_key(ctx_.get()) != 1) {
        ERR_clear_error();
        throw InvalidArgument(mismatch);
      }
    } else {
      SSL_CTX_set_client_cert_cb(ctx_.get(), client_cert_callback);
    }

    // required and optional both verify: a TLS server always presents a certificate, so
    // "verify it if presented" (CERT_OPTIONAL) is, for a client, the same as required
    // (Python's ssl module treats it the same way).
    SSL_CTX_set_verify(ctx_.get(), verify_ ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, verify_ ? verify_callback : nullptr);
    ERR_clear_error();
  }

  TlsContext(const TlsContext&) = delete;  // the passphrase callback points into it
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* get() const noexcept { return ctx_.get(); }
  bool verify() const noexcept { return verify_; }
  bool check_hostname() const noexcept { return check_hostname_; }
  bool has_client_cert() const noexcept { return has_client_cert_; }
  const std::string& ca_certs() const noexcept { return ca_certs_; }
  const std::string& certfile() const noexcept { return certfile_; }
  const std::string& server_name() const noexcept { return server_name_; }

 private:
  std::unique_ptr<SSL_CTX, SslCtxDeleter> ctx_;
  bool passphrase_asked_ = false;
  bool verify_;
  bool check_hostname_;
  bool has_client_cert_;
  std::string ca_certs_;
  std::string certfile_;
  std::string server_name_;
};

namespace {

// One connection; used by one thread at a time (the engine's), like every Transport.
class TlsTransport final : public Transport {
 public:
  TlsTransport(int fd, std::shared_ptr<TlsContext> context, std::string name)
      : fd_(fd), context_(std::move(context)), name_(std::move(name)) {
    ERR_clear_error();
    ssl_.reset(SSL_new(context_->get()));
    if (!ssl_) throw ConnectionError("TLS: cannot create a connection object: " + take_error_queue());
    SSL_set_ex_data(ssl_.get(), observed_index(), &observed_);
    BIO* bio = socket_bio(fd_);
    if (!bio) throw ConnectionError("TLS: cannot create the socket BIO: " + take_error_queue());
    SSL_set_bio(ssl_.get(), bio, bio);  // the SSL owns it from here
    SSL_set_connect_state(ssl_.get());

    const bool ip = is_ip_literal(name_);
    // SNI carries host names only (RFC 6066 forbids literal addresses).
    if (!ip && !name_.empty() && SSL_set_tlsext_host_name(ssl_.get(), name_.c_str()) != 1) {
      throw InvalidArgument("TLS: '" + name_ + "' cannot be sent as a server name (SNI): " + take_error_queue());
    }
    if (context_->check_hostname()) {
      if (name_.empty()) throw InvalidArgument("TLS: ssl_check_hostname needs a host name to check");
      X509_VERIFY_PARAM* param = SSL_get0_param(ssl_.get());
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      const int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name_.c_str()) : SSL_set1_host(ssl_.get(), name_.c_str());
      if (ok != 1) throw InvalidArgument("TLS: cannot check the certificate against '" + name_ + "': " + take_error_queue());
    }
  }

  ~TlsTransport() override {
    ssl_.reset();  // frees the BIO too; the BIO does not own the fd
    if (fd_ >= 0) ::close(fd_);
  }

  TlsTransport(const TlsTransport&) = delete;
  TlsTransport& operator=(const TlsTransport&) = delete;

  int fd() const noexcept override { return fd_; }

  bool handshake() override {
    if (established_) return true;
    ERR_clear_error();
    errno = 0;
    const int rc = SSL_do_handshake(ssl_.get());
    const int saved_errno = errno;
    if (rc == 1) {
      established_ = true;
      return true;
    }
    const int err = SSL_get_error(ssl_.get(), rc);
    if (retry_later(err)) return false;
    fail(err, saved_errno, "the TLS handshake");
  }

  std::size_t read(char* buf, std::size_t len) override {
    if (len == 0) return 0;
    ERR_clear_error();
    errno = 0;
    std::size_t got = 0;
    if (SSL_read_ex(ssl_.get(), buf, len, &got) == 1) {
      received_ = true;
      return got;
    }
    const int saved_errno = errno;
    const int err = SSL_get_error(ssl_.get(), 0);
    if (retry_later(err)) return 0;
    fail(err, saved_errno, "a read");
  }

  // With partial writes enabled, SSL_write_ex returns after each record (16 KB), so it is
  // called until all of `len` is out or it must wait. A short count then always comes with
  // want() saying what to wait for; the bytes of a record it could not send yet stay in
  // OpenSSL's buffer and are not counted, so the caller retries from the first byte not
  // counted, as OpenSSL requires.
  std::size_t write(const char* buf, std::size_t len) override {
    std::size_t total = 0;
    while (total < len) {
      ERR_clear_error();
      errno = 0;
      std::size_t put = 0;
      if (SSL_write_ex(ssl_.get(), buf + total, len - total, &put) == 1) {
        total += put;
        continue;
      }
      const int saved_errno = errno;
      const int err = SSL_get_error(ssl_.get(), 0);
      if (retry_later(err)) return total;
      if (total > 0) {
        // Count what went out (the server may run it), and fail on the retry of the rest.
        want_ = Want::Write;
        return total;
      }
      write_failed(err, saved_errno);
    }
    want_ = Want::Read;  // nothing left to write: only replies are awaited
    return total;
  }

  Want want() const noexcept override { return want_; }

  bool has_buffered() const noexcept override {
    return SSL_pending(ssl_.get()) > 0 || SSL_has_pending(ssl_.get()) == 1;
  }

  std::string kind() const override { return "TLS"; }

 private:
  [[noreturn]] void write_failed(int err, int saved_errno) {
    Failure failure = describe_failure(err, saved_errno, "a write");
    ERR_clear_error();
    if (!failure.named_cause) {
      // A server that refuses us after our side of the handshake is done (TLS 1.3 checks
      // the client certificate then) sends an alert and closes, and our next write meets
      // the reset. The alert is still in the receive queue: read it to name the cause.
      char scratch[512];
      std::size_t ignored = 0;
      errno = 0;
      if (SSL_read_ex(ssl_.get(), scratch, sizeof scratch, &ignored) != 1) {
        const int read_errno = errno;
        const int read_err = SSL_get_error(ssl_.get(), 0);
        Failure alert = describe_failure(read_err, read_errno, "a write");
        if (alert.named_cause) failure = std::move(alert);
      }
      ERR_clear_error();
    }
    throw ConnectionError(std::move(failure.message));
  }

  // WANT_READ and WANT_WRITE can each come from a read or a write (a TLS 1.3 key update, a
  // handshake message, a full socket buffer): record which one so the engine polls for it.
  bool retry_later(int err) noexcept {
    if (err == SSL_ERROR_WANT_READ) {
      want_ = Want::Read;
      return true;
    }
    if (err == SSL_ERROR_WANT_WRITE) {
      want_ = Want::Write;
      return true;
    }
    return false;
  }

  [[noreturn]] void fail(int ssl_error, int saved_errno, const char* during) {
    Failure failure = describe_failure(ssl_error, saved_errno, during);
    ERR_clear_error();
    throw ConnectionError(std::move(failure.message));
  }

  struct Failure {
    std::string message;
    bool named_cause;  // false: only a generic reset/EOF/unknown error was seen
  };

  // The one place that turns a failed OpenSSL call into words: the verifier's result, the
  // first error-queue reason we recognise, then what the socket said, in that order.
  // Consumes the (per-thread) error queue.
  Failure describe_failure(int ssl_error, int saved_errno, const char* during) {
    int reason = 0;  // the first SSL-library reason in the queue
    std::string queue;
    for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
      if (reason == 0 && ERR_GET_LIB(e) == ERR_LIB_SSL) reason = ERR_GET_REASON(e);
      if (!queue.empty()) queue += "; ";
      queue += openssl_reason(e);
    }
    const std::string who = "TLS connection to '" + name_ + "'";
    std::string named = describe_cause(reason, queue);
    if (!named.empty()) return {who + " failed: " + named, true};

    std::string generic;
    if (ssl_error == SSL_ERROR_ZERO_RETURN) {
      generic = who + ": the server closed the TLS session (close_notify)";
    } else if (ssl_error == SSL_ERROR_SYSCALL && saved_errno != 0) {
      generic = who + " failed during " + during + ": " + std::strerror(saved_errno);
    } else if (queue.empty() || reason == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
      generic = who + (established_ ? std::string(": the server closed the connection (EOF during ") + during + ")"
                                     : std::string(": the server closed the connection during the TLS handshake"));
    } else {
      generic = who + " failed during " + during + ": " + queue;
    }
    if (observed_.client_cert_requested && !context_->has_client_cert() && !received_) {
      generic += " (the server asked for a client certificate and none was configured; if it requires one "
                 "(tls-auth-clients yes), set ssl_certfile and ssl_keyfile)";
    }
    return {std::move(generic), false};
  }

  // The specific cause of a failure, or "" when nothing more than the generic is known.
  std::string describe_cause(int reason, const std::string& queue) const {
    const long verify_result = SSL_get_verify_result(ssl_.get());
    if (context_->verify() && verify_result != X509_V_OK && !established_) {
      return std::string("certificate verify failed: ") + X509_verify_cert_error_string(verify_result) +
             verify_hint(static_cast<int>(verify_result));
    }
    switch (reason) {
      case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
      case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
        return "the server requires a client certificate and none was sent; set ssl_certfile and ssl_keyfile "
               "(mutual TLS)";
      case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
        if (observed_.client_cert_requested && !context_->has_client_cert()) {
          return "the server refused the handshake after asking for a client certificate, and none was "
                 "configured; set ssl_certfile and ssl_keyfile (mutual TLS)";
        }
        return "";
      case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
      case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
      case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
      case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
      case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
        if (context_->has_client_cert()) {
          return "the server refused our client certificate (ssl_certfile '" + context_->certfile() + "'): " +
                 queue + "; it must be issued by a CA the server trusts (its tls-ca-cert-file) and be valid";
        }
        return "";
      case SSL_R_WRONG_VERSION_NUMBER:
      case SSL_R_PACKET_LENGTH_TOO_LONG:
      case SSL_R_HTTP_REQUEST:
      case SSL_R_UNKNOWN_PROTOCOL:
        return "the server did not answer in TLS (" + queue +
               "); is this a plain-text port? Use redis:// for it, or the server's tls-port";
      case SSL_R_UNSUPPORTED_PROTOCOL:
      case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
      case SSL_R_NO_PROTOCOLS_AVAILABLE:
        return "no TLS version in common (" + queue + "); redcount requires TLS 1.2 or later";
      default:
        return "";
    }
  }

  std::string verify_hint(int code) const {
    const std::string cert = observed_.verify_subject.empty() ? std::string("the server's certificate")
                                                              : "certificate '" + observed_.verify_subject + "'";
    switch (code) {
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
      case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      case X509_V_ERR_CERT_UNTRUSTED:
        return " (the server's certificate chain reaches " + cert + ", which is neither in nor issued by a CA in " +
               (context_->ca_certs().empty() ? std::string("the system trust store")
                                             : "ssl_ca_certs '" + context_->ca_certs() + "'") +
               "; pass the CA that issued the server's certificate as ssl_ca_certs)";
      case X509_V_ERR_CERT_HAS_EXPIRED:
        return " (" + cert + " expired on " + observed_.verify_not_after +
               "; renew it on the server, or check this machine's clock)";
      case X509_V_ERR_CERT_NOT_YET_VALID:
        return " (" + cert + " is not valid yet; check this machine's clock)";
      case X509_V_ERR_HOSTNAME_MISMATCH:
      case X509_V_ERR_IP_ADDRESS_MISMATCH:
        return " (the server's certificate does not name '" + name_ + "'" +
               (observed_.verify_names.empty() ? std::string() : ", only " + observed_.verify_names) +
               "; connect by a name it lists, set ssl_server_name to one, or set ssl_check_hostname=false)";
      default:
        return "";
    }
  }

  int fd_;
  std::shared_ptr<TlsContext> context_;  // outlives ssl_: the SSL refers to its SSL_CTX
  std::string name_;
  Observed observed_;
  std::unique_ptr<SSL, SslDeleter> ssl_;
  Want want_ = Want::Read;
  bool established_ = false;
  bool received_ = false;   // application data has arrived: the server accepted us
};

}  // namespace

std::shared_ptr<TlsContext> make_tls_context(const StoreOptions& options) {
  return std::make_shared<TlsContext>(options);
}

std::unique_ptr<Transport> make_tls_transport(int fd, std::shared_ptr<TlsContext> context,
                                              const std::string& server_name) {
  if (!context) {
    ::close(fd);
    throw InvalidArgument("make_tls_transport needs a TlsContext (make_tls_context)");
  }
  // ssl_server_name, when set, replaces the host for SNI and the certificate check.
  std::string name = context->server_name().empty() ? server_name : context->server_name();
  try {
    return std::make_unique<TlsTransport>(fd, std::move(context), std::move(name));
  } catch (...) {
    // The constructor threw after taking the fd but before its destructor could run.
    ::close(fd);
    throw;
  }
}

}  // namespace redcount
