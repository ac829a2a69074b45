#include "redcount/redis/topology/sentinel.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "redcount/common/errors.h"
#include "redcount/common/threads.h"
#include "redcount/redis/io/resolver.h"
#include "redcount/common/util.h"

namespace redcount::redis {
namespace {

int poll_timeout_ms(TimePoint deadline) {
  if (deadline == kNever) return -1;
  const auto left = deadline - SteadyClock::now();
  if (left <= SteadyClock::duration::zero()) return 0;
  // Rounded up: waking a little late is fine, spinning on a 0 ms timeout is not.
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left + std::chrono::microseconds(999));
  return static_cast<int>(std::min<std::int64_t>(ms.count(), 1'000'000'000));
}

enum class Waited { Ready, Timeout, Woken };

// Polls `fd` for `events` (and `wake_fd` for input, when >= 0) until `deadline`.
Waited wait_fd(int fd, short events, TimePoint deadline, int wake_fd = -1) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    const int n = ::poll(p, wake_fd >= 0 ? 2 : 1, poll_timeout_ms(deadline));
    if (n > 0) {
      if (wake_fd >= 0 && (p[1].revents & POLLIN)) return Waited::Woken;
      return Waited::Ready;
    }
    if (n == 0) return Waited::Timeout;
    if (errno != EINTR) throw ConnectionError(std::string("poll failed: ") + std::strerror(errno));
  }
}

TimePoint deadline_after(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 ? SteadyClock::now() + timeout : kNever;
}

struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

// A connected TCP socket to `address`, or the error saying why not.
int connect_tcp(const Address& address, const std::string& where, TimePoint deadline) {
  AddrList addrs;
  if (!resolve_numeric(address.host, address.port, addrs)) addrs = resolve(address.host, address.port);
  if (!addrs.list) throw ConnectionError("cannot resolve host '" + address.host + "' (" + addrs.error + ")");
  int last_err = 0;
  for (const addrinfo* a = addrs.list.get(); a != nullptr; a = a->ai_next) {
    FdGuard s{::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
    if (s.fd < 0) {
      last_err = errno;
      continue;
    }
    if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last_err = errno;
        continue;
      }
      if (wait_fd(s.fd, POLLOUT, deadline) == Waited::Timeout) {
        throw TimeoutError("timed out connecting to " + where);
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        last_err = err;
        continue;
      }
    }
    int one = 1;
    ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s.release();
  }
  if (last_err == ECONNREFUSED) throw ConnectionError("connection refused by " + where);
  throw ConnectionError("cannot connect to " + where + ": " + std::strerror(last_err));
}


std::optional<int> parse_port(std::string_view s) {
  auto p = parse_int64(s);
  if (!p || *p < 1 || *p > 65535) return std::nullopt;
  return static_cast<int>(*p);
}

// A message payload split at its spaces.
std::vector<std::string_view> words(std::string_view payload) {
  std::vector<std::string_view> parts;
  while (!payload.empty()) {
    auto sp = payload.find(' ');
    if (sp != 0) parts.push_back(payload.substr(0, sp));
    if (sp == std::string_view::npos) break;
    payload = payload.substr(sp + 1);
  }
  return parts;
}

constexpr std::string_view kSwitchMaster = "+switch-master";
constexpr std::string_view kSelectedReplica = "+selected-slave";

bool is_abort_channel(std::string_view channel) { return channel.starts_with("-failover-abort-"); }

}  // namespace

SentinelOptions sentinel_options(const StoreOptions& o, std::shared_ptr<TlsContext> tls) {
  SentinelOptions s;
  s.sentinels = o.sentinels;
  s.service = o.sentinel_service;
  s.link.username = o.sentinel_username;
  s.link.password = o.sentinel_password;
  s.link.tls = std::move(tls);
  s.link.ssl_server_name = o.ssl_server_name;
  s.node_link.username = o.username;
  s.node_link.password = o.password;
  s.node_link.tls = s.link.tls;
  s.node_link.ssl_server_name = o.ssl_server_name;
  return s;
}

