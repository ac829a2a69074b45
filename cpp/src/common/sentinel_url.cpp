#include "redcount/common/sentinel_url.h"

#include <cctype>

#include "redcount/common/errors.h"
#include "redcount/common/util.h"
#include "redcount/common/window.h"

namespace redcount {

std::string Address::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

constexpr std::string_view kForm =
    " (expected redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]"
    "[?sentinel_username=...&sentinel_password=...], or rediss+sentinel://... with the ssl_* options)";

// The URL as it may be shown in an error: credentials and every query value masked. The
// credentials run to the last '@' anywhere, as the parser reads them, so a password with a
// raw '?' in it is masked too.
std::string shown_url(std::string_view url) {
  std::string shown(url);
  const auto scheme_end = shown.find("://");
  if (const auto at = shown.rfind('@'); at != std::string::npos) {
    const std::size_t from = scheme_end != std::string::npos && at > scheme_end ? scheme_end + 3 : 0;
    shown = shown.substr(0, from) + "***@" + shown.substr(at + 1);
  }
  if (const auto q = shown.find('?'); q != std::string::npos) {
    std::string masked = shown.substr(0, q + 1);
    std::string_view rest = std::string_view(shown).substr(q + 1);
    while (true) {
      const auto amp = rest.find('&');
      const std::string_view pair = rest.substr(0, amp);
      const auto eq = pair.find('=');
      masked.append(pair.substr(0, eq));
      if (eq != std::string_view::npos) masked += "=***";
      if (amp == std::string_view::npos) break;
      masked += '&';
      rest = rest.substr(amp + 1);
    }
    shown = std::move(masked);
  }
  return printable(shown, 200);
}

[[noreturn]] void bad(std::string_view url, const std::string& why) {
  throw InvalidArgument("invalid Sentinel URL '" + shown_url(url) + "': " + why + std::string(kForm));
}

int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view url, std::string_view s, const std::string& where) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) bad(url, "truncated %-escape " + where);
    const int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
    if (hi < 0 || lo < 0) bad(url, "bad %-escape " + where);
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

bool bad_host_char(char c) {
  return c == '/' || c == '?' || c == '#' || c == ' ' || c == '@' || c == ',' || static_cast<unsigned char>(c) < 0x20;
}

// One "host[:port]" or "[v6][:port]" of the sentinel list; `n` is its 1-based position.
Address parse_sentinel(std::string_view url, std::string_view item, std::size_t n) {
  const std::string which = "sentinel #" + std::to_string(n);
  if (item.empty()) bad(url, which + " is empty (two commas, or a comma at an end)");
  Address a{"", kDefaultSentinelPort};
  std::string_view port_text;
  bool has_port = false;
  if (item.front() == '[') {
    const auto close = item.find(']');
    if (close == std::string_view::npos) bad(url, which + ": unterminated [IPv6] host");
    a.host = std::string(item.substr(1, close - 1));
    const std::string_view tail = item.substr(close + 1);
    if (!tail.empty()) {
      if (tail.front() != ':') bad(url, which + ": junk after the [IPv6] host");
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
  if (a.host.empty()) bad(url, which + " has no host");
  for (char c : a.host) {
    if (bad_host_char(c)) bad(url, which + ": the host contains an invalid character");
  }
  if (has_port) {
    const auto p = parse_int64(port_text);
    if (!p || *p < 1 || *p > 65535) {
      bad(url, which + " (" + printable(a.host, 64) + "): port must be a number 1-65535, got '" +
                   printable(port_text, 16) + "'");
    }
    a.port = static_cast<int>(*p);
  }
  return a;
}

void apply_query(std::string_view url, std::string_view query, SentinelUrl& u) {
  std::vector<std::string> seen;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    const std::string_view name = pair.substr(0, eq);
    std::string shown = "(name not shown)";
    if (showable_query_name(name)) {
      shown.assign(1, '\'');
      shown.append(name);
      shown.push_back('\'');
    }
    const bool sentinel_option = name == "sentinel_username" || name == "sentinel_password";
    if (!sentinel_option && !(name.starts_with("ssl_") && showable_query_name(name))) {
      if (name == "db") bad(url, "the database goes in the path (.../service/N), not in the query");
      bad(url, std::string("unknown query parameter ") + shown +
                   " (accepted: sentinel_username, sentinel_password, and the ssl_* options of rediss+sentinel://)");
    }
    for (const auto& s : seen) {
      if (s == name) bad(url, "query parameter " + shown + " is given twice");
    }
    seen.emplace_back(name);
    if (eq == std::string_view::npos) bad(url, "query parameter " + shown + " needs a value (name=...)");
    const std::string value = percent_decode(url, pair.substr(eq + 1), "in query parameter " + shown);
    if (!sentinel_option && !u.master.tls) {
      bad(url, std::string(name) + " applies to rediss+sentinel:// only (TLS)");
    }
    try {
      if (sentinel_option) {
        set_sentinel_option(u, name, value);
      } else {
        set_tls_option(u.master, name, value);
      }
    } catch (const InvalidArgument& e) {
      // set_tls_option's messages name the option and its allowed values, and quote a
      // value only for enumerations (never a password): safe to pass on.
      bad(url, e.what());
    }
  }
  if (!u.sentinel_username.empty() && u.sentinel_password.empty()) {
    bad(url, "sentinel_username needs sentinel_password");
  }
}

}  // namespace

