// libFuzzer target: the store URL parser (parse_url, what open_store and redcount.connect()
// read) and the TLS and Sentinel options that keyword arguments set afterwards.
//
// Input: a URL, optionally followed by lines "name=value" applied with set_tls_option or
// set_sentinel_option. Any input must either parse into options that hold together or be
// refused with InvalidArgument; an error message never repeats the URL's credentials.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "redcount/common/errors.h"
#include "redcount/common/options.h"
#include "redcount/common/util.h"

using namespace redcount;

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

void check_options(const StoreOptions& o) {
  require(o.db >= 0, "db >= 0");
  switch (o.kind) {
    case StoreOptions::Kind::Memory:
      break;
    case StoreOptions::Kind::Unix:
      require(!o.unix_path.empty() && o.unix_path[0] == '/', "unix path is absolute");
      break;
    case StoreOptions::Kind::Tcp:
      require(!o.host.empty(), "host is not empty");
      require(o.port >= 1 && o.port <= 65535, "port in 1-65535");
      if (o.cluster) {
        require(!o.seeds.empty(), "a cluster has seeds");
        for (const auto& s : o.seeds) require(!s.host.empty() && s.port >= 1 && s.port <= 65535, "seed address");
      }
      if (o.sentinel) {
        require(!o.sentinels.empty(), "sentinel list not empty");
        require(!o.sentinel_service.empty(), "sentinel service not empty");
        for (const auto& s : o.sentinels) require(!s.host.empty() && s.port >= 1 && s.port <= 65535, "sentinel address");
      }
      break;
  }
  if (!o.username.empty()) require(!o.password.empty(), "a user name comes with a password");
}

// Everything that may be a credential: up to the last '@' before any '?', minus the scheme
// and "://" when those come first and hold no '@' themselves.
std::string_view written_credentials(std::string_view url) {
  std::string_view head = url.substr(0, url.find('?'));
  const auto at = head.rfind('@');
  if (at == std::string_view::npos) return {};
  head = head.substr(0, at);
  const auto scheme_end = head.find("://");
  if (scheme_end != std::string_view::npos && head.substr(0, scheme_end).find('@') == std::string_view::npos) {
    head.remove_prefix(scheme_end + 3);
  }
  return head;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const std::size_t n = utf8_char_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto newline = input.find('\n');
  const std::string_view url = input.substr(0, newline);
  StoreOptions o;
  try {
    o = parse_url(url);
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    // Python decodes the message strictly: text that came in as UTF-8 leaves as UTF-8.
    if (valid_utf8(url)) require(valid_utf8(message), "an error message is valid UTF-8");
    const std::string_view cred = written_credentials(url);
    // Credentials long enough not to turn up in the message by chance, without the spaces
    // every fixed phrase of the messages has, and not repeated after the '@' (where they
    // may be shown as the host or the path).
    const std::size_t cred_at = cred.empty() ? 0 : static_cast<std::size_t>(cred.data() - url.data());
    const std::string_view after = url.substr(std::min(url.size(), cred_at + cred.size() + 1));
    if (cred.size() >= 12 && cred.find(' ') == std::string_view::npos &&
        after.find(cred) == std::string_view::npos && message.find(cred) != std::string::npos) {
      // Still there with the credentials overwritten: the text is the message's own. The
      // ':' stay, so the URL keeps its user/password split and takes the same path.
      std::string masked(url);
      for (std::size_t i = 0; i < cred.size(); ++i) {
        if (masked[cred_at + i] != ':') masked[cred_at + i] = 'Q';
      }
      std::string message2;
      try {
        parse_url(masked);
      } catch (const InvalidArgument& e2) {
        message2 = e2.what();
      }
      require(message2.find(cred) != std::string::npos, "an error message repeats the credentials");
    }
    return 0;
  }
  check_options(o);
  std::string_view lines = newline == std::string_view::npos ? std::string_view() : input.substr(newline + 1);
  while (!lines.empty()) {
    const auto end = lines.find('\n');
    const std::string_view line = lines.substr(0, end);
    lines = end == std::string_view::npos ? std::string_view() : lines.substr(end + 1);
    const auto eq = line.find('=');
    const std::string_view name = line.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view() : line.substr(eq + 1);
    try {
      if (name.substr(0, 9) == "sentinel_") set_sentinel_option(o, name, value);
      else set_tls_option(o, name, value);
    } catch (const InvalidArgument&) {
    }
  }
  check_options(o);
  return 0;
}