// --- ControlLink ---------------------------------------------------------------------------

ControlLink::ControlLink(const Address& address, const LinkOptions& options)
    : address_(address), options_(options), where_(address.text()) {
  const TimePoint deadline = deadline_after(options_.connect_timeout);
  const int fd = connect_tcp(address_, where_, deadline);
  if (options_.tls) {
    const std::string name = options_.ssl_server_name.empty() ? address_.host : options_.ssl_server_name;
    transport_ = make_tls_transport(fd, options_.tls, name);
    while (!transport_->handshake()) {
      const short ev = transport_->want() == Transport::Want::Read ? POLLIN : POLLOUT;
      if (wait_fd(transport_->fd(), ev, deadline) == Waited::Timeout) {
        throw TimeoutError("timed out in the TLS handshake with " + where_);
      }
    }
  } else {
    transport_ = make_plain_transport(fd);
  }
  if (!options_.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!options_.username.empty()) auth.push_back(options_.username);
    auth.push_back(options_.password);
    const Reply r = call(auth);
    if (r.is_error()) throw AuthenticationError(r.str + " (AUTH refused by " + where_ + ")");
  }
}

ControlLink::~ControlLink() = default;

int ControlLink::fd() const noexcept { return transport_->fd(); }

TimePoint ControlLink::command_deadline() const { return deadline_after(options_.command_timeout); }

void ControlLink::write_all(const std::string& bytes, TimePoint deadline) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t n = transport_->write(bytes.data() + done, bytes.size() - done);
    done += n;
    if (n == 0) {
      const short ev = transport_->want() == Transport::Want::Read ? POLLIN : POLLOUT;
      if (wait_fd(transport_->fd(), ev, deadline) == Waited::Timeout) {
        throw TimeoutError("timed out writing to " + where_, done > 0);
      }
    }
  }
}

void ControlLink::send(const std::vector<std::string>& args) {
  std::string out;
  resp::format_args(out, args);
  try {
    write_all(out, command_deadline());
  } catch (const TimeoutError&) {
    throw;
  } catch (const ConnectionError& e) {
    throw ConnectionError(std::string(e.what()) + " (" + where_ + ")");
  }
}

std::optional<Reply> ControlLink::next(TimePoint deadline, int wake_fd) {
  char buf[16384];
  for (;;) {
    if (auto r = parser_.next()) return r;
    std::size_t n = 0;
    try {
      n = transport_->read(buf, sizeof buf);
    } catch (const ConnectionError& e) {
      throw ConnectionError(std::string(e.what()) + " (" + where_ + ")", true);
    }
    if (n > 0) {
      parser_.feed(buf, n);
      continue;
    }
    const short ev = transport_->want() == Transport::Want::Read ? POLLIN : POLLOUT;
    switch (wait_fd(transport_->fd(), ev, deadline, wake_fd)) {
      case Waited::Ready:
        break;
      case Waited::Timeout:
      case Waited::Woken:
        return std::nullopt;
    }
  }
}

Reply ControlLink::call(const std::vector<std::string>& args) {
  send(args);
  auto r = next(command_deadline());
  if (!r) {
    throw TimeoutError("no reply from " + where_ + " to " + printable(args.empty() ? "" : args[0]) + " within " +
                           std::to_string(options_.command_timeout.count()) + " ms",
                       true);
  }
  return std::move(*r);
}

// --- roles ---------------------------------------------------------------------------------

std::string sentinel_url(const StoreOptions& o) {
  std::string hosts;
  for (const auto& s : o.sentinels) {
    if (!hosts.empty()) hosts += ',';
    hosts += s.text();
  }
  return std::string(o.tls ? "rediss+sentinel://" : "redis+sentinel://") +
         (o.username.empty() ? std::string() : o.username + "@") + hosts + "/" + o.sentinel_service + "/" +
         std::to_string(o.db);
}

