// TLS: the TlsContext's checks of its files, and the TlsTransport driven by poll() through
// real TLS handshakes with redis-server processes this file starts (skipped, by name, only
// when redis-server is not installed). Certificates come from tests/tls/make_certs.sh
// (the openssl CLI), generated once per run into a temporary directory.
//
//   build/asan/redcount_tests --gtest_filter='Tls*'
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/redis/io/transport.h"
#include "test_servers.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using rctest::free_port;
using rctest::have_redis_server;
using rctest::try_connect;
namespace fs = std::filesystem;

namespace {

// --- certificates ----------------------------------------------------------------------

// The certificates of this run, made once; the directory is removed at exit.
class Certs {
 public:
  static const Certs& get() {
    static const Certs certs;
    return certs;
  }
  std::string operator[](const std::string& file) const { return (dir_ / file).string(); }
  const std::string& error() const { return error_; }
  const fs::path& dir() const { return dir_; }

  Certs(const Certs&) = delete;
  Certs& operator=(const Certs&) = delete;

 private:
  Certs() {
    std::string tmpl = (fs::temp_directory_path() / "redcount-tls-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      error_ = "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    // __FILE__ is this source's absolute path (CMake passes absolute paths to the compiler).
    const fs::path script = fs::path(__FILE__).parent_path().parent_path() / "tls" / "make_certs.sh";
    const std::string cmd = "bash '" + script.string() + "' '" + dir_.string() + "' > '" +
                            (dir_ / "make_certs.log").string() + "' 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir_ / "make_certs.log");
      std::stringstream text;
      text << log.rdbuf();
      error_ = "tests/tls/make_certs.sh failed (is the openssl CLI installed? apt-get install openssl):\n" +
               text.str();
    }
  }
  ~Certs() {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }
  fs::path dir_;
  std::string error_;
};

#define REQUIRE_CERTS()                                                       \
  do {                                                                        \
    if (!Certs::get().error().empty()) FAIL() << Certs::get().error();        \
  } while (0)

StoreOptions tls_options(const std::string& ca) {
  StoreOptions o;
  o.kind = StoreOptions::Kind::Tcp;
  o.tls = true;
  o.ssl_ca_certs = ca;
  return o;
}

// --- redis-server with TLS ---------------------------------------------------------------

// One redis-server child process listening on 127.0.0.1:port (TLS unless `plain`),
// killed and reaped by the destructor.
class RedisTls {
 public:
  struct Config {
    std::string cert = "server";  // server certificate: <cert>.pem / <cert>.key in Certs
    std::string auth_clients = "no";  // --tls-auth-clients: no | optional | yes
    bool plain = false;
    std::string protocols;  // --tls-protocols, e.g. "TLSv1.2"; empty = redis's default
  };
  static Config with_cert(std::string cert) {
    Config c;
    c.cert = std::move(cert);
    return c;
  }
  static Config with_auth_clients(std::string mode, std::string protocols = "") {
    Config c;
    c.auth_clients = std::move(mode);
    c.protocols = std::move(protocols);
    return c;
  }
  static Config plain_text() {
    Config c;
    c.plain = true;
    return c;
  }

  explicit RedisTls(const Config& c) {
    const Certs& certs = Certs::get();
    for (int attempt = 0; attempt < 3 && !process_; ++attempt) start(c, certs);
  }
  RedisTls(const RedisTls&) = delete;
  RedisTls& operator=(const RedisTls&) = delete;

  int port() const { return port_; }
  bool ok() const { return process_ != nullptr; }
  const std::string& error() const { return error_; }

