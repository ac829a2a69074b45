#include <cctype>
#include <string>

#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {
namespace {

// The URL as it may be shown in an error: credentials and query values masked, bytes that
// are not UTF-8 escaped, at most 200 bytes.
std::string shown_url(std::string_view url) {
  // Credentials run from after "://" to the last '@' (as the parser reads them, so a
  // password with a raw '?' in it is masked too), or from the start when the scheme is
  // mistyped: no "://" before that '@', or a '@' before the "://" (credentials typed
  // before the scheme, "user:pw@redis://host@x", must not be shown either).
  std::string shown(url);
  auto scheme_end = shown.find("://");
  auto at = shown.rfind('@');
  if (at != std::string::npos) {
    const bool clean_scheme = scheme_end != std::string::npos && at > scheme_end &&
                              shown.find('@') > scheme_end;
    const std::size_t from = clean_scheme ? scheme_end + 3 : 0;
    shown = shown.substr(0, from) + "***@" + shown.substr(at + 1);
  }
  // Query values may hold a password (unix:///s?password=...) or a private path: keep the names.
  auto q = shown.find('?');
  if (q != std::string::npos) {
    std::string masked = shown.substr(0, q + 1);
    std::string_view query = std::string_view(shown).substr(q + 1);
    while (true) {
      auto amp = query.find('&');
      std::string_view pair = query.substr(0, amp);
      auto eq = pair.find('=');
      masked += std::string(pair.substr(0, eq));
      if (eq != std::string_view::npos) masked += "=***";
      if (amp == std::string_view::npos) break;
      masked += '&';
      query = query.substr(amp + 1);
    }
    shown = masked;
  }
  return printable(shown, 200);
}

// The error names the grammar of the URL's scheme ("redis+sentinel:/x" too): a Sentinel
// URL's, or the store URL's.
[[noreturn]] void bad(std::string_view url, const std::string& why) {
  const std::string_view scheme = url.substr(0, url.find(':'));
  if (scheme == "redis+sentinel" || scheme == "rediss+sentinel") {
    throw InvalidArgument("invalid Sentinel URL '" + shown_url(url) + "': " + why +
                          " (expected redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]"
                          "[?sentinel_username=...&sentinel_password=...], or rediss+sentinel://... with the "
                          "ssl_* options)");
  }
  throw InvalidArgument("invalid store URL '" + shown_url(url) + "': " + why +
                        " (expected memory://, redis://[[user]:password@]host[:port][/db], "
                        "rediss://[[user]:password@]host[:port][/db][?ssl_ca_certs=...&...], "
                        "redis+cluster://[[user]:password@]host:port,host:port[/db] (rediss+cluster:// for TLS), "
                        "redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db] "
                        "(rediss+sentinel:// for TLS) or "
                        "unix:///path/to/redis.sock[?db=N])");
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view url, std::string_view s, std::string_view where = "in credentials") {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) bad(url, "truncated %-escape " + std::string(where));
      int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
      if (hi < 0 || lo < 0) bad(url, "bad %-escape " + std::string(where));
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
  if (!v || *v < 0 || *v > 1'000'000) bad(url, "database must be a number >= 0, got '" + printable(s, 24) + "'");
  return static_cast<int>(*v);
}

constexpr std::string_view kTlsOptions[] = {"ssl_ca_certs",       "ssl_certfile",       "ssl_keyfile",
                                            "ssl_cert_reqs",      "ssl_check_hostname", "ssl_server_name"};

bool is_tls_option(std::string_view name) {
  for (auto n : kTlsOptions) {
    if (n == name) return true;
  }
  return false;
}

bool is_sentinel_option(std::string_view name) { return name == "sentinel_username" || name == "sentinel_password"; }

