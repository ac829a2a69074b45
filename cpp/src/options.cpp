#include <string>

#include "redcount/errors.h"
#include "redcount/options.h"
#include "redcount/util.h"

namespace redcount {
namespace {

[[noreturn]] void bad(std::string_view url, const std::string& why) {
  // Never echo a password back: show the URL with its credentials masked.
  // Credentials run from after "://" (or the start, when the scheme is mistyped) to the last '@'.
  std::string shown(url);
  auto scheme_end = shown.find("://");
  auto at = shown.rfind('@');
  if (at != std::string::npos) {
    const std::size_t from = scheme_end != std::string::npos && at > scheme_end ? scheme_end + 3 : 0;
    shown = shown.substr(0, from) + "***@" + shown.substr(at + 1);
  }
  throw InvalidArgument("invalid store URL '" + shown + "': " + why +
                        " (expected memory://, redis://[[user]:password@]host[:port][/db] or "
                        "unix:///path/to/redis.sock[?db=N])");
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view url, std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) bad(url, "truncated %-escape in credentials");
      int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
      if (hi < 0 || lo < 0) bad(url, "bad %-escape in credentials");
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

int parse_db(std::string_view url, std::string_view s) {
  auto v = parse_int64(s);
  if (!v || *v < 0 || *v > 1'000'000) bad(url, "database must be a number >= 0, got '" + std::string(s) + "'");
  return static_cast<int>(*v);
}

}  // namespace

StoreOptions parse_url(std::string_view url) {
  StoreOptions o;
  if (url.empty() || url == "memory://") {
    o.kind = StoreOptions::Kind::Memory;
    return o;
  }
  auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) bad(url, "missing scheme");
  const std::string_view scheme = url.substr(0, scheme_end);
  std::string_view rest = url.substr(scheme_end + 3);

  if (scheme == "memory") {
    if (!rest.empty()) bad(url, "memory:// takes no host, path or options");
    return o;
  }
  if (scheme == "rediss") {
    bad(url, "TLS (rediss://) is not supported yet; use redis:// on a trusted network or a TLS proxy");
  }
  if (scheme == "unix") {
    o.kind = StoreOptions::Kind::Unix;
    auto q = rest.find('?');
    std::string_view path = rest.substr(0, q);
    if (path.empty() || path[0] != '/') bad(url, "unix socket path must be absolute (unix:///path)");
    o.unix_path = std::string(path);
    if (q != std::string_view::npos) {
      std::string_view query = rest.substr(q + 1);
      if (!query.starts_with("db=")) bad(url, "the only query option is db=N");
      o.db = parse_db(url, query.substr(3));
    }
    return o;
  }
  if (scheme != "redis") {
    // A '@' means credentials came before the "://" (a mistyped URL): do not echo them.
    bad(url, "unknown scheme '" + (scheme.find('@') == std::string_view::npos ? std::string(scheme) : "***") + "'");
  }

  o.kind = StoreOptions::Kind::Tcp;
  // Credentials end at the last '@' so passwords may contain '@' unescaped.
  auto at = rest.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    auto colon = cred.find(':');
    if (colon == std::string_view::npos) {
      // redis://password@host is a common shorthand for the default user.
      o.password = percent_decode(url, cred);
    } else {
      o.username = percent_decode(url, cred.substr(0, colon));
      o.password = percent_decode(url, cred.substr(colon + 1));
    }
    if (o.password.empty() && !o.username.empty()) bad(url, "a user name needs a password");
  }
  auto slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) o.db = parse_db(url, db);
  }
  if (hostport.empty()) bad(url, "missing host");
  if (hostport.front() == '[') {  // [IPv6]:port
    auto close = hostport.find(']');
    if (close == std::string_view::npos) bad(url, "unterminated [IPv6] host");
    o.host = std::string(hostport.substr(1, close - 1));
    hostport = hostport.substr(close + 1);
    if (!hostport.empty()) {
      if (hostport.front() != ':') bad(url, "junk after [IPv6] host");
      auto p = parse_int64(hostport.substr(1));
      if (!p || *p < 1 || *p > 65535) bad(url, "port must be 1-65535");
      o.port = static_cast<int>(*p);
    }
  } else {
    auto colon = hostport.rfind(':');
    o.host = std::string(hostport.substr(0, colon));
    if (colon != std::string_view::npos) {
      auto p = parse_int64(hostport.substr(colon + 1));
      if (!p || *p < 1 || *p > 65535) {
        bad(url, "port must be a number 1-65535, got '" + std::string(hostport.substr(colon + 1)) + "'");
      }
      o.port = static_cast<int>(*p);
    }
  }
  if (o.host.empty()) bad(url, "missing host");
  for (char c : o.host) {
    if (c == '/' || c == '?' || c == '#' || c == ' ' || static_cast<unsigned char>(c) < 0x20) {
      bad(url, "host contains an invalid character");
    }
  }
  return o;
}

}  // namespace redcount