 private:
  void start(const Config& c, const Certs& certs) {
    port_ = free_port();
    const std::string log = certs["redis-" + std::to_string(port_) + ".log"];
    std::vector<std::string> args = {"redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                     "--dir", certs.dir().string(), "--logfile", log};
    if (c.plain) {
      args.insert(args.end(), {"--port", std::to_string(port_)});
    } else {
      args.insert(args.end(), {"--port", "0", "--tls-port", std::to_string(port_), "--tls-cert-file",
                               certs[c.cert + ".pem"], "--tls-key-file", certs[c.cert + ".key"],
                               "--tls-ca-cert-file", certs["ca.pem"], "--tls-auth-clients", c.auth_clients});
      if (!c.protocols.empty()) args.insert(args.end(), {"--tls-protocols", c.protocols});
    }
    auto p = std::make_unique<rctest::ServerProcess>(std::move(args), port_, log);
    if (!p->started()) {
      error_ = "fork failed";
      return;
    }
    // Ready when the port accepts a connection (redis listens once it is initialised).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (p->exited()) {
        error_ = "redis-server exited early:\n" + p->log();
        return;  // the caller retries on another port (it may have been taken)
      }
      if (const int s = try_connect(port_); s >= 0) {
        ::close(s);
        process_ = std::move(p);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // bounded readiness poll
    }
    error_ = "redis-server did not listen on port " + std::to_string(port_) + " within 10 s";
  }

  std::unique_ptr<rctest::ServerProcess> process_;  // null until it listens
  int port_ = 0;
  std::string error_;
};

#define REQUIRE_REDIS(server)                                                                       \
  do {                                                                                              \
    if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed: live TLS tests skipped"; \
    if (!(server).ok()) FAIL() << (server).error();                                                 \
  } while (0)

// --- driving a transport with poll(), as the engine does with epoll ------------------------

constexpr int kWaitMs = 10'000;  // a hang fails the test instead of blocking it

void wait_for(const Transport& t) {
  pollfd p{t.fd(), static_cast<short>(t.want() == Transport::Want::Read ? POLLIN : POLLOUT), 0};
  const int rc = ::poll(&p, 1, kWaitMs);
  if (rc == 0) throw std::runtime_error("poll timed out waiting for the transport");
}

// A connected non-blocking socket to 127.0.0.1:port; `sndbuf`/`rcvbuf` > 0 shrink the
// kernel buffers so that writes and reads come in pieces.
int connect_nonblocking(int port, int sndbuf = 0, int rcvbuf = 0) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sndbuf > 0) ::setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  if (rcvbuf > 0) ::setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) throw std::runtime_error("connect failed");
    pollfd p{s, POLLOUT, 0};
    ::poll(&p, 1, kWaitMs);
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) throw std::runtime_error("connect failed");
  }
  return s;
}

void handshake(Transport& t) {
  while (!t.handshake()) wait_for(t);
}

// Writes all of `data`; each retry after a 0 passes the same bytes from a fresh copy, so
// the buffer moves (what SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER allows). Returns how many
// write() calls returned fewer bytes than offered.
int write_all(Transport& t, std::string data) {
  int partial = 0;
  std::size_t done = 0;
  while (done < data.size()) {
    const std::size_t n = t.write(data.data() + done, data.size() - done);
    if (n == 0) {
      data = std::string(data);  // a new buffer at a new address, same bytes
      wait_for(t);
      continue;
    }
    if (n < data.size() - done) ++partial;
    done += n;
  }
  return partial;
}

// Reads until `want` bytes arrived, in `chunk`-byte reads, and polls only when read()
// returns 0 (the contract: buffered bytes inside OpenSSL do not wake poll()).
struct ReadResult {
  std::string data;
  bool saw_buffered = false;
};
ReadResult read_exactly(Transport& t, std::size_t want, std::size_t chunk = 4096) {
  ReadResult r;
  std::string buf(chunk, '\0');
  while (r.data.size() < want) {
    const std::size_t n = t.read(buf.data(), std::min(chunk, want - r.data.size()));
    if (n == 0) {
      wait_for(t);
      continue;
    }
    r.data.append(buf.data(), n);
    if (t.has_buffered()) r.saw_buffered = true;
  }
  return r;
}

std::string resp(const std::vector<std::string>& args) {
  // Appended piece by piece: GCC 12 at -O3 misreports "$" + to_string(...) chains (-Wrestrict).
  std::string out = "*";
  out += std::to_string(args.size());
  out += "\r\n";
  for (const auto& a : args) {
    out += '$';
    out += std::to_string(a.size());
    out += "\r\n";
    out += a;
    out += "\r\n";
  }
  return out;
}

std::unique_ptr<Transport> open_tls(int port, const StoreOptions& o, const std::string& name = "localhost") {
  return make_tls_transport(connect_nonblocking(port), make_tls_context(o), name);
}

