// Finding and following the master of a Redis Sentinel service. Four pieces, each usable on
// its own, so the store can put them where its threads already are:
//
//   SentinelOptions o;
//   o.sentinels = {{"10.0.0.1", 26379}, {"10.0.0.2", 26379}};
//   o.service = "cache";
//   auto resolver = std::make_shared<SentinelResolver>(o);
//   Address master = resolver->resolve();          // asks the sentinels in order
//
//   SwitchMasterWatcher watcher(resolver, [&](const Address& a) { store.move_to(a); });
//   watcher.start();                               // its own thread, until stop()/destruction
//
//   // in each new connection's handshake, after AUTH: send role_command(), then
//   expect_master(reply, where);                   // throws ConnectionError for a replica
//
//   RoleRecheck recheck;                           // every 5 s on an idle connection:
//   if (recheck.due(now)) { recheck.sent(now); send(role_command()); }
//
// Every network call here is blocking and bounded by the options' short timeouts: this is
// control traffic (a few requests per failover, one subscription), never the data path,
// which stays with the engine. A `ControlLink` carries it: one plain or TLS connection
// made with the project's own transports (so `rediss+sentinel://` reuses the store's
// TlsContext), the RESP parser of resp.h, and poll() for the deadlines.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "redcount/common/address.h"
#include "redcount/common/options.h"
#include "redcount/redis/io/pipeline.h"
#include "redcount/redis/io/resp.h"
#include "redcount/redis/io/role.h"
#include "redcount/redis/io/transport.h"
#include "redcount/store/reply.h"
#include "redcount/store/store.h"

namespace redcount::redis {

// host:port of a TCP endpoint (a sentinel or a data node): common/address.h.
using redcount::Address;

// How to reach one control endpoint (a sentinel, or a data node for a ROLE probe).
struct LinkOptions {
  std::string username;  // ACL user; empty = the "default" user (AUTH password)
  std::string password;  // empty = no AUTH
  std::chrono::milliseconds connect_timeout{300};  // TCP connect + TLS handshake; 0 = wait forever
  std::chrono::milliseconds command_timeout{300};  // each reply; 0 = wait forever
  // TLS when set (make_tls_context(store_options)); null = plain TCP.
  std::shared_ptr<TlsContext> tls;
  std::string ssl_server_name;  // SNI and the certificate name checked; empty = the host
};

// One blocking connection for control traffic. Not thread-safe: one thread at a time.
// Errors: ConnectionError (refused, reset, EOF), TimeoutError (a deadline passed),
// AuthenticationError (AUTH refused), ProtocolError (bad bytes); each message names the
// address.
class ControlLink {
 public:
  // Connects (a host name is resolved in place, blocking), does TLS, then AUTH when a
  // password is set.
  ControlLink(const Address& address, const LinkOptions& options);
  ~ControlLink();
  ControlLink(const ControlLink&) = delete;
  ControlLink& operator=(const ControlLink&) = delete;

  // Sends one command and waits for its reply (an error reply is returned, not thrown).
  Reply call(const std::vector<std::string>& args);
  // Writes one command without waiting for a reply (SUBSCRIBE, PING in subscribed mode).
  void send(const std::vector<std::string>& args);
  // The next reply, or nullopt when none came before `deadline` (kNever = wait forever;
  // `wake_fd` >= 0: also returns nullopt as soon as that fd is readable).
  std::optional<Reply> next(TimePoint deadline, int wake_fd = -1);

  const Address& address() const noexcept { return address_; }
  int fd() const noexcept;

 private:
  void write_all(const std::string& bytes, TimePoint deadline);
  TimePoint command_deadline() const;

