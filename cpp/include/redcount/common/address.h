// host:port of one TCP endpoint: a server, a seed of a cluster URL, a cluster node named by
// CLUSTER SLOTS or MOVED, a sentinel, the master a sentinel names.
//
//   Address a{"::1", 6380};
//   a.text();  // "[::1]:6380"
#pragma once

#include <string>

namespace redcount {

struct Address {
  std::string host;
  int port = 0;

  // "host:port", or "[v6]:port" for an IPv6 literal (a host with a ':' in it), as URLs and
  // messages write it.
  std::string text() const {
    if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
    return host + ":" + std::to_string(port);
  }
  friend bool operator==(const Address&, const Address&) = default;
};

}  // namespace redcount