Role probe_role(const Address& address, const LinkOptions& options) {
  ControlLink link(address, options);
  const Reply r = link.call({"ROLE"});
  if (r.is_error()) throw_reply_error(r.str + " (ROLE at " + address.text() + ")");
  return parse_role(r);
}

// --- SentinelResolver ----------------------------------------------------------------------

SentinelResolver::SentinelResolver(SentinelOptions options) : options_(std::move(options)) {
  if (options_.sentinels.empty()) throw InvalidArgument("a Sentinel service needs at least one sentinel address");
  if (options_.service.empty()) throw InvalidArgument("a Sentinel service needs the master's service name");
  for (const auto& s : options_.sentinels) {
    if (s.host.empty()) throw InvalidArgument("a sentinel address has an empty host");
    if (s.port < 1 || s.port > 65535) {
      throw InvalidArgument("sentinel " + s.text() + ": port must be 1-65535");
    }
  }
  order_ = options_.sentinels;
}

std::vector<Address> SentinelResolver::sentinels() const {
  std::lock_guard lock(mu_);
  return order_;
}

void SentinelResolver::promote(const Address& sentinel) {
  std::lock_guard lock(mu_);
  auto it = std::find(order_.begin(), order_.end(), sentinel);
  if (it != order_.end()) std::rotate(order_.begin(), it, it + 1);
}

std::optional<Address> SentinelResolver::parse_master_reply(const Reply& reply) {
  if (reply.is_nil()) return std::nullopt;
  if (reply.type == Reply::Type::Array && reply.elements.empty()) return std::nullopt;  // RESP3-ish empty
  if (reply.type != Reply::Type::Array || reply.elements.size() != 2 ||
      reply.elements[0].type != Reply::Type::String || reply.elements[1].type != Reply::Type::String) {
    throw ProtocolError("unexpected reply to SENTINEL get-master-addr-by-name (expected [host, port])");
  }
  auto port = parse_port(reply.elements[1].str);
  if (!port || reply.elements[0].str.empty()) {
    throw ProtocolError("SENTINEL get-master-addr-by-name gave an invalid address");
  }
  return Address{reply.elements[0].str, *port};
}

Address SentinelResolver::resolve() {
  const std::vector<Address> order = sentinels();
  std::string failures;
  bool all_auth = true;
  for (const auto& s : order) {
    std::string why;
    try {
      ControlLink link(s, options_.link);
      const Reply r = link.call({"SENTINEL", "get-master-addr-by-name", options_.service});
      if (r.is_error()) {
        why = s.text() + ": " + printable(r.str);
        all_auth = false;
      } else if (auto master = parse_master_reply(r)) {
        promote(s);
        return *master;
      } else {
        why = s.text() + ": knows no master named '" + printable(options_.service) + "'";
        all_auth = false;
      }
    } catch (const AuthenticationError& e) {
      why = e.what();
    } catch (const Error& e) {  // ConnectionError, TimeoutError, ProtocolError
      why = e.what();
      all_auth = false;
    }
    if (!failures.empty()) failures += "; ";
    // Every failure names its sentinel (a TLS error, for one, names only the host).
    if (why.find(s.text()) == std::string::npos) failures += s.text() + ": ";
    failures += why;
  }
  const std::string message = "no sentinel gave the master of service '" + printable(options_.service) +
                              "': " + failures;
  if (all_auth) throw AuthenticationError(message);
  throw ConnectionError(message);
}

// --- SwitchMasterWatcher -------------------------------------------------------------------