  Address address_;
  LinkOptions options_;
  std::string where_;
  std::unique_ptr<Transport> transport_;
  resp::Parser parser_;
};

// "redis+sentinel://[user@]s1:p,s2:p/service/db" (never a password).
std::string sentinel_url(const StoreOptions& o);

// --- the role of a data node (Role, parse_role: redis/io/role.h) ---------------------------

// A blocking probe: connects to `address`, sends ROLE, returns the role. Throws as
// ControlLink does.
Role probe_role(const Address& address, const LinkOptions& options);

// When to re-check the master's ROLE on a live connection: every `interval` (5 s by
// default), so a master demoted without a failover event reaching us (a partition, a
// missed +switch-master) is noticed within that time. No I/O: the store's reactor asks
// due(now), sends role_command() on an idle connection of the master, calls sent(now),
// and hands the reply to expect_master(). Not thread-safe: the reactor's thread owns it.
class RoleRecheck {
 public:
  explicit RoleRecheck(std::chrono::milliseconds interval = std::chrono::milliseconds(5000)) : interval_(interval) {}
  bool due(TimePoint now) const noexcept { return now >= next_; }
  void sent(TimePoint now) noexcept { next_ = now + interval_; }
  TimePoint next() const noexcept { return next_; }
  std::chrono::milliseconds interval() const noexcept { return interval_; }

 private:
  std::chrono::milliseconds interval_;
  TimePoint next_{};  // the epoch: due at once
};

// --- the sentinels ------------------------------------------------------------------------

struct SentinelOptions {
  std::vector<Address> sentinels;  // tried in this order at first (>= 1)
  std::string service;             // the master's name in `sentinel monitor <service> ...`
  // The sentinels' own credentials (Sentinel's requirepass / ACL), TLS and timeouts. The
  // timeouts are short on purpose: a dead sentinel costs this much before the next one.
  LinkOptions link;
  // How to reach the data nodes (their credentials and TLS): during a failover the watcher
  // asks the replica being promoted for its ROLE (SwitchMasterWatcher, "the failover hold").
  LinkOptions node_link;
};

// The resolver's options for a parsed redis+sentinel:// URL (common/options.h): its
// sentinels and service, the sentinels' credentials, the master's credentials for the
// node link, and `tls` (make_tls_context(o), or null for plain) for both links.
SentinelOptions sentinel_options(const StoreOptions& o, std::shared_ptr<TlsContext> tls);

// Asks the sentinels where the master of one service is. Thread-safe: the order of the
// sentinels is kept under a mutex that is never held across network I/O, so resolve()
// may run on several threads at once (each asks on a connection of its own).
class SentinelResolver {
 public:
  // Throws InvalidArgument for an empty sentinel list, an empty service name, or an
  // address with an empty host or a port outside 1-65535.
  explicit SentinelResolver(SentinelOptions options);

  // Tries each sentinel in the current order with `SENTINEL get-master-addr-by-name`,
  // returns the first address given, and moves the sentinel that gave it to the front.
  // A sentinel that fails or does not know the service is skipped. When none answers:
  // AuthenticationError if every sentinel refused AUTH, otherwise ConnectionError
  // (maybe_applied false) naming each sentinel and what went wrong with it.
  Address resolve();

  // The sentinels in the order the next resolve() tries them.
  std::vector<Address> sentinels() const;
  // Moves `sentinel` to the front (the watcher calls it when it subscribed there).
  void promote(const Address& sentinel);
  const SentinelOptions& options() const noexcept { return options_; }

  // Parses one reply of `SENTINEL get-master-addr-by-name`: nullopt for nil (the sentinel
  // does not know the service); throws ProtocolError for any other shape.
  static std::optional<Address> parse_master_reply(const Reply& reply);