// Applies the "?k=v&k=v" query of any URL but memory://: the ssl_* options (rediss
// schemes), db=N (unix://), the sentinels' credentials (Sentinel schemes).
void apply_query(std::string_view url, std::string_view query, StoreOptions& o) {
  const bool unix_socket = o.kind == StoreOptions::Kind::Unix;
  std::string seen = "&";
  while (!query.empty()) {
    auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;  // "?a=1&&b=2" or a trailing '&'
    auto eq = pair.find('=');
    const std::string_view name = pair.substr(0, eq);
    // Built by appending: GCC 12 at -O3 reports a false -Wrestrict for "'" + std::string(...).
    std::string shown = "(name not shown)";
    if (showable_query_name(name)) {
      shown.assign(1, '\'');
      shown.append(name);
      shown.push_back('\'');
    }
    // A Sentinel URL takes any showable ssl_* name here: set_tls_option names the one it
    // does not know, or the scheme that would take it.
    const bool known = is_tls_option(name) || (unix_socket && name == "db") ||
                       (o.sentinel && (is_sentinel_option(name) ||
                                       (name.starts_with("ssl_") && showable_query_name(name))));
    if (!known) {
      if (unix_socket) bad(url, "unknown query parameter " + shown + " (unix:// takes db=N)");
      if (name == "db") {
        bad(url, o.sentinel ? "the database goes in the path (.../service/N), not in the query"
                            : "the database goes in the path (redis://host:port/N), not in the query");
      }
      if (o.sentinel) {
        bad(url, "unknown query parameter " + shown +
                     " (accepted: sentinel_username, sentinel_password, and the ssl_* options of rediss+sentinel://)");
      }
      std::string accepted;
      for (auto n : kTlsOptions) {
        if (!accepted.empty()) accepted.append(", ");
        accepted.append(n);
      }
      bad(url, "unknown query parameter " + shown + " (rediss:// accepts " + accepted + ")");
    }
    std::string delimited("&");
    delimited.append(name);
    delimited.push_back('&');
    if (seen.find(delimited) != std::string::npos) bad(url, "query parameter " + shown + " is given twice");
    seen.append(delimited, 1, std::string::npos);
    if (eq == std::string_view::npos) bad(url, "query parameter " + shown + " needs a value (name=...)");
    std::string where("in query parameter ");
    where.append(shown);
    const std::string value = percent_decode(url, pair.substr(eq + 1), where);
    if (name == "db") {
      o.db = parse_db(url, value);
      continue;
    }
    const bool sentinel_option = o.sentinel && is_sentinel_option(name);
    if (o.sentinel && !sentinel_option && !o.tls) {
      bad(url, std::string(name) + " applies to rediss+sentinel:// only (TLS)");
    }
    try {
      if (sentinel_option) {
        set_sentinel_option(o, name, value);
      } else {
        set_tls_option(o, name, value);
      }
    } catch (const InvalidArgument& e) {
      // Their messages name the option and its allowed values, and quote a value only for
      // enumerations (never a password): safe to pass on.
      bad(url, e.what());
    }
  }
  if (o.sentinel && !o.sentinel_username.empty() && o.sentinel_password.empty()) {
    bad(url, "sentinel_username needs sentinel_password");
  }
}

// One "host[:port]" or "[v6][:port]" of a URL's host list. `which` names it in messages
// when the list is of sentinels ("sentinel #2"), empty for a server or seed.
Address parse_host_port(std::string_view url, std::string_view item, int default_port, const std::string& which = {}) {
  const std::string prefix = which.empty() ? std::string() : which + ": ";
  if (item.empty()) bad(url, which.empty() ? "missing host" : which + " is empty (two commas, or a comma at an end)");
  Address a{"", default_port};
  std::string_view port_text;
  bool has_port = false;
  if (item.front() == '[') {  // [IPv6]:port
    const auto close = item.find(']');
    if (close == std::string_view::npos) bad(url, prefix + "unterminated [IPv6] host");
    a.host = std::string(item.substr(1, close - 1));
    const std::string_view tail = item.substr(close + 1);
    if (!tail.empty()) {
      if (tail.front() != ':') bad(url, prefix + "junk after the [IPv6] host");
      port_text = tail.substr(1);
      has_port = true;
    }
  } else {
    const auto colon = item.rfind(':');
    a.host = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = item.substr(colon + 1);
      has_port = true;
    }
  }
  if (a.host.empty()) bad(url, which.empty() ? "missing host" : which + " has no host");
  for (char c : a.host) {
    if (c == '/' || c == '?' || c == '#' || c == ' ' || c == '@' || c == ',' || static_cast<unsigned char>(c) < 0x20) {
      bad(url, prefix + "the host contains an invalid character");
    }
  }
  if (has_port) {
    const auto p = parse_int64(port_text);
    if (!p || *p < 1 || *p > 65535) {
      bad(url, (which.empty() ? std::string() : which + " (" + printable(a.host, 64) + "): ") +
                   "port must be a number 1-65535, got '" + printable(port_text, 16) + "'");
    }
    a.port = static_cast<int>(*p);
  }
  return a;
}