// Handshake, PING, +PONG; returns the ConnectionError's message, or "" on success.
std::string ping_error(int port, const StoreOptions& o, const std::string& name = "localhost") {
  try {
    auto t = open_tls(port, o, name);
    handshake(*t);
    write_all(*t, resp({"PING"}));
    const std::string reply = read_exactly(*t, 7).data;
    EXPECT_EQ(reply, "+PONG\r\n");
    return "";
  } catch (const ConnectionError& e) {
    return e.what();
  }
}

// --- rediss:// URLs and TLS options ------------------------------------------------------------

std::string url_error(const std::string& url) {
  return rctest::error_of<InvalidArgument>([&] { parse_url(url); });
}

TEST(TlsUrl, RedissDefaults) {
  const StoreOptions o = parse_url("rediss://cache");
  EXPECT_EQ(o.kind, StoreOptions::Kind::Tcp);
  EXPECT_TRUE(o.tls);
  EXPECT_EQ(o.host, "cache");
  EXPECT_EQ(o.port, 6379);
  EXPECT_EQ(o.ssl_cert_reqs, StoreOptions::CertReqs::Required);
  EXPECT_TRUE(o.ssl_check_hostname);
  EXPECT_EQ(o.ssl_ca_certs, "");
  EXPECT_EQ(o.ssl_certfile, "");
  EXPECT_EQ(o.ssl_keyfile, "");
  EXPECT_EQ(o.ssl_server_name, "");
  EXPECT_FALSE(parse_url("redis://cache").tls);
  EXPECT_FALSE(parse_url("unix:///tmp/r.sock").tls);
}

TEST(TlsUrl, EveryQueryParameter) {
  const StoreOptions o = parse_url(
      "rediss://app:s%3Fcret@cache.example:6380/2?ssl_ca_certs=%2Fetc%2Fredis%20ca.pem&ssl_certfile=/c/client.pem"
      "&ssl_keyfile=/c/client%40host.key&ssl_cert_reqs=optional&ssl_check_hostname=false"
      "&ssl_server_name=redis.internal");
  EXPECT_TRUE(o.tls);
  EXPECT_EQ(o.username, "app");
  EXPECT_EQ(o.password, "s?cret");  // a '?' in a password is written %3F
  EXPECT_EQ(o.host, "cache.example");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 2);
  EXPECT_EQ(o.ssl_ca_certs, "/etc/redis ca.pem");
  EXPECT_EQ(o.ssl_certfile, "/c/client.pem");
  EXPECT_EQ(o.ssl_keyfile, "/c/client@host.key");
  EXPECT_EQ(o.ssl_cert_reqs, StoreOptions::CertReqs::Optional);
  EXPECT_FALSE(o.ssl_check_hostname);
  EXPECT_EQ(o.ssl_server_name, "redis.internal");
}

TEST(TlsUrl, ValuesOfCertReqsAndCheckHostname) {
  using R = StoreOptions::CertReqs;
  EXPECT_EQ(parse_url("rediss://h?ssl_cert_reqs=required").ssl_cert_reqs, R::Required);
  EXPECT_EQ(parse_url("rediss://h?ssl_cert_reqs=none").ssl_cert_reqs, R::None);
  EXPECT_EQ(parse_url("rediss://h?ssl_cert_reqs=NONE").ssl_cert_reqs, R::None);
  EXPECT_EQ(parse_url("rediss://h?ssl_cert_reqs=CERT_OPTIONAL").ssl_cert_reqs, R::Optional);
  EXPECT_TRUE(parse_url("rediss://h?ssl_check_hostname=true").ssl_check_hostname);
  EXPECT_TRUE(parse_url("rediss://h?ssl_check_hostname=1").ssl_check_hostname);
  EXPECT_FALSE(parse_url("rediss://h?ssl_check_hostname=0").ssl_check_hostname);
  EXPECT_FALSE(parse_url("rediss://h?ssl_check_hostname=False").ssl_check_hostname);
}

TEST(TlsUrl, QueryEdgeCases) {
  EXPECT_TRUE(parse_url("rediss://cache?").tls);
  EXPECT_EQ(parse_url("rediss://cache/3?").db, 3);
  EXPECT_EQ(parse_url("rediss://cache?&ssl_cert_reqs=none&").ssl_cert_reqs, StoreOptions::CertReqs::None);
  StoreOptions o = parse_url("rediss://[::1]:6380?ssl_check_hostname=0");
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 6380);
  EXPECT_FALSE(o.ssl_check_hostname);
  o = parse_url("unix:///tmp/r.sock?db=4&");
  EXPECT_EQ(o.db, 4);
}