SwitchMasterWatcher::SwitchMasterWatcher(std::shared_ptr<SentinelResolver> resolver, Callback on_switch,
                                         std::chrono::milliseconds ping_interval, HoldCallback on_hold)
    : resolver_(std::move(resolver)),
      on_switch_(std::move(on_switch)),
      ping_interval_(ping_interval),
      on_hold_(std::move(on_hold)) {
  if (!resolver_) throw InvalidArgument("SwitchMasterWatcher needs a SentinelResolver");
  if (!on_switch_) throw InvalidArgument("SwitchMasterWatcher needs a callback");
  if (ping_interval_.count() <= 0) throw InvalidArgument("ping_interval must be > 0 ms");
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

SwitchMasterWatcher::~SwitchMasterWatcher() {
  stop();
  ::close(wake_fd_);
}

void SwitchMasterWatcher::start(std::optional<Address> known) {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  drain_wake();
  stopping_ = false;
  thread_ = start_thread([this, known = std::move(known)] { run(known); });
}

void SwitchMasterWatcher::stop() {
  std::thread t;
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    t = std::move(thread_);
  }
  stopping_ = true;
  wake();
  t.join();
}

void SwitchMasterWatcher::request_resolve() noexcept {
  resolve_requested_ = true;
  wake();
}

void SwitchMasterWatcher::wake() noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto ignored = ::write(wake_fd_, &one, sizeof one);
}

void SwitchMasterWatcher::drain_wake() noexcept {
  std::uint64_t count = 0;
  [[maybe_unused]] auto ignored = ::read(wake_fd_, &count, sizeof count);
}

std::optional<Address> SwitchMasterWatcher::subscribed_to() const {
  std::lock_guard lock(mu_);
  if (live_.empty()) return std::nullopt;
  return live_.front();
}

std::vector<Address> SwitchMasterWatcher::subscribed() const {
  std::lock_guard lock(mu_);
  return live_;
}

std::optional<Address> SwitchMasterWatcher::parse_switch(std::string_view payload, std::string_view service) {
  const auto parts = words(payload);
  if (parts.size() != 5 || parts[0] != service) return std::nullopt;
  auto port = parse_port(parts[4]);
  if (!port) return std::nullopt;
  return Address{std::string(parts[3]), *port};
}

const std::vector<std::string>& SwitchMasterWatcher::channels() {
  // Every way a failover Sentinel has begun can end without a promotion.
  static const std::vector<std::string> kChannels = {
      std::string(kSwitchMaster), std::string(kSelectedReplica), "-failover-abort-not-elected",
      "-failover-abort-no-good-slave", "-failover-abort-slave-timeout"};
  return kChannels;
}

std::optional<SwitchMasterWatcher::Selection> SwitchMasterWatcher::parse_selected(std::string_view payload,
                                                                                   std::string_view service) {
  const auto w = words(payload);
  if (w.size() != 8 || w[0] != "slave" || w[4] != "@" || w[5] != service) return std::nullopt;
  const auto port = parse_port(w[3]);
  const auto master_port = parse_port(w[7]);
  if (!port || !master_port) return std::nullopt;
  return Selection{Address{std::string(w[2]), *port}, Address{std::string(w[6]), *master_port}};
}

bool SwitchMasterWatcher::is_abort_of(std::string_view payload, std::string_view service) {
  const auto w = words(payload);
  return w.size() == 4 && w[0] == "master" && w[1] == service;
}

void SwitchMasterWatcher::report(const Address& a, std::optional<Address>& last) {
  if (last && *last == a) return;
  last = a;
  try {
    on_switch_(a);
  } catch (...) {
    // The callback's contract is not to throw; the watcher keeps following regardless.
  }
}