// The credentials in front of the hosts, "[[user]:password@]", up to the last '@' so that
// a password may hold '@' and '/' unescaped; `rest` keeps what follows them.
void take_credentials(std::string_view url, std::string_view& rest, StoreOptions& o) {
  const auto at = rest.rfind('@');
  if (at == std::string_view::npos) return;
  const std::string_view cred = rest.substr(0, at);
  rest = rest.substr(at + 1);
  const auto colon = cred.find(':');
  if (colon == std::string_view::npos) {
    // redis://password@host is a common shorthand for the default user.
    o.password = percent_decode(url, cred);
  } else {
    o.username = percent_decode(url, cred.substr(0, colon));
    o.password = percent_decode(url, cred.substr(colon + 1));
  }
  if (o.password.empty() && !o.username.empty()) bad(url, "a user name needs a password");
}

// The query starts at the first '?', as in any URL: a '?' in a password must be written
// %3F. It is applied last, once the scheme has said whether TLS is on.
std::string_view take_query(std::string_view url, std::string_view& rest) {
  const auto q = rest.find('?');
  if (q == std::string_view::npos) return {};
  const std::string_view query = rest.substr(q + 1);
  rest = rest.substr(0, q);
  // Most likely a password with a raw '?' in it: say so without echoing any of it.
  if (query.find('@') != std::string_view::npos) {
    bad(url, "'@' after the '?': percent-encode '?' as %3F and '@' as %40 in passwords and query values");
  }
  return query;
}

// "s1[:port],s2[:port].../service[/db]": what follows the credentials of a Sentinel URL.
void parse_sentinel_path(std::string_view url, std::string_view rest, StoreOptions& o) {
  const auto slash = rest.find('/');
  const std::string_view hosts = rest.substr(0, slash);
  if (hosts.empty()) bad(url, "no sentinel address before the service name");
  std::size_t n = 0;
  for (std::string_view list = hosts;;) {
    const auto comma = list.find(',');
    Address a = parse_host_port(url, list.substr(0, comma), kDefaultSentinelPort, "sentinel #" + std::to_string(++n));
    for (const auto& b : o.sentinels) {
      if (b == a) bad(url, "sentinel " + printable(a.text(), 80) + " is listed twice");
    }
    o.sentinels.push_back(std::move(a));
    if (comma == std::string_view::npos) break;
    list = list.substr(comma + 1);
  }
  if (slash == std::string_view::npos || slash + 1 == rest.size()) {
    bad(url, "missing the service name (the master's name in `sentinel monitor`) after the sentinels");
  }
  const std::string_view path = rest.substr(slash + 1);
  const auto second = path.find('/');
  o.sentinel_service = percent_decode(url, path.substr(0, second), "in the service name");
  if (o.sentinel_service.empty()) bad(url, "the service name is empty");
  for (char c : o.sentinel_service) {
    if (c == ' ' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      bad(url, "the service name contains a space or a control character");
    }
  }
  // It is shown in the store's URL, its repr and error messages, which Python decodes
  // strictly: %-escapes must make UTF-8.
  if (!is_valid_utf8(o.sentinel_service)) {
    bad(url, "the service name is not valid UTF-8 once %-decoded: '" + printable(o.sentinel_service, 80) + "'");
  }
  if (second != std::string_view::npos) {
    const std::string_view db = path.substr(second + 1);
    if (db.find('/') != std::string_view::npos) bad(url, "junk after the database number");
    if (!db.empty()) o.db = parse_db(url, db);
  }
}

}  // namespace