TEST(TlsUrl, Errors) {
  struct Case {
    std::string url;
    std::string in_message;
  };
  const std::vector<Case> cases = {
      {"rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs must be required, optional or none"},
      {"rediss://h?ssl_check_hostname=yes", "ssl_check_hostname must be true, false, 1 or 0 (the value given is not shown"},
      {"rediss://h?ssl_verify=none", "unknown query parameter 'ssl_verify' (rediss:// accepts ssl_ca_certs, "
                                     "ssl_certfile, ssl_keyfile, ssl_cert_reqs, ssl_check_hostname, "
                                     "ssl_server_name)"},
      {"redis://h?timeout=3", "unknown query parameter 'timeout'"},
      {"rediss://h?ssl_ca_certs=/a&ssl_ca_certs=/b", "query parameter 'ssl_ca_certs' is given twice"},
      {"rediss://h?ssl_ca_certs", "query parameter 'ssl_ca_certs' needs a value"},
      {"rediss://h?ssl_ca_certs=", "ssl_ca_certs must not be empty"},
      {"rediss://h?ssl_ca_certs=%2", "truncated %-escape in query parameter 'ssl_ca_certs'"},
      {"rediss://h?ssl_ca_certs=%zz", "bad %-escape in query parameter 'ssl_ca_certs'"},
      {"rediss://h?ssl_ca_certs=a%00b", "NUL"},
      {"rediss://h?ssl_server_name=a/b", "ssl_server_name must be a host name"},
      {"rediss://h?ssl_certfile=/a@b", "percent-encode"},
      {"redis://h?ssl_ca_certs=/ca.pem", "ssl_ca_certs applies to TLS connections only: use a rediss:// URL "
                                         "(this one is redis://)"},
      {"redis://h/0?ssl_cert_reqs=none", "use a rediss:// URL"},
      {"unix:///tmp/r.sock?ssl_ca_certs=/ca.pem", "(this one is unix://)"},
      {"unix:///tmp/r.sock?db=1&db=2", "'db' is given twice"},
      {"unix:///tmp/r.sock?password=x", "unknown query parameter 'password' (unix:// takes db=N)"},
      {"rediss://h?%41=1", "unknown query parameter (name not shown)"},
  };
  for (const auto& c : cases) {
    const std::string msg = url_error(c.url);
    EXPECT_TRUE(contains(msg, c.in_message)) << c.url << " -> " << msg;
    EXPECT_TRUE(contains(msg, "expected memory://")) << c.url << " -> " << msg;
  }
}

TEST(TlsUrl, QueryValuesAndPasswordsAreNotEchoed) {
  const std::vector<std::string> bad = {
      "rediss://:Sup3rS3cret@h?ssl_verify=1",
      "rediss://h?ssl_ca_certs=/Sup3rS3cret/ca.pem&nope=1",
      "rediss://h/0?nope=Sup3rS3cret",
      "rediss://:Sup3r?S3cret@h",
      "rediss://:Sup3r?x=S3cret@h:6379",
      "unix:///tmp/r.sock?password=Sup3rS3cret",
      "unix:///tmp/r.sock?db=x&password=Sup3rS3cret",
      "redis://h?password=Sup3rS3cret",
  };
  for (const auto& url : bad) {
    const std::string msg = url_error(url);
    EXPECT_FALSE(contains(msg, "Sup3r")) << url << " -> " << msg;
    EXPECT_FALSE(contains(msg, "S3cret")) << url << " -> " << msg;
  }
}

TEST(TlsUrl, SetTlsOption) {
  StoreOptions o = parse_url("rediss://h?ssl_cert_reqs=none");
  set_tls_option(o, "ssl_cert_reqs", "required");  // a keyword overrides the query
  EXPECT_EQ(o.ssl_cert_reqs, StoreOptions::CertReqs::Required);
  set_tls_option(o, "ssl_ca_certs", "/x/ca.pem");
  EXPECT_EQ(o.ssl_ca_certs, "/x/ca.pem");
  EXPECT_THROW(set_tls_option(o, "ssl_password", "x"), InvalidArgument);
  StoreOptions plain = parse_url("redis://h");
  const std::string msg = rctest::error_of<InvalidArgument>([&] { set_tls_option(plain, "ssl_certfile", "/c.pem"); });
  EXPECT_TRUE(contains(msg, "ssl_certfile applies to TLS connections only")) << msg;
}