bool is_sentinel_url(std::string_view url) {
  return url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://");
}

void set_sentinel_option(SentinelUrl& u, std::string_view name, std::string_view value) {
  if (name != "sentinel_username" && name != "sentinel_password") {
    throw InvalidArgument("unknown Sentinel option '" + printable(name, 40) +
                          "' (accepted: sentinel_username, sentinel_password)");
  }
  if (value.find('\0') != std::string_view::npos) {
    throw InvalidArgument(std::string(name) + " must not contain a NUL byte");
  }
  (name == "sentinel_username" ? u.sentinel_username : u.sentinel_password) = std::string(value);
}

SentinelUrl parse_sentinel_url(std::string_view url) {
  SentinelUrl u;
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) bad(url, "missing scheme");
  const std::string_view scheme = url.substr(0, scheme_end);
  if (scheme != "redis+sentinel" && scheme != "rediss+sentinel") {
    bad(url, "the scheme must be redis+sentinel or rediss+sentinel, got '" +
                 (scheme.find('@') == std::string_view::npos ? printable(scheme, 40) : std::string("***")) + "'");
  }
  u.master.kind = StoreOptions::Kind::Tcp;
  u.master.tls = scheme == "rediss+sentinel";
  std::string_view rest = url.substr(scheme_end + 3);

  std::string_view query;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    if (query.find('@') != std::string_view::npos) {
      bad(url, "'@' after the '?': percent-encode '?' as %3F and '@' as %40 in passwords and query values");
    }
  }
  // Credentials end at the last '@', so a password may hold '@' and '/' unescaped.
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const auto colon = cred.find(':');
    if (colon == std::string_view::npos) {
      u.master.password = percent_decode(url, cred, "in credentials");
    } else {
      u.master.username = percent_decode(url, cred.substr(0, colon), "in credentials");
      u.master.password = percent_decode(url, cred.substr(colon + 1), "in credentials");
    }
    if (u.master.password.empty() && !u.master.username.empty()) bad(url, "a user name needs a password");
  }

  const auto slash = rest.find('/');
  const std::string_view hosts = rest.substr(0, slash);
  if (hosts.empty()) bad(url, "no sentinel address before the service name");
  std::size_t n = 0;
  for (std::string_view list = hosts;;) {
    const auto comma = list.find(',');
    Address a = parse_sentinel(url, list.substr(0, comma), ++n);
    for (const auto& b : u.sentinels) {
      if (b == a) bad(url, "sentinel " + printable(a.to_string(), 80) + " is listed twice");
    }
    u.sentinels.push_back(std::move(a));
    if (comma == std::string_view::npos) break;
    list = list.substr(comma + 1);
  }

  if (slash == std::string_view::npos || slash + 1 == rest.size()) {
    bad(url, "missing the service name (the master's name in `sentinel monitor`) after the sentinels");
  }
  std::string_view path = rest.substr(slash + 1);
  const auto second = path.find('/');
  u.service = percent_decode(url, path.substr(0, second), "in the service name");
  if (u.service.empty()) bad(url, "the service name is empty");
  for (char c : u.service) {
    if (c == ' ' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      bad(url, "the service name contains a space or a control character");
    }
  }
  // It is shown in the store's URL, its repr and error messages, which Python decodes
  // strictly: %-escapes must make UTF-8.
  if (!is_valid_utf8(u.service)) {
    bad(url, "the service name is not valid UTF-8 once %-decoded: '" + printable(u.service, 80) + "'");
  }
  if (second != std::string_view::npos) {
    const std::string_view db = path.substr(second + 1);
    if (db.find('/') != std::string_view::npos) bad(url, "junk after the database number");
    if (!db.empty()) {
      const auto v = parse_int64(db);
      if (!v || *v < 0 || *v > 1'000'000) {
        bad(url, "database must be a number >= 0, got '" + printable(db, 24) + "'");
      }
      u.master.db = static_cast<int>(*v);
    }
  }
  apply_query(url, query, u);
  return u;
}

}  // namespace redcount
