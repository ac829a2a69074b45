// The store URL parser (options.h parse_url).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/redis/topology/sentinel.h"
#include "test_support.h"

using namespace redcount;
using rctest::contains;
using Kind = StoreOptions::Kind;

namespace {

std::string url_error(const std::string& url) {
  return rctest::error_of<InvalidArgument>([&] { parse_url(url); });
}

TEST(ParseUrl, Memory) {
  EXPECT_EQ(parse_url("").kind, Kind::Memory);
  EXPECT_EQ(parse_url("memory://").kind, Kind::Memory);
  EXPECT_TRUE(contains(url_error("memory://somewhere"), "memory:// takes no host"));
}

TEST(ParseUrl, RedisDefaults) {
  const StoreOptions o = parse_url("redis://localhost");
  EXPECT_EQ(o.kind, Kind::Tcp);
  EXPECT_EQ(o.host, "localhost");
  EXPECT_EQ(o.port, 6379);
  EXPECT_EQ(o.db, 0);
  EXPECT_EQ(o.username, "");
  EXPECT_EQ(o.password, "");
}

TEST(ParseUrl, PortAndDb) {
  StoreOptions o = parse_url("redis://cache:6380");
  EXPECT_EQ(o.host, "cache");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 0);
  o = parse_url("redis://cache:6380/2");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 2);
  o = parse_url("redis://10.0.0.5/15");
  EXPECT_EQ(o.host, "10.0.0.5");
  EXPECT_EQ(o.port, 6379);
  EXPECT_EQ(o.db, 15);
  o = parse_url("redis://cache/");
  EXPECT_EQ(o.db, 0);
  o = parse_url("redis://cache:1");
  EXPECT_EQ(o.port, 1);
  o = parse_url("redis://cache:65535");
  EXPECT_EQ(o.port, 65535);
}

TEST(ParseUrl, UserAndPassword) {
  const StoreOptions o = parse_url("redis://app:secret@cache:6380/2");
  EXPECT_EQ(o.username, "app");
  EXPECT_EQ(o.password, "secret");
  EXPECT_EQ(o.host, "cache");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 2);
}

TEST(ParseUrl, PasswordOnly) {
  StoreOptions o = parse_url("redis://:secret@cache");
  EXPECT_EQ(o.username, "");
  EXPECT_EQ(o.password, "secret");
  EXPECT_EQ(o.host, "cache");
  o = parse_url("redis://secret@cache:7000");
  EXPECT_EQ(o.username, "");
  EXPECT_EQ(o.password, "secret");
  EXPECT_EQ(o.host, "cache");
  EXPECT_EQ(o.port, 7000);
}

TEST(ParseUrl, PercentEscapedCredentials) {
  StoreOptions o = parse_url("redis://us%65r:p%40ss%3Aw%2Fo%25rd@cache");
  EXPECT_EQ(o.username, "user");
  EXPECT_EQ(o.password, "p@ss:w/o%rd");
  EXPECT_EQ(o.host, "cache");
  o = parse_url("redis://:%3a%3A@cache");  // lower- and upper-case hex
  EXPECT_EQ(o.password, "::");
}

TEST(ParseUrl, PasswordsMayContainAt) {
  StoreOptions o = parse_url("redis://app:p@ss@word@cache:1234/3");
  EXPECT_EQ(o.username, "app");
  EXPECT_EQ(o.password, "p@ss@word");
  EXPECT_EQ(o.host, "cache");
  EXPECT_EQ(o.port, 1234);
  EXPECT_EQ(o.db, 3);
  o = parse_url("redis://:@@cache");
  EXPECT_EQ(o.password, "@");
  EXPECT_EQ(o.host, "cache");
}

TEST(ParseUrl, Ipv6) {
  StoreOptions o = parse_url("redis://[::1]:6380");
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 6380);
  o = parse_url("redis://[::1]");
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 6379);
  o = parse_url("redis://:pw@[fe80::1:2]:7000/4");
  EXPECT_EQ(o.host, "fe80::1:2");
  EXPECT_EQ(o.port, 7000);
  EXPECT_EQ(o.db, 4);
  EXPECT_EQ(o.password, "pw");
}