// --- TlsContext: its files -------------------------------------------------------------------

std::string context_error(const StoreOptions& o) {
  return rctest::error_of<InvalidArgument>([&] { make_tls_context(o); });
}

TEST(TlsContext, MissingFilesAreNamed) {
  REQUIRE_CERTS();
  const Certs& c = Certs::get();
  std::string msg = context_error(tls_options("/nonexistent/ca.pem"));
  EXPECT_TRUE(contains(msg, "cannot read ssl_ca_certs '/nonexistent/ca.pem'")) << msg;
  EXPECT_TRUE(contains(msg, "No such file")) << msg;

  StoreOptions o = tls_options(c["ca.pem"]);
  o.ssl_certfile = "/nonexistent/client.pem";
  o.ssl_keyfile = c["client.key"];
  msg = context_error(o);
  EXPECT_TRUE(contains(msg, "cannot read ssl_certfile '/nonexistent/client.pem'")) << msg;

  o.ssl_certfile = c["client.pem"];
  o.ssl_keyfile = "/nonexistent/client.key";
  msg = context_error(o);
  EXPECT_TRUE(contains(msg, "cannot read ssl_keyfile '/nonexistent/client.key'")) << msg;
}

TEST(TlsContext, FilesWithoutTheExpectedContentAreNamed) {
  REQUIRE_CERTS();
  const Certs& c = Certs::get();
  // A private key where a CA certificate belongs.
  std::string msg = context_error(tls_options(c["ca.key"]));
  EXPECT_TRUE(contains(msg, "ssl_ca_certs '" + c["ca.key"] + "' holds no usable PEM CA certificate")) << msg;

  StoreOptions o = tls_options(c["ca.pem"]);
  o.ssl_certfile = c["client.key"];
  o.ssl_keyfile = c["client.key"];
  msg = context_error(o);
  EXPECT_TRUE(contains(msg, "ssl_certfile '" + c["client.key"] + "' holds no usable PEM certificate")) << msg;

  o.ssl_certfile = c["client.pem"];
  o.ssl_keyfile = c["client.pem"];
  msg = context_error(o);
  EXPECT_TRUE(contains(msg, "ssl_keyfile '" + c["client.pem"] + "' holds no usable PEM private key")) << msg;
  // The key's bytes never appear in a message.
  EXPECT_FALSE(contains(msg, "PRIVATE KEY")) << msg;
}

TEST(TlsContext, AKeyThatDoesNotMatchTheCertificateIsRefused) {
  REQUIRE_CERTS();
  const Certs& c = Certs::get();
  StoreOptions o = tls_options(c["ca.pem"]);
  o.ssl_certfile = c["client.pem"];
  o.ssl_keyfile = c["other-client.key"];
  const std::string msg = context_error(o);
  EXPECT_TRUE(contains(msg, "ssl_keyfile '" + c["other-client.key"] + "' does not match the certificate in "
                            "ssl_certfile '" + c["client.pem"] + "'"))
      << msg;
}

TEST(TlsContext, AKeyWithoutACertificateIsRefused) {
  REQUIRE_CERTS();
  StoreOptions o = tls_options(Certs::get()["ca.pem"]);
  o.ssl_keyfile = Certs::get()["client.key"];
  const std::string msg = context_error(o);
  EXPECT_TRUE(contains(msg, "needs ssl_certfile")) << msg;
}

TEST(TlsContext, AnEncryptedKeyIsRefusedWithoutPrompting) {
  REQUIRE_CERTS();
  const Certs& c = Certs::get();
  const std::string encrypted = c["client-encrypted.key"];
  const std::string cmd = "openssl pkey -in '" + c["client.key"] + "' -aes256 -passout pass:secret -out '" +
                          encrypted + "' 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  StoreOptions o = tls_options(c["ca.pem"]);
  o.ssl_certfile = c["client.pem"];
  o.ssl_keyfile = encrypted;
  const std::string msg = context_error(o);
  EXPECT_TRUE(contains(msg, "ssl_keyfile '" + encrypted + "' is encrypted with a passphrase")) << msg;
}