 private:
  SentinelOptions options_;
  mutable std::mutex mu_;
  std::vector<Address> order_;
};

// Follows failovers: a thread of its own holds a subscription to `+switch-master` on every
// reachable sentinel of the service, up to kMaxLinks at once (the others are fallbacks, used
// when a link is lost), and calls `on_switch(new_master)` (on that thread) for the first
// announcement of each switch of this service. Every sentinel announces a switch, but not
// at the same moment: the one that runs a failover announces only once it has moved every
// other replica to the new master, while the others announce as soon as they hear of the
// promotion, which can be a second earlier; listening to all of them follows the earliest.
// A thread rather than the store's reactor because the subscriptions are long-lived
// sockets whose traffic is a few messages per failover, and a thread keeps this component
// free of the engine's internals.
//
// On subscribing to a sentinel it asks that sentinel for the master (`SENTINEL MASTER`,
// for the address and its config epoch) and reports the answer if it differs from the last
// address it reported, so a switch that happened while it was not subscribed is not missed.
// An announcement or answer whose config epoch is older than the one of the master it
// follows is ignored, so a sentinel that lags cannot move the client back (details at
// SwitchMasterWatcher::consider in sentinel.cpp). It PINGs each link every
// `ping_interval`; a link that fails, or leaves a PING unanswered past the link's
// command_timeout, is closed and re-established after a jittered backoff while the other
// links keep serving. The first live link (in the resolver's order at start) is promoted to
// the front of the resolver's order.
//
// The failover hold. `+switch-master` comes at the end of a failover, a second or more after
// the promotion; meanwhile the old master still acknowledges writes that the promoted
// replica never sees (with two replicas it even meets `min-replicas-to-write 1`: the other
// replica still follows it), and they are lost when Sentinel demotes it. So the watcher also
// listens for `+selected-slave`, which the sentinel running the failover publishes one timer
// tick (50-100 ms) before it sends `REPLICAOF NO ONE` to that replica. On it, it calls
// `on_hold(true)` (the store stops sending new calls to the old master and holds them), then
// asks the selected replica `ROLE` every kProbeInterval on a connection of its own
// (`node_link`): the moment it answers master, that replica is reported through on_switch,
// before any sentinel announces it. The hold also ends (`on_hold(false)`, calls go to the
// master followed, as before) on a `-failover-abort-*` event of the service, on a switch
// reported any other way, or kMaxHold after it began. A `+selected-slave` about another
// master than the one followed is ignored (a late message of an earlier failover).
//
// Until a sentinel confirms a master taken this way (kEarlyTrust at most), an answer or
// announcement naming the master it replaced is ignored: every sentinel still names that
// one until the failover ends. The followed epoch becomes one above the old master's, so a
// lagging sentinel's answer stays ignored after that too.
//
// Thread-safe: start(), stop() and request_resolve() may be called from any thread (start
// and stop not from on_switch or on_hold);
// the destructor stops the thread. `on_switch` and `on_hold` must not throw (an exception
// they throw is swallowed) and should return quickly.
class SwitchMasterWatcher {
 public:
  using Callback = std::function<void(const Address& new_master)>;
  using HoldCallback = std::function<void(bool holding)>;

  SwitchMasterWatcher(std::shared_ptr<SentinelResolver> resolver, Callback on_switch,
                      std::chrono::milliseconds ping_interval = std::chrono::milliseconds(1000),
                      HoldCallback on_hold = nullptr);
  ~SwitchMasterWatcher();
  SwitchMasterWatcher(const SwitchMasterWatcher&) = delete;
  SwitchMasterWatcher& operator=(const SwitchMasterWatcher&) = delete;

  // `known`: the master the caller already uses (from resolve()), so it is not reported
  // again; nullopt reports the first address learnt. Throws std::system_error when no
  // thread can be started; a second start() is a no-op.
  void start(std::optional<Address> known = std::nullopt);
  void stop();

  // Asks the watcher's thread to re-resolve the master now and report it through
  // on_switch if it changed: for a connection that met READONLY, NOREPLICAS, a ROLE that
  // is not master, or a disconnect. Never blocks (the reactor may call it); requests made
  // while one is pending are one, and resolutions are at least 100 ms apart. The answer
  // is reported whatever its config epoch: the data path has just seen that the master
  // followed now is not the master.
  void request_resolve() noexcept;

  // The first live subscription in the resolver's order at start, if any (for logs and
  // tests).
  std::optional<Address> subscribed_to() const;
  // Every live subscription, in the resolver's order at start.
  std::vector<Address> subscribed() const;
  // How many times a subscription was established, over all links (one per reachable
  // sentinel, up to kMaxLinks, after the start; one more for each link re-established).
  std::uint64_t subscriptions() const noexcept { return subscriptions_.load(); }