namespace {

// What one sentinel says the master is, with the config epoch of that configuration when
// the sentinel gives it (nullopt for an ACL that allows only get-master-addr-by-name).
struct MasterConfig {
  Address address;
  std::optional<std::uint64_t> epoch;
};

// `SENTINEL MASTER <service>` answers a flat list of field, value (RESP2).
std::optional<MasterConfig> parse_sentinel_master(const Reply& r) {
  if (r.type != Reply::Type::Array) return std::nullopt;
  std::string ip;
  std::optional<int> port;
  std::optional<std::uint64_t> epoch;
  for (std::size_t i = 0; i + 1 < r.elements.size(); i += 2) {
    const std::string& field = r.elements[i].str;
    const std::string& value = r.elements[i + 1].str;
    if (field == "ip") {
      ip = value;
    } else if (field == "port") {
      port = parse_port(value);
    } else if (field == "config-epoch") {
      try {
        epoch = std::stoull(value);
      } catch (const std::exception&) {
        epoch.reset();
      }
    }
  }
  if (ip.empty() || !port) return std::nullopt;
  return MasterConfig{Address{ip, *port}, epoch};
}

// Asks `sentinel`, on a connection of its own (a subscribed connection takes no other
// command), where the master of `service` is: nullopt when it does not monitor the
// service. Throws as ControlLink does.
std::optional<MasterConfig> ask_master(const Address& sentinel, const LinkOptions& options,
                                       const std::string& service) {
  ControlLink ask(sentinel, options);
  const Reply r = ask.call({"SENTINEL", "MASTER", service});
  if (!r.is_error()) {
    if (auto c = parse_sentinel_master(r)) return c;
  }
  // Refused (an ACL granting only get-master-addr-by-name; or "No such master"), or a
  // shape not understood: the address without its epoch.
  auto a = SentinelResolver::parse_master_reply(ask.call({"SENTINEL", "get-master-addr-by-name", service}).check());
  if (!a) return std::nullopt;
  return MasterConfig{*a, std::nullopt};
}

}  // namespace

struct SwitchMasterWatcher::Link {
  Address sentinel;
  std::unique_ptr<ControlLink> conn;  // null while down
  TimePoint next_ping = kNever;
  TimePoint pong_deadline = kNever;
  TimePoint retry_at{};  // while down: the next attempt (the epoch: at once)
  std::chrono::milliseconds backoff{100};
};

struct SwitchMasterWatcher::Followed {
  std::optional<Address> last;
  std::optional<std::uint64_t> epoch;
  // A failover under way (the hold): the replica being promoted, the master it replaces, when
  // the hold ends at the latest, the next ROLE probe and its connection.
  struct Hold {
    Selection selected;
    TimePoint until;
    TimePoint next_probe;
    std::unique_ptr<ControlLink> probe;
  };
  std::optional<Hold> hold;
  // After following a promoted replica before any sentinel announced it: the master it
  // replaced, ignored in answers until a sentinel confirms the new one or `early_until`.
  std::optional<Address> early_from;
  TimePoint early_until{};
};

void SwitchMasterWatcher::begin_hold(const Selection& selected, Followed& f) {
  // Only a failover of the master followed: a late message of an earlier one names another.
  if (f.last && *f.last != selected.master) return;
  if (f.hold && f.hold->selected.replica == selected.replica) return;  // another sentinel's copy
  const TimePoint now = SteadyClock::now();
  const bool was_holding = f.hold.has_value();
  f.hold = Followed::Hold{selected, now + kMaxHold, now, nullptr};
  ++holds_;
  if (was_holding || !on_hold_) return;
  try {
    on_hold_(true);
  } catch (...) {
    // The callback's contract is not to throw.
  }
}

void SwitchMasterWatcher::end_hold(Followed& f) {
  if (!f.hold) return;
  f.hold.reset();
  if (!on_hold_) return;
  try {
    on_hold_(false);
  } catch (...) {
  }
}