TEST(TlsContext, ValidFilesAndTheSystemTrustStoreLoad) {
  REQUIRE_CERTS();
  const Certs& c = Certs::get();
  StoreOptions o = tls_options(c["ca.pem"]);
  o.ssl_certfile = c["client.pem"];
  o.ssl_keyfile = c["client.key"];
  EXPECT_NE(make_tls_context(o), nullptr);
  EXPECT_NE(make_tls_context(tls_options("")), nullptr);  // system default paths
  EXPECT_NE(make_tls_context(tls_options(c.dir().string())), nullptr);  // a CA directory
}

TEST(TlsContext, TheTransportClosesItsSocketEvenWhenItCannotStart) {
  REQUIRE_CERTS();
  StoreOptions o = tls_options(Certs::get()["ca.pem"]);
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  // Hostname checking with no name to check cannot start.
  EXPECT_THROW(make_tls_transport(fds[0], make_tls_context(o), ""), InvalidArgument);
  EXPECT_EQ(::fcntl(fds[0], F_GETFD), -1);  // closed
  {
    auto t = make_tls_transport(fds[1], make_tls_context(o), "localhost");
    EXPECT_EQ(t->kind(), "TLS");
    EXPECT_EQ(t->fd(), fds[1]);
  }
  EXPECT_EQ(::fcntl(fds[1], F_GETFD), -1);
}

// --- live handshakes with redis-server ------------------------------------------------------

TEST(TlsLive, TheRightCaConnectsByNameAndByIpAddress) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::Config{});
  REQUIRE_REDIS(server);
  const StoreOptions o = tls_options(Certs::get()["ca.pem"]);
  EXPECT_EQ(ping_error(server.port(), o, "localhost"), "");
  EXPECT_EQ(ping_error(server.port(), o, "127.0.0.1"), "");  // the certificate's IP SAN
}

TEST(TlsLive, AWrongCaIsNamed) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::Config{});
  REQUIRE_REDIS(server);
  const std::string ca = Certs::get()["other-ca.pem"];
  const std::string msg = ping_error(server.port(), tls_options(ca));
  // OpenSSL's wording depends on whether the server sends its root along with its own
  // certificate (redis-server does, from its tls-ca-cert-file): either is a wrong CA.
  EXPECT_TRUE(contains(msg, "certificate verify failed: unable to get local issuer certificate") ||
              contains(msg, "certificate verify failed: self-signed certificate in certificate chain"))
      << msg;
  EXPECT_TRUE(contains(msg, "ssl_ca_certs '" + ca + "'")) << msg;
  EXPECT_TRUE(contains(msg, "'localhost'")) << msg;
}

TEST(TlsLive, TheSystemTrustStoreDoesNotTrustAPrivateCa) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::Config{});
  REQUIRE_REDIS(server);
  const std::string msg = ping_error(server.port(), tls_options(""));
  EXPECT_TRUE(contains(msg, "certificate verify failed")) << msg;
  EXPECT_TRUE(contains(msg, "the system trust store")) << msg;
}

TEST(TlsLive, AnExpiredCertificateIsNamed) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::with_cert("expired"));
  REQUIRE_REDIS(server);
  const std::string msg = ping_error(server.port(), tls_options(Certs::get()["ca.pem"]));
  EXPECT_TRUE(contains(msg, "certificate verify failed: certificate has expired")) << msg;
  EXPECT_TRUE(contains(msg, "CN=expired")) << msg;
  EXPECT_TRUE(contains(msg, "2020")) << msg;
}