TEST(ParseUrl, UnixSocket) {
  StoreOptions o = parse_url("unix:///var/run/redis/redis.sock?db=3");
  EXPECT_EQ(o.kind, Kind::Unix);
  EXPECT_EQ(o.unix_path, "/var/run/redis/redis.sock");
  EXPECT_EQ(o.db, 3);
  o = parse_url("unix:///tmp/r.sock");
  EXPECT_EQ(o.kind, Kind::Unix);
  EXPECT_EQ(o.unix_path, "/tmp/r.sock");
  EXPECT_EQ(o.db, 0);
}

TEST(ParseUrl, Errors) {
  struct Case {
    std::string url;
    std::string in_message;
  };
  const std::vector<Case> cases = {
      {"redis://cache:abc", "port"},
      {"redis://cache:", "port"},
      {"redis://cache:0", "port"},
      {"redis://cache:70000", "port"},
      {"redis://cache:65536", "port"},
      {"redis://cache:-1", "port"},
      {"redis://cache:6379x", "port"},
      {"redis://[::1]:0", "port"},
      {"redis://[::1]:99999", "port"},
      {"redis://[::1", "unterminated"},
      {"redis://[::1]6380", "junk"},
      {"redis://cache/abc", "database"},
      {"redis://cache/-1", "database"},
      {"redis://cache/1/2", "database"},
      {"redis://cache/01", "database"},
      {"http://cache", "unknown scheme 'http'"},
      {"cache:6379", "missing scheme"},
      {"rediss://cache:6380?ssl_cert_reqs=maybe", "ssl_cert_reqs must be required, optional or none"},
      {"redis://", "missing host"},
      {"redis:///0", "missing host"},
      {"redis://:6379", "missing host"},
      {"redis://:pw@", "missing host"},
      {"redis://user:@cache", "needs a password"},
      {"redis://u:p%4@cache", "%-escape"},
      {"redis://u:p%zz@cache", "%-escape"},
      {"redis://ca che", "invalid character"},
      {"redis://cache?db=1", "the database goes in the path"},
      {"unix://relative.sock", "absolute"},
      {"unix://", "absolute"},
      {"unix:///tmp/r.sock?database=1", "db=N"},
      {"unix:///tmp/r.sock?db=x", "database"},
  };
  for (const auto& c : cases) {
    const std::string msg = url_error(c.url);
    EXPECT_TRUE(contains(msg, c.in_message)) << c.url << " -> " << msg;
  }
}

TEST(ParseUrl, Sentinel) {
  const StoreOptions o = parse_url("redis+sentinel://app:pw@s1:26380,[::1]/cache/3?sentinel_password=spw");
  EXPECT_EQ(o.kind, Kind::Tcp);
  EXPECT_TRUE(o.sentinel);
  EXPECT_FALSE(o.cluster);
  EXPECT_FALSE(o.tls);
  ASSERT_EQ(o.sentinels.size(), 2u);
  EXPECT_EQ(o.sentinels[0].host, "s1");
  EXPECT_EQ(o.sentinels[0].port, 26380);
  EXPECT_EQ(o.sentinels[1].host, "::1");
  EXPECT_EQ(o.sentinels[1].port, 26379);
  EXPECT_EQ(o.sentinel_service, "cache");
  EXPECT_EQ(o.username, "app");
  EXPECT_EQ(o.password, "pw");
  EXPECT_EQ(o.db, 3);
  EXPECT_EQ(o.sentinel_password, "spw");
  EXPECT_TRUE(o.sentinel_username.empty());
  EXPECT_TRUE(parse_url("rediss+sentinel://s1/cache?ssl_cert_reqs=none").tls);
  EXPECT_TRUE(contains(url_error("redis+sentinel://s1"), "missing the service name"));
  EXPECT_TRUE(contains(url_error("redis+sentinel://s1/cache?ssl_ca_certs=x"), "rediss+sentinel:// only"));

  StoreOptions k = parse_url("redis+sentinel://s1/cache");
  set_sentinel_option(k, "sentinel_username", "watcher");
  set_sentinel_option(k, "sentinel_password", "secret");
  EXPECT_EQ(k.sentinel_username, "watcher");
  EXPECT_EQ(k.sentinel_password, "secret");
  StoreOptions plain = parse_url("redis://localhost");
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { set_sentinel_option(plain, "sentinel_password", "x"); }),
                       "redis+sentinel://"));
  EXPECT_TRUE(contains(rctest::error_of<InvalidArgument>([&] { set_sentinel_option(k, "password", "x"); }),
                       "unknown Sentinel option"));
}