void set_tls_option(StoreOptions& o, std::string_view name, std::string_view value) {
  const std::string n(name);
  if (!is_tls_option(name)) throw InvalidArgument("unknown TLS option '" + n + "'");
  if (!o.tls) {
    throw InvalidArgument(n + " applies to TLS connections only: use a rediss:// URL (this one is " +
                          (o.kind == StoreOptions::Kind::Unix ? "unix://" : o.kind == StoreOptions::Kind::Memory
                                                                                 ? "memory://"
                                                                                 : "redis://") +
                          ")");
  }
  if (name == "ssl_cert_reqs") {
    const std::string v = ascii_lower(value);
    if (v == "required" || v == "cert_required") {
      o.ssl_cert_reqs = StoreOptions::CertReqs::Required;
    } else if (v == "optional" || v == "cert_optional") {
      o.ssl_cert_reqs = StoreOptions::CertReqs::Optional;
    } else if (v == "none" || v == "cert_none") {
      o.ssl_cert_reqs = StoreOptions::CertReqs::None;
    } else {
      throw InvalidArgument("ssl_cert_reqs must be required, optional or none (the value given is not shown: a URL's query values may be secrets)");
    }
    return;
  }
  if (name == "ssl_check_hostname") {
    const std::string v = ascii_lower(value);
    if (v == "true" || v == "1") {
      o.ssl_check_hostname = true;
    } else if (v == "false" || v == "0") {
      o.ssl_check_hostname = false;
    } else {
      throw InvalidArgument("ssl_check_hostname must be true, false, 1 or 0 (the value given is not shown: a URL's query values may be secrets)");
    }
    return;
  }
  // The rest are file paths or a host name: text that must not be empty.
  if (value.empty()) throw InvalidArgument(n + " must not be empty");
  if (value.find('\0') != std::string_view::npos) throw InvalidArgument(n + " must not contain a NUL byte");
  if (name == "ssl_ca_certs") {
    o.ssl_ca_certs = std::string(value);
  } else if (name == "ssl_certfile") {
    o.ssl_certfile = std::string(value);
  } else if (name == "ssl_keyfile") {
    o.ssl_keyfile = std::string(value);
  } else {
    for (char c : value) {
      if (c == '/' || c == ' ' || static_cast<unsigned char>(c) < 0x20) {
        throw InvalidArgument("ssl_server_name must be a host name, without '/', spaces or control characters (the value given is not shown: a URL's query values may be secrets)");
      }
    }
    o.ssl_server_name = std::string(value);
  }
}

void set_sentinel_option(StoreOptions& o, std::string_view name, std::string_view value) {
  if (name != "sentinel_username" && name != "sentinel_password") {
    throw InvalidArgument("unknown Sentinel option '" + printable(name, 40) +
                          "' (accepted: sentinel_username, sentinel_password)");
  }
  if (!o.sentinel) {
    throw InvalidArgument(std::string(name) +
                          " applies to Redis Sentinel only: use a redis+sentinel:// or rediss+sentinel:// URL");
  }
  if (value.find('\0') != std::string_view::npos) {
    throw InvalidArgument(std::string(name) + " must not contain a NUL byte");
  }
  (name == "sentinel_username" ? o.sentinel_username : o.sentinel_password) = std::string(value);
}

bool is_sentinel_url(std::string_view url) {
  return url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://");
}

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
  if (scheme == "unix") {
    o.kind = StoreOptions::Kind::Unix;
    auto q = rest.find('?');
    std::string_view path = rest.substr(0, q);
    if (path.empty() || path[0] != '/') bad(url, "unix socket path must be absolute (unix:///path)");
    o.unix_path = std::string(path);
    if (q != std::string_view::npos) apply_query(url, rest.substr(q + 1), o);
    return o;
  }
  const bool cluster = scheme == "redis+cluster" || scheme == "rediss+cluster";
  const bool sentinel = scheme == "redis+sentinel" || scheme == "rediss+sentinel";
  if (scheme != "redis" && scheme != "rediss" && !cluster && !sentinel) {
    // A '@' means credentials came before the "://" (a mistyped URL): do not echo them.
    bad(url, "unknown scheme '" + (scheme.find('@') == std::string_view::npos ? std::string(scheme) : "***") + "'");
  }

  o.kind = StoreOptions::Kind::Tcp;
  o.tls = scheme.starts_with("rediss");
  o.cluster = cluster;
  o.sentinel = sentinel;
  const std::string_view query = take_query(url, rest);
  take_credentials(url, rest, o);
  if (sentinel) {
    parse_sentinel_path(url, rest, o);
    apply_query(url, query, o);
    // Until a sentinel names the master: the first sentinel, for messages only.
    o.host = o.sentinels.front().host;
    o.port = o.sentinels.front().port;
    return o;
  }
  auto slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) o.db = parse_db(url, db);
  }
  if (hostport.empty()) bad(url, "missing host");
  if (!cluster && hostport.find(',') != std::string_view::npos) {
    bad(url, "several hosts are for a Redis Cluster: use redis+cluster://host1:port1,host2:port2");
  }
  while (true) {
    const auto comma = hostport.find(',');
    o.seeds.push_back(parse_host_port(url, hostport.substr(0, comma), kDefaultPort));
    if (comma == std::string_view::npos) break;
    hostport = hostport.substr(comma + 1);
  }
  o.host = o.seeds.front().host;
  o.port = o.seeds.front().port;
  if (!cluster) o.seeds.clear();
  apply_query(url, query, o);
  return o;
}

}  // namespace redcount