  // How many failover holds began, and how many ended by following the promoted replica
  // before any sentinel announced it (for tests and figures).
  std::uint64_t holds() const noexcept { return holds_.load(); }
  std::uint64_t early_switches() const noexcept { return early_switches_.load(); }
  // How many holds a `-failover-abort-*` event of the service ended.
  std::uint64_t aborted_holds() const noexcept { return aborted_holds_.load(); }

  // Subscriptions held at once; sentinels beyond them are fallbacks. Five: a deployment of
  // three or five sentinels has every one subscribed, so the one that runs a failover (any of
  // them; it alone publishes `+selected-slave`) is always heard.
  static constexpr std::size_t kMaxLinks = 5;
  // The failover hold (above): its longest duration, the interval of the ROLE probe, and how
  // long a master taken from the probe outranks the sentinels' answers naming the old one.
  static constexpr std::chrono::milliseconds kMaxHold{2000};
  static constexpr std::chrono::milliseconds kProbeInterval{2};
  static constexpr std::chrono::milliseconds kEarlyTrust{15000};
  // The channels the watcher subscribes to on each sentinel.
  static const std::vector<std::string>& channels();

  // Parses a `+selected-slave` payload "slave <name> <ip> <port> @ <service> <master-ip>
  // <master-port>": the selected replica and the master it replaces, when about `service`.
  struct Selection {
    Address replica;
    Address master;
  };
  static std::optional<Selection> parse_selected(std::string_view payload, std::string_view service);
  // True for a `-failover-abort-*` payload "master <service> <ip> <port>" of `service`.
  static bool is_abort_of(std::string_view payload, std::string_view service);

  // Parses a `+switch-master` message payload "<service> <old-ip> <old-port> <new-ip>
  // <new-port>": the new address when it is about `service`, nullopt otherwise.
  static std::optional<Address> parse_switch(std::string_view payload, std::string_view service);

 private:
  struct Link;      // one sentinel: its subscription, PING state and reconnection backoff
  struct Followed;  // the master reported last, and its config epoch when known
  void run(std::optional<Address> known);
  // Subscribes `link` to its sentinel and reports the master it names; throws on failure.
  void open(Link& link, Followed& f);
  // Reads every message queued on a live link; throws when the link fails.
  void drain(Link& link, Followed& f);
  // Reports `a`, named at config epoch `epoch` (nullopt: unknown), unless it is the
  // master followed already or its epoch is older than the followed master's.
  void consider(const Address& a, std::optional<std::uint64_t> epoch, Followed& f);
  void publish_links(const std::vector<Link>& links);
  void report(const Address& a, std::optional<Address>& last);
  // The failover hold: begin on `+selected-slave`, probe the replica, end.
  void begin_hold(const Selection& selected, Followed& f);
  void probe_hold(Followed& f);
  void end_hold(Followed& f);
  void wake() noexcept;
  void drain_wake() noexcept;

  static constexpr std::chrono::milliseconds kMinResolveSpacing{100};

  std::shared_ptr<SentinelResolver> resolver_;
  Callback on_switch_;
  std::chrono::milliseconds ping_interval_;
  HoldCallback on_hold_;
  std::atomic<std::uint64_t> holds_{0};
  std::atomic<std::uint64_t> early_switches_{0};
  std::atomic<std::uint64_t> aborted_holds_{0};
  int wake_fd_ = -1;  // an eventfd: stop() makes it readable to end a wait at once
  std::atomic<bool> stopping_{false};
  std::atomic<bool> resolve_requested_{false};
  TimePoint last_resolve_{};  // the watcher's thread only
  std::atomic<std::uint64_t> subscriptions_{0};
  mutable std::mutex mu_;  // guards thread_ and live_
  std::thread thread_;
  std::vector<Address> live_;
};

}  // namespace redcount::redis