// --- Sentinel URLs in detail (the grammar, its errors, the resolver's options) ---

TEST(SentinelUrl, FullForm) {
  const StoreOptions u = parse_url("redis+sentinel://app:p%40ss@s1:26380,10.0.0.2,[::1]:26381/cache/3");
  ASSERT_EQ(u.sentinels.size(), 3u);
  EXPECT_EQ(u.sentinels[0], (Address{"s1", 26380}));
  EXPECT_EQ(u.sentinels[1], (Address{"10.0.0.2", kDefaultSentinelPort}));
  EXPECT_EQ(u.sentinels[2], (Address{"::1", 26381}));
  EXPECT_EQ(u.sentinels[2].text(), "[::1]:26381");
  EXPECT_EQ(u.sentinel_service, "cache");
  EXPECT_EQ(u.kind, StoreOptions::Kind::Tcp);
  EXPECT_FALSE(u.tls);
  EXPECT_EQ(u.username, "app");
  EXPECT_EQ(u.password, "p@ss");
  EXPECT_EQ(u.db, 3);
  EXPECT_TRUE(u.sentinel_username.empty());
  EXPECT_TRUE(u.sentinel_password.empty());
}

TEST(SentinelUrl, MinimalFormAndPasswordShorthand) {
  const StoreOptions u = parse_url("redis+sentinel://s1/svc");
  EXPECT_EQ(u.sentinels, (std::vector<Address>{{"s1", 26379}}));
  EXPECT_EQ(u.sentinel_service, "svc");
  EXPECT_EQ(u.db, 0);
  EXPECT_TRUE(u.password.empty());
  const StoreOptions p = parse_url("redis+sentinel://secret@s1:1,s2:2/svc/");
  EXPECT_EQ(p.password, "secret");
  EXPECT_TRUE(p.username.empty());
  EXPECT_EQ(p.db, 0);
  EXPECT_EQ(parse_url("redis+sentinel://s1/my%2Dsvc").sentinel_service, "my-svc");
}

TEST(SentinelUrl, SentinelCredentialsAndTls) {
  const StoreOptions u = parse_url(
      "rediss+sentinel://:pw@s1:26379/svc?sentinel_username=watch&sentinel_password=s%26pw"
      "&ssl_ca_certs=/etc/ca.pem&ssl_check_hostname=false");
  EXPECT_TRUE(u.tls);
  EXPECT_EQ(u.password, "pw");
  EXPECT_EQ(u.sentinel_username, "watch");
  EXPECT_EQ(u.sentinel_password, "s&pw");
  EXPECT_EQ(u.ssl_ca_certs, "/etc/ca.pem");
  EXPECT_FALSE(u.ssl_check_hostname);
  const redis::SentinelOptions o = redis::sentinel_options(u, nullptr);
  EXPECT_EQ(o.service, "svc");
  EXPECT_EQ(o.link.username, "watch");
  EXPECT_EQ(o.link.password, "s&pw");
  EXPECT_EQ(o.sentinels, u.sentinels);

  StoreOptions k = parse_url("redis+sentinel://s1/svc?sentinel_password=a");
  set_sentinel_option(k, "sentinel_password", "b");
  EXPECT_EQ(k.sentinel_password, "b");
  EXPECT_THROW(set_sentinel_option(k, "password", "x"), InvalidArgument);
}

