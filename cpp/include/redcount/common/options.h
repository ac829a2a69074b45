// Options for opening a store, and the URL parser that fills them.
//
//   StoreOptions o = parse_url("redis://app:secret@cache:6380/2");
//   o.command_timeout = std::chrono::milliseconds(500);
//   auto store = open_store(o);
//
// Accepted URLs:
//   memory://
//   redis://[[user]:password@]host[:port][/db]
//   rediss://[[user]:password@]host[:port][/db][?query]   (TLS)
//   unix:///path/to/redis.sock[?db=N]
//   redis+cluster://[[user]:password@]host1:port1,host2:port2[/db]  (Redis Cluster)
//   rediss+cluster://...[?query]                                     (Redis Cluster over TLS)
//   redis+sentinel://[[user]:password@]s1[:port][,s2[:port]...]/service[/db][?query]
//   rediss+sentinel://...   (Redis Sentinel; TLS to the sentinels and to the master)
// A cluster URL lists seed nodes (any of them; the rest are learned from CLUSTER SLOTS);
// a database other than 0 needs a server that has several in cluster mode (Valkey 9 with
// cluster-databases): every connection to every node SELECTs it, and Redis refuses it then.
// A Sentinel URL lists sentinels (without a port: 26379; no one twice) and names the
// service (the master's name in `sentinel monitor`, %-escapes decoded, UTF-8). The
// credentials in front are the master's, as in redis://; the sentinels' own come from the
// query, sentinel_username=...&sentinel_password=..., so a Sentinel without requirepass
// needs nothing. rediss+sentinel:// also takes the ssl_* parameters below.
// A ring is not a URL: each member is one of these URLs (a server or a Sentinel group).
// The rediss:// query takes redis-py's names, percent-encoded values, '&'-separated:
//   ssl_ca_certs=PATH  ssl_certfile=PATH  ssl_keyfile=PATH  ssl_cert_reqs=required|optional|none
//   ssl_check_hostname=true|false|1|0  ssl_server_name=NAME
// Any other query parameter is an error; so is a TLS option on a redis:// or unix:// URL.
// Errors never show credentials or query values. One parser reads every scheme, with one
// set of helpers (credentials, %-escapes, host:port, database, query).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redcount/common/address.h"
#include "redcount/common/clock.h"

namespace redcount {

inline constexpr int kDefaultPort = 6379;
inline constexpr int kDefaultSentinelPort = 26379;

struct StoreOptions {
  enum class Kind { Memory, Tcp, Unix };
  Kind kind = Kind::Memory;
  std::string host = "127.0.0.1";
  int port = kDefaultPort;
  std::string unix_path;
  std::string username;  // empty = the "default" ACL user (AUTH password)
  std::string password;  // empty = no AUTH
  int db = 0;
  // Redis Cluster: the seed nodes of a redis+cluster:// URL (host and port are the first).
  bool cluster = false;
  std::vector<Address> seeds;
  // A client-side hash ring (redis/topology/ring.h) over standalone servers: one entry per member,
  // each a redis:// or rediss:// server with its own address, credentials, database and
  // TLS settings; `ring_names` are their names on the ring (empty: "host:port" each). The
  // store routes by the key's hash slot, as on a cluster, from a table computed from the
  // names. Empty for any other store.
  std::vector<StoreOptions> ring;
  std::vector<std::string> ring_names;
  // Redis Sentinel (a redis+sentinel:// URL): the sentinels to ask, the service (the
  // master's name in `sentinel monitor`) and the sentinels' own credentials. The master's
  // host and port are not in the URL: the store fills them in from the sentinels, and
  // every connection checks ROLE in its handshake.
  bool sentinel = false;
  std::vector<Address> sentinels;  // in the URL's order, no duplicates
  std::string sentinel_service;
  std::string sentinel_username;  // empty = the sentinels' "default" user
  std::string sentinel_password;  // empty = no AUTH to the sentinels

  std::chrono::milliseconds connect_timeout{2000};  // 0 = wait forever
  std::chrono::milliseconds command_timeout{2000};  // 0 = wait forever
  bool keepalive = true;                            // TCP keepalive on every connection
  int max_connections = 1;  // sockets in all (>= 1); above `connections`: thread connections
  std::chrono::milliseconds pool_timeout{2000};     // wait for a free connection; 0 = forever
  std::chrono::milliseconds reconnect_backoff_min{10};
  std::chrono::milliseconds reconnect_backoff_max{1000};
  int connections = 1;  // multiplexed connections per server, 1..4
  // How long a synchronous caller waiting alone for its reply (the only thread calling the
  // store) polls its socket before it sleeps in recv(). On a virtual machine a sleeping
  // thread's wake-up costs tens of microseconds, more than a loopback round trip, so a short
  // poll roughly halves the wait for a nearby server; it yields the CPU between two reads,
  // so that processes outnumbering the CPUs do not starve each other. Only while the
  // store's replies have been arriving within twice this time (a distant server turns it
  // off by itself). -1 = automatic: 100 us on a machine with two or more CPUs, none on one;
  // 0 = never.
  std::chrono::microseconds spin{-1};

  // TLS (rediss://), with redis-py's option names; also accepted as URL query parameters.
  enum class CertReqs { Required, Optional, None };
  bool tls = false;
  std::string ssl_ca_certs;                       // CA bundle (PEM); empty = the system trust store
  std::string ssl_certfile;                       // client certificate (mutual TLS); empty = none
  std::string ssl_keyfile;                        // its private key; empty = in ssl_certfile
  // Optional verifies like Required (a TLS server always presents a certificate; Python's
  // ssl module treats CERT_OPTIONAL the same for clients). None verifies nothing, so it
  // also turns the hostname check off.
  CertReqs ssl_cert_reqs = CertReqs::Required;    // None only when asked, with a warning
  bool ssl_check_hostname = true;                 // the certificate must name `host`
  std::string ssl_server_name;                    // SNI and the name checked; empty = host

  // Memory store only.
  std::shared_ptr<Clock> clock;                      // null = system clock
  std::chrono::milliseconds sweep_interval{100};     // background expiry sweep period
};

// Throws InvalidArgument naming the part of the URL that is wrong.
StoreOptions parse_url(std::string_view url);

// True for the redis+sentinel:// and rediss+sentinel:// schemes.
bool is_sentinel_url(std::string_view url);

// Sets one TLS option by its redis-py name from its text form, as a URL query does
// (set_tls_option(o, "ssl_cert_reqs", "none")); keyword arguments use it to override the
// URL. Throws InvalidArgument for an unknown name, a bad value, or when `o.tls` is false.
void set_tls_option(StoreOptions& o, std::string_view name, std::string_view value);

// Sets sentinel_username or sentinel_password (keyword arguments override the URL's query
// this way). Throws InvalidArgument for another name, a value with a NUL byte, or when `o`
// is not a Sentinel store.
void set_sentinel_option(StoreOptions& o, std::string_view name, std::string_view value);

}  // namespace redcount