TEST(TlsLive, AHostnameMismatchNamesTheHost) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::with_cert("wrongname"));
  REQUIRE_REDIS(server);
  const StoreOptions o = tls_options(Certs::get()["ca.pem"]);
  std::string msg = ping_error(server.port(), o, "localhost");
  EXPECT_TRUE(contains(msg, "certificate verify failed: hostname mismatch")) << msg;
  EXPECT_TRUE(contains(msg, "does not name 'localhost', only DNS:redis.invalid")) << msg;
  msg = ping_error(server.port(), o, "127.0.0.1");
  EXPECT_TRUE(contains(msg, "certificate verify failed: IP address mismatch")) << msg;
  EXPECT_TRUE(contains(msg, "does not name '127.0.0.1'")) << msg;

  // ssl_server_name replaces the host for SNI and the check; ssl_check_hostname=false
  // keeps the chain check but not the name.
  StoreOptions named = o;
  named.ssl_server_name = "redis.invalid";
  EXPECT_EQ(ping_error(server.port(), named, "127.0.0.1"), "");
  StoreOptions unchecked = o;
  unchecked.ssl_check_hostname = false;
  EXPECT_EQ(ping_error(server.port(), unchecked, "localhost"), "");
}

TEST(TlsLive, CertReqsNoneAcceptsAnUntrustedCertificate) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::with_cert("wrongname"));
  REQUIRE_REDIS(server);
  StoreOptions o = tls_options(Certs::get()["other-ca.pem"]);
  o.ssl_cert_reqs = StoreOptions::CertReqs::None;
  EXPECT_EQ(ping_error(server.port(), o, "localhost"), "");
  // optional verifies, as required does (a TLS server always presents a certificate).
  o.ssl_cert_reqs = StoreOptions::CertReqs::Optional;
  EXPECT_TRUE(contains(ping_error(server.port(), o, "localhost"), "certificate verify failed"));
}

TEST(TlsLive, AMissingClientCertificateIsNamed) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::with_auth_clients("yes"));
  REQUIRE_REDIS(server);
  const std::string msg = ping_error(server.port(), tls_options(Certs::get()["ca.pem"]));
  EXPECT_TRUE(contains(msg, "requires a client certificate")) << msg;
  EXPECT_TRUE(contains(msg, "ssl_certfile and ssl_keyfile")) << msg;
}

TEST(TlsLive, AMissingClientCertificateIsNamedOnTls12) {
  REQUIRE_CERTS();
  // TLS 1.2 refuses inside the handshake (TLS 1.3, above, after it): both must be named.
  RedisTls server(RedisTls::with_auth_clients("yes", "TLSv1.2"));
  REQUIRE_REDIS(server);
  const std::string msg = ping_error(server.port(), tls_options(Certs::get()["ca.pem"]));
  EXPECT_TRUE(contains(msg, "client certificate")) << msg;
  EXPECT_TRUE(contains(msg, "ssl_certfile and ssl_keyfile")) << msg;
}

TEST(TlsLive, MutualTls) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::with_auth_clients("yes"));
  REQUIRE_REDIS(server);
  const Certs& c = Certs::get();
  StoreOptions o = tls_options(c["ca.pem"]);
  o.ssl_certfile = c["client.pem"];
  o.ssl_keyfile = c["client.key"];
  EXPECT_EQ(ping_error(server.port(), o), "");

  // A client certificate from a CA the server does not trust.
  o.ssl_certfile = c["other-client.pem"];
  o.ssl_keyfile = c["other-client.key"];
  const std::string msg = ping_error(server.port(), o);
  EXPECT_TRUE(contains(msg, "the server refused our client certificate (ssl_certfile '" + c["other-client.pem"]))
      << msg;
}

TEST(TlsLive, AnOptionalClientCertificateMayBeLeftOut) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::with_auth_clients("optional"));
  REQUIRE_REDIS(server);
  EXPECT_EQ(ping_error(server.port(), tls_options(Certs::get()["ca.pem"])), "");
}

TEST(TlsLive, APlainTextServerIsNamed) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::plain_text());
  REQUIRE_REDIS(server);
  // A plain redis-server never answers a ClientHello (it waits for a line that never
  // comes: only the engine's deadline ends that). Make it speak first, as most plain-text
  // servers on a mistaken port do: a PING before the handshake gets "+PONG" back, which
  // is what the TLS client then reads where a ServerHello belongs.
  const int fd = connect_nonblocking(server.port());
  const std::string ping = "PING\r\n";
  ASSERT_EQ(::send(fd, ping.data(), ping.size(), MSG_NOSIGNAL), static_cast<ssize_t>(ping.size()));
  auto t = make_tls_transport(fd, make_tls_context(tls_options(Certs::get()["ca.pem"])), "localhost");
  const std::string msg = rctest::error_of<ConnectionError>([&] { handshake(*t); });
  EXPECT_TRUE(contains(msg, "did not answer in TLS")) << msg;
  EXPECT_TRUE(contains(msg, "plain-text port")) << msg;
}