TEST(SentinelUrl, RecognisesItsSchemes) {
  EXPECT_TRUE(is_sentinel_url("redis+sentinel://s/x"));
  EXPECT_TRUE(is_sentinel_url("rediss+sentinel://s/x"));
  EXPECT_FALSE(is_sentinel_url("redis://s/0"));
  EXPECT_FALSE(is_sentinel_url("redis+cluster://s"));
}

TEST(SentinelUrl, ErrorsSayWhatIsWrongWithoutSecrets) {
  struct Case {
    std::string url;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"redis+sentinel:/s1/svc", "missing scheme"},
      {"redis+sentinel://s1:26379", "missing the service name"},
      {"redis+sentinel://s1:26379/", "missing the service name"},
      {"redis+sentinel:///svc", "no sentinel address"},
      {"redis+sentinel://s1,,s2/svc", "sentinel #2 is empty"},
      {"redis+sentinel://s1,/svc", "sentinel #2 is empty"},
      {"redis+sentinel://s1:0/svc", "sentinel #1 (s1): port must be a number 1-65535, got '0'"},
      {"redis+sentinel://s1,s2:99999/svc", "sentinel #2 (s2): port must be a number 1-65535"},
      {"redis+sentinel://s1,:5/svc", "sentinel #2 has no host"},
      {"redis+sentinel://[::1/svc", "unterminated [IPv6] host"},
      {"redis+sentinel://s1:1,s1:1/svc", "sentinel s1:1 is listed twice"},
      {"redis+sentinel://s1/svc/x", "database must be a number >= 0, got 'x'"},
      {"redis+sentinel://s1/svc/1/2", "junk after the database number"},
      {"redis+sentinel://s1/a%0Ab", "control character"},
      {"redis+sentinel://s1/a%20b", "contains a space"},
      {"redis+sentinel://s1/a%FFb", "not valid UTF-8 once %-decoded: 'a\\xffb'"},
      {"redis+sentinel://s1/svc?db=1", "the database goes in the path"},
      {"redis+sentinel://s1/svc?timeout=1", "unknown query parameter 'timeout'"},
      {"redis+sentinel://s1/svc?sentinel_password", "needs a value"},
      {"redis+sentinel://s1/svc?sentinel_username=u", "sentinel_username needs sentinel_password"},
      {"redis+sentinel://s1/svc?sentinel_password=a&sentinel_password=b", "given twice"},
      {"redis+sentinel://s1/svc?ssl_ca_certs=/x", "ssl_ca_certs applies to rediss+sentinel:// only"},
      {"rediss+sentinel://s1/svc?ssl_cert_reqs=maybe", "ssl_cert_reqs must be required, optional or none"},
      {"redis+sentinel://user:@s1/svc", "a user name needs a password"},
      {"redis+sentinel://u:p%zz@s1/svc", "bad %-escape in credentials"},
  };
  for (const auto& c : cases) {
    const std::string e = url_error(c.url);
    EXPECT_TRUE(contains(e, c.says)) << c.url << "\n  -> " << e;
    EXPECT_TRUE(contains(e, "expected redis+sentinel://")) << e;
  }
  // Neither the master's password nor the sentinels' appears in any message.
  for (const std::string url : {"redis+sentinel://u:hunter2@s1:0/svc", "redis+sentinel://hunter2@s1/svc/x",
                                "redis+sentinel://s1/svc?sentinel_password=hunter2&bogus=1",
                                "redis+sentinel://s1/svc?sentinel_password=hunter2&sentinel_password=hunter2",
                                "redis+sentinel://u:hunter2?@s1/svc", "redis+sentinel://s1/svc?sentinel_password=hunter2%"}) {
    const std::string e = url_error(url);
    EXPECT_NE(e, "(no error)") << url;
    EXPECT_FALSE(contains(e, "hunter2")) << url << "\n  -> " << e;
  }
}