void SwitchMasterWatcher::probe_hold(Followed& f) {
  auto& h = *f.hold;
  const TimePoint now = SteadyClock::now();
  if (now < h.next_probe) return;
  bool promoted = false;
  try {
    if (!h.probe) {
      LinkOptions o = resolver_->options().node_link;
      // Never past the hold: a replica that does not answer leaves the old master in place.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(h.until - now);
      const auto bound = std::max(left, std::chrono::milliseconds(1));
      const auto cap = [&](std::chrono::milliseconds t) { return t.count() > 0 ? std::min(t, bound) : bound; };
      o.connect_timeout = cap(o.connect_timeout);
      o.command_timeout = cap(o.command_timeout);
      h.probe = std::make_unique<ControlLink>(h.selected.replica, o);
    }
    const Reply r = h.probe->call({"ROLE"});
    promoted = parse_role(r) == Role::Master;
  } catch (const std::exception&) {
    // Refused, or killed by the promotion itself (`CLIENT KILL TYPE normal` runs with
    // `REPLICAOF NO ONE`): a new connection at the next probe.
    h.probe.reset();
  }
  h.next_probe = SteadyClock::now() + kProbeInterval;
  if (!promoted) return;
  // The replica is the master now; every sentinel still names the old one until the failover
  // ends. Its configuration epoch is above the old master's.
  const Address from = h.selected.master;
  const Address to = h.selected.replica;
  f.early_from = from;
  f.early_until = SteadyClock::now() + kEarlyTrust;
  if (f.epoch) f.epoch = *f.epoch + 1;
  ++early_switches_;
  report(to, f.last);
  end_hold(f);
}

// Which announcement wins. Every sentinel announces each switch, at different moments, and
// the first announcement is taken: waiting for a second opinion would give back the time
// that listening to every sentinel gains. The de-duplication in report() makes the later
// announcements of the same master no-ops. What must not happen is a lagging sentinel
// moving the client back to an older master: one that missed a failover and answers with
// the old master when the watcher (re)subscribes, or whose announcement of an earlier
// switch arrives after a later one (two failovers in a row). The order of arrival across
// sentinels says nothing about the order of configurations; Sentinel's config epoch does:
// each failover takes a new, higher epoch, and a sentinel's configuration carries the epoch
// it came from. So an answer or announcement naming another master is checked against the
// epoch of the followed master: an older epoch is ignored. A `+switch-master` message does
// not carry its epoch, so the announcing sentinel is asked (`SENTINEL MASTER`, a fresh
// connection: about a millisecond on a LAN, paid once per switch, since the announcements
// of the same master by the others are no-ops). When no epoch is known (the sentinel's ACL
// refuses SENTINEL MASTER, or it cannot be asked) the answer is taken: a stale master is
// then refused by the ROLE check of every new connection, which asks for a re-resolve.
// Equal epochs are taken: a service re-added with `SENTINEL MONITOR` starts again at 0.
void SwitchMasterWatcher::consider(const Address& a, std::optional<std::uint64_t> epoch, Followed& f) {
  if (f.last && *f.last == a) {
    if (epoch && (!f.epoch || *epoch > *f.epoch)) f.epoch = epoch;
    f.early_from.reset();  // a sentinel names the master followed: the failover has ended
    return;
  }
  if (epoch && f.epoch && *epoch < *f.epoch) return;  // a lagging sentinel's older master
  if (f.early_from && *f.early_from == a && SteadyClock::now() < f.early_until) return;  // not finished yet
  f.epoch = epoch;
  report(a, f.last);
  end_hold(f);
}

void SwitchMasterWatcher::publish_links(const std::vector<Link>& links) {
  std::vector<Address> live;
  for (const Link& l : links) {
    if (l.conn) live.push_back(l.sentinel);
  }
  std::optional<Address> front;
  {
    std::lock_guard lock(mu_);
    if (live == live_) return;
    const bool front_changed = live.empty() || live_.empty() || live.front() != live_.front();
    live_ = live;
    if (front_changed && !live.empty()) front = live.front();
  }
  if (front) resolver_->promote(*front);
}

