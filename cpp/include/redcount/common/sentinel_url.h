// The Sentinel URL: where the sentinels are, which service to follow, and how to talk to
// the master once found.
//
//   SentinelUrl u = parse_sentinel_url("redis+sentinel://app:pw@s1:26379,s2:26379/cache/2"
//                                      "?sentinel_password=spw");
//   u.sentinels          // {{"s1", 26379}, {"s2", 26379}}
//   u.service            // "cache"
//   u.master             // StoreOptions: Tcp, user "app", password "pw", db 2 (host/port unset)
//   u.sentinel_password  // "spw"
//
// Accepted:
//   redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db][?query]
//   rediss+sentinel://...   (TLS to the sentinels and to the master, with the same options)
// A sentinel without a port is on 26379; an IPv6 sentinel is written [addr]:port. The
// credentials in front are the master's (as in redis://), not the sentinels': those come
// from the query (or keyword options) `sentinel_username` and `sentinel_password`, so a
// Sentinel without requirepass needs nothing. rediss+sentinel:// also takes the TLS query
// parameters of rediss:// (ssl_ca_certs, ...). Percent-escapes are decoded in the
// credentials, the service name and query values. Errors are InvalidArgument naming what
// is wrong, and never show a password or a query value.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "redcount/common/options.h"

namespace redcount {

// host:port of a TCP endpoint (a sentinel or a data node).
struct Address {
  std::string host;
  int port = 0;

  // "host:port", or "[v6]:port" for an IPv6 literal.
  std::string to_string() const;
  friend bool operator==(const Address&, const Address&) = default;
};

inline constexpr int kDefaultSentinelPort = 26379;

struct SentinelUrl {
  std::vector<Address> sentinels;  // in the URL's order, no duplicates
  std::string service;
  // The master's connection options: kind Tcp, tls, username, password, db and the ssl_*
  // options. host and port are left at their defaults: the resolver fills them in.
  StoreOptions master;
  std::string sentinel_username;  // empty = the sentinels' "default" user
  std::string sentinel_password;  // empty = no AUTH to the sentinels
};

// True for the redis+sentinel:// and rediss+sentinel:// schemes.
bool is_sentinel_url(std::string_view url);

// Throws InvalidArgument naming the part of the URL that is wrong.
SentinelUrl parse_sentinel_url(std::string_view url);

// Sets sentinel_username or sentinel_password (keyword options override the URL's query
// this way). Throws InvalidArgument for another name or a value with a NUL byte.
void set_sentinel_option(SentinelUrl& u, std::string_view name, std::string_view value);

}  // namespace redcount