TEST(ParseUrl, CredentialsAreNeverEchoed) {
  const std::vector<std::string> bad = {
      "redis://admin:Sup3rS3cret@cache:0",
      "redis://admin:Sup3rS3cret@cache:70000",
      "redis://admin:Sup3rS3cret@cache/db9",
      "redis://admin:Sup3rS3cret@",
      "redis://admin:Sup3rS3cret@cache:6379@x:0",
      "redis://admin:Sup3r@S3cret@cache:bad",
      "redis://admin:Sup3rS3cret%zz@cache",
      "redis://admin:Sup3rS3cret%4@cache",
      "redis://Sup3rS3cret@[::1]:0",
      "redis://admin:Sup3rS3cret@[::1",
      "rediss://admin:Sup3rS3cret@cache:0",
      "rediss://admin:Sup3rS3cret@cache?ssl_cert_reqs=bad",
      "rediss://admin:Sup3r?S3cret@cache",
      "rediss://admin:Sup3r?S3cret=x@cache",
      "unix:///tmp/r.sock?password=Sup3rS3cret",
      "unix:///tmp/r.sock?db=1&password=Sup3rS3cret",
      "unix:///tmp/r.sock?user=admin&password=Sup3rS3cret",
      "http://admin:Sup3rS3cret@cache",
      "unix://admin:Sup3rS3cret@relative",
      // No "://": a typo in the scheme must not leak the password either.
      "redis:/admin:Sup3rS3cret@cache:6379",
      "redis//admin:Sup3rS3cret@cache:6379",
      "admin:Sup3rS3cret@cache:6379",
      "admin:Sup3rS3cret@cache://6379",
      // Credentials before a "://" with another '@' after it (found by the URL fuzzer).
      "admin:Sup3rS3cret@redis://x@cache",
      "redis:admin:Sup3rS3cret@cache://u@h:0",
  };
  for (const auto& url : bad) {
    const std::string msg = url_error(url);
    EXPECT_FALSE(contains(msg, "Sup3r")) << url << " -> " << msg;
    EXPECT_FALSE(contains(msg, "S3cret")) << url << " -> " << msg;
    EXPECT_FALSE(contains(msg, "admin")) << url << " -> " << msg;
  }
}

// Found by the URL fuzzer: a percent-decoded TLS value that is not UTF-8 was quoted raw, so
// the message was not valid UTF-8 either. Such bytes are shown as \xNN.
// A rejected TLS value (raw bytes included) is never repeated: the message stays ASCII and
// says the value is not shown.
TEST(ParseUrl, RejectedTlsValuesAreNeverRepeated) {
  for (const std::string url : {"rediss://cache?ssl_server_name=%ec/", "rediss://cache?ssl_cert_reqs=%ff",
                                "rediss://cache?ssl_check_hostname=%c3"}) {
    const std::string msg = url_error(url);
    EXPECT_TRUE(contains(msg, "the value given is not shown")) << msg;
    EXPECT_FALSE(contains(msg, "\\x")) << msg;
    for (std::size_t i = 0; i < msg.size(); ++i) EXPECT_LT(static_cast<unsigned char>(msg[i]), 0x80) << msg;
  }
}

// Found by the URL fuzzer: a database number given as "?db=" on a unix:// URL is
// percent-decoded, and a value that was not a number was quoted raw, bytes that are not
// UTF-8 included. It is quoted like any other shown value: such bytes appear as \xNN.
TEST(ParseUrl, RejectedDatabaseNumberIsQuotedAsUtf8) {
  const std::string msg = url_error("unix:///run/redis.sock?db=3%FEx%EF");
  EXPECT_TRUE(contains(msg, "database must be a number >= 0, got '3\\xfex\\xef'")) << msg;
  for (std::size_t i = 0; i < msg.size(); ++i) EXPECT_LT(static_cast<unsigned char>(msg[i]), 0x80) << msg;
}

}  // namespace