void SwitchMasterWatcher::open(Link& link, Followed& f) {
  const LinkOptions& link_options = resolver_->options().link;
  const std::string& service = resolver_->options().service;
  auto conn = std::make_unique<ControlLink>(link.sentinel, link_options);
  std::vector<std::string> subscribe = {"SUBSCRIBE"};
  for (const auto& c : channels()) subscribe.push_back(c);
  conn->send(subscribe);
  // One confirmation per channel. Not woken by request_resolve(): the wait is short, and the
  // loop answers requests.
  const TimePoint deadline = deadline_after(link_options.command_timeout);
  for (std::size_t i = 0; i < channels().size(); ++i) {
    auto confirm = conn->next(deadline);
    if (!confirm) throw TimeoutError("no SUBSCRIBE confirmation from " + link.sentinel.text());
    if (confirm->is_error()) throw_reply_error(confirm->str);
  }
  // Subscribed first, asked second: a switch before the question shows in its answer, one
  // after it arrives as a message.
  const auto now_master = ask_master(link.sentinel, link_options, service);
  if (!now_master) {
    throw ReplyError("sentinel " + link.sentinel.text() + " knows no master named '" + printable(service) + "'");
  }
  link.conn = std::move(conn);
  link.next_ping = SteadyClock::now() + ping_interval_;
  link.pong_deadline = kNever;
  link.backoff = std::chrono::milliseconds(100);
  ++subscriptions_;
  consider(now_master->address, now_master->epoch, f);
}

void SwitchMasterWatcher::drain(Link& link, Followed& f) {
  const std::string& service = resolver_->options().service;
  // A deadline already passed: what the socket (or TLS) holds now, without waiting.
  while (auto message = link.conn->next(TimePoint{})) {
    if (message->type != Reply::Type::Array || message->elements.empty()) continue;
    const auto& e = message->elements;
    if (e[0].str == "pong") {
      link.pong_deadline = kNever;
    } else if (e[0].str == "message" && e.size() >= 3 && e[1].str == kSelectedReplica) {
      if (auto selected = parse_selected(e[2].str, service)) begin_hold(*selected, f);
    } else if (e[0].str == "message" && e.size() >= 3 && is_abort_channel(e[1].str)) {
      if (is_abort_of(e[2].str, service) && f.hold) {
        ++aborted_holds_;
        end_hold(f);
      }
    } else if (e[0].str == "message" && e.size() >= 3 && e[1].str == kSwitchMaster) {
      const auto announced = parse_switch(e[2].str, service);
      if (!announced || (f.last && *f.last == *announced)) continue;  // another sentinel was first
      std::optional<MasterConfig> asked;
      try {
        asked = ask_master(link.sentinel, resolver_->options().link, service);
      } catch (const std::exception&) {
        // Announced, then unreachable: the announcement is taken without its epoch.
      }
      if (asked) {
        consider(asked->address, asked->epoch, f);
      } else {
        consider(*announced, std::nullopt, f);
      }
    }
  }
}