TEST(TlsLive, EofIsAConnectionError) {
  REQUIRE_CERTS();
  auto server = std::make_unique<RedisTls>(RedisTls::Config{});
  REQUIRE_REDIS(*server);
  auto t = open_tls(server->port(), tls_options(Certs::get()["ca.pem"]));
  handshake(*t);
  write_all(*t, resp({"PING"}));
  EXPECT_EQ(read_exactly(*t, 7).data, "+PONG\r\n");
  server.reset();  // SIGKILL: the kernel closes the server's end
  const std::string msg = rctest::error_of<ConnectionError>([&] {
    char buf[64];
    while (true) {
      if (t->read(buf, sizeof buf) == 0) wait_for(*t);
    }
  });
  EXPECT_TRUE(contains(msg, "closed the connection")) << msg;
}

TEST(TlsLive, LargePayloadsGoThroughPartialWritesAndBufferedReads) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::Config{});
  REQUIRE_REDIS(server);
  // Small kernel buffers: a 4 MB command cannot be taken in one write, and the reply
  // arrives in many TLS records that 1000-byte reads leave partly inside OpenSSL.
  auto t = make_tls_transport(connect_nonblocking(server.port(), 64 * 1024, 64 * 1024),
                              make_tls_context(tls_options(Certs::get()["ca.pem"])), "localhost");
  handshake(*t);
  std::string value(4 * 1024 * 1024, '\0');
  for (std::size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>('a' + (i * 7919) % 26);
  const int partial = write_all(*t, resp({"SET", "tls:big", value}));
  EXPECT_GT(partial, 0);
  EXPECT_EQ(read_exactly(*t, 5).data, "+OK\r\n");

  write_all(*t, resp({"GET", "tls:big"}));
  const std::string header = "$" + std::to_string(value.size()) + "\r\n";
  const ReadResult got = read_exactly(*t, header.size() + value.size() + 2, 1000);
  EXPECT_TRUE(got.saw_buffered);
  ASSERT_EQ(got.data.size(), header.size() + value.size() + 2);
  EXPECT_EQ(got.data.substr(0, header.size()), header);
  EXPECT_TRUE(got.data.compare(header.size(), value.size(), value) == 0);
  EXPECT_EQ(got.data.substr(header.size() + value.size()), "\r\n");
  EXPECT_FALSE(t->has_buffered());
}

// With partial writes enabled OpenSSL returns after each 16 KB record; the transport goes on
// until the socket is full, and a short count comes with want() == Write, so a caller polls
// for writability rather than for a reply (the synchronous fast path once waited for a reply
// to a request it had sent one record of).
TEST(TlsLive, AWriteGoesOnPastOneRecordAndAShortOneAsksForWritability) {
  REQUIRE_CERTS();
  RedisTls server(RedisTls::Config{});
  REQUIRE_REDIS(server);
  auto t = make_tls_transport(connect_nonblocking(server.port(), 64 * 1024, 64 * 1024),
                              make_tls_context(tls_options(Certs::get()["ca.pem"])), "localhost");
  handshake(*t);
  const std::string cmd = resp({"SET", "tls:records", std::string(48 * 1024, 'r')});
  const std::size_t first = t->write(cmd.data(), cmd.size());
  EXPECT_GT(first, std::size_t{16 * 1024});  // more than one record in one call
  std::size_t done = first;
  while (done < cmd.size()) {
    EXPECT_EQ(t->want(), Transport::Want::Write);
    wait_for(*t);
    done += t->write(cmd.data() + done, cmd.size() - done);
  }
  EXPECT_EQ(read_exactly(*t, 5).data, "+OK\r\n");

  const std::string big = resp({"SET", "tls:records", std::string(8 * 1024 * 1024, 'R')});
  const std::size_t n = t->write(big.data(), big.size());
  ASSERT_LT(n, big.size());  // 8 MB do not fit a 64 KB socket buffer
  EXPECT_EQ(t->want(), Transport::Want::Write);
  write_all(*t, big.substr(n));
  EXPECT_EQ(read_exactly(*t, 5).data, "+OK\r\n");
}

}  // namespace