void SwitchMasterWatcher::run(std::optional<Address> known) {
  Followed f;
  f.last = std::move(known);
  std::vector<Link> links;
  for (const Address& s : resolver_->sentinels()) {
    Link l;
    l.sentinel = s;
    links.push_back(std::move(l));
  }
  const auto timeout = resolver_->options().link.command_timeout;
  const auto pong_wait = timeout.count() > 0 ? timeout : 3 * ping_interval_;
  TimePoint resolve_at = kNever;
  std::vector<pollfd> fds;

  const auto close_link = [&](Link& l, TimePoint now, bool any_live) {
    l.conn.reset();
    l.next_ping = l.pong_deadline = kNever;
    l.retry_at = now + jittered(l.backoff);
    // Retried sooner while it is the only way to hear of a switch; while others serve, a
    // dead sentinel costs one connect attempt (up to connect_timeout, during which the
    // live links wait) every few seconds at most.
    l.backoff = std::min(l.backoff * 2, std::chrono::milliseconds(any_live ? 5000 : 2000));
  };
  const auto live_count = [&] {
    return static_cast<std::size_t>(std::count_if(links.begin(), links.end(), [](const Link& l) { return l.conn != nullptr; }));
  };

  while (!stopping_) {
    TimePoint now = SteadyClock::now();
    // Subscribe where a link is down and due, preferring the sentinels first in the order.
    for (Link& l : links) {
      if (stopping_) break;
      if (l.conn || now < l.retry_at || live_count() >= kMaxLinks) continue;
      try {
        open(l, f);
      } catch (const std::exception&) {
        close_link(l, SteadyClock::now(), live_count() > 0);
      }
      publish_links(links);
      // Announcements that came while connecting (a blackholed sentinel costs up to
      // connect_timeout) are read before the next attempt.
      for (Link& other : links) {
        if (!other.conn || &other == &l) continue;
        try {
          drain(other, f);
        } catch (const std::exception&) {
          close_link(other, SteadyClock::now(), true);
          publish_links(links);
        }
      }
      now = SteadyClock::now();
    }
    if (stopping_) break;

    if (resolve_requested_.exchange(false) && resolve_at == kNever) {
      resolve_at = std::max(now, last_resolve_ + kMinResolveSpacing);
    }
    if (now >= resolve_at) {
      resolve_at = kNever;
      last_resolve_ = now;
      try {
        const Address a = resolver_->resolve();
        // Taken whatever its epoch (the header says why); its epoch is not known. Not the
        // master a promoted replica replaced, while the sentinels have not finished.
        const bool stale = f.early_from && *f.early_from == a && SteadyClock::now() < f.early_until;
        // The same master as followed leaves a hold on: the sentinels name the old master
        // until the failover ends.
        if (!stale && (!f.last || *f.last != a)) {
          f.epoch.reset();
          report(a, f.last);
          end_hold(f);
        }
      } catch (const std::exception&) {
        // No sentinel answered now: the next request, or +switch-master, will.
      }
      continue;
    }

    // A failover under way: probe the replica being promoted; past kMaxHold, let go.
    if (f.hold) {
      if (SteadyClock::now() >= f.hold->until) {
        end_hold(f);
      } else {
        probe_hold(f);
      }
      now = SteadyClock::now();
    }

    // PINGs due, and PINGs left unanswered.
    TimePoint wake_at = resolve_at;
    if (f.hold) wake_at = std::min(wake_at, std::min(f.hold->next_probe, f.hold->until));
    for (Link& l : links) {
      if (!l.conn) {
        if (live_count() < kMaxLinks) wake_at = std::min(wake_at, l.retry_at);
        continue;
      }
      try {
        if (l.pong_deadline != kNever && now >= l.pong_deadline) {
          throw TimeoutError("sentinel " + l.sentinel.text() + " left a PING unanswered");
        }
        if (l.pong_deadline == kNever && now >= l.next_ping) {
          l.conn->send({"PING"});
          l.pong_deadline = now + pong_wait;
          l.next_ping = now + ping_interval_;
        }
        wake_at = std::min(wake_at, l.pong_deadline != kNever ? l.pong_deadline : l.next_ping);
      } catch (const std::exception&) {
        close_link(l, now, live_count() > 1);
        publish_links(links);
      }
    }

    // Wait for any link, the wake fd (stop(), request_resolve()) or the next timer.
    fds.clear();
    for (const Link& l : links) {
      if (l.conn) fds.push_back({l.conn->fd(), POLLIN, 0});
    }
    fds.push_back({wake_fd_, POLLIN, 0});
    // An error (EINTR; nothing else is expected of these fds) is a wake-up like any other.
    ::poll(fds.data(), fds.size(), poll_timeout_ms(wake_at));
    if (stopping_) break;
    drain_wake();
    // Every live link is read, readable or not: a TLS link may hold decrypted bytes that
    // poll() cannot see.
    for (Link& l : links) {
      if (!l.conn) continue;
      try {
        drain(l, f);
      } catch (const std::exception&) {
        close_link(l, SteadyClock::now(), live_count() > 1);
        publish_links(links);
      }
    }
  }
  links.clear();
  publish_links(links);
}

}  // namespace redcount::redis
