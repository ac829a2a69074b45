// Stores and clocks: redcount._core.Store, ManualClock and open_store().
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "common.h"
#include "redcount/limiters/leased.h"
#include "redcount/common/errors.h"
#include "redcount/memory/memory_store.h"
#include "redcount/common/options.h"
#include "redcount/redis/topology/cluster.h"
#include "redcount/redis/redis_store.h"
#include "redcount/store/resilient_store.h"
#include "redcount/store/store.h"

namespace redcount::bind {

namespace {

// Logs the breaker switches recorded so far (each once: whoever takes them logs them), so a
// state read from Python is never ahead of the log.
void drain_breaker_log() { py::module_::import("redcount.store").attr("_log_breaker_events")(); }

// TLS keyword arguments override the URL's query; each is checked as the query would be
// (a TLS option on a non-TLS URL is an InvalidArgument naming it).
struct TlsKeywords {
  std::optional<std::string> ca_certs, certfile, keyfile, cert_reqs, server_name;
  std::optional<bool> check_hostname;
};

void apply_tls_keywords(StoreOptions& o, const TlsKeywords& k) {
  auto set = [&](const char* name, const std::optional<std::string>& v) {
    if (v) set_tls_option(o, name, *v);
  };
  set("ssl_ca_certs", k.ca_certs);
  set("ssl_certfile", k.certfile);
  set("ssl_keyfile", k.keyfile);
  set("ssl_cert_reqs", k.cert_reqs);
  set("ssl_server_name", k.server_name);
  if (k.check_hostname) set_tls_option(o, "ssl_check_hostname", *k.check_hostname ? "true" : "false");
  if (o.tls && o.ssl_cert_reqs == StoreOptions::CertReqs::None) {
    // Once per connect(), pointing at the caller's line (stacklevel 2: above connect()).
    py::object category = py::module_::import("redcount.errors").attr("SecurityWarning");
    if (PyErr_WarnEx(category.ptr(),
                     "ssl_cert_reqs='none': the TLS connection is encrypted but the server's certificate is not "
                     "verified, so anyone on the network path can impersonate it; pass ssl_ca_certs instead",
                     2) != 0) {
      throw py::error_already_set();  // warnings turned into errors (-W error)
    }
  }
}

std::shared_ptr<Store> open_store_shim(const std::string& url, py::object connect_timeout,
                                       py::object command_timeout, int max_connections, bool keepalive,
                                       py::object pool_timeout, std::shared_ptr<ManualClock> clock,
                                       py::object sweep_interval, int connections, const TlsKeywords& tls,
                                       py::object budget, bool breaker, std::optional<std::string> fallback,
                                       const std::optional<std::vector<std::string>>& ring_urls,
                                       const std::optional<std::vector<std::string>>& ring_names,
                                       const std::optional<std::string>& sentinel_username,
                                       const std::optional<std::string>& sentinel_password,
                                       const std::optional<double>& spin) {
  StoreOptions o;
  std::vector<StoreOptions> members;
  if (ring_urls) {
    // A client-side ring: every member gets the keyword options; its URL holds the rest.
    if (ring_urls->empty()) throw InvalidArgument("a ring needs at least one server URL");
    for (std::size_t i = 0; i < ring_urls->size(); ++i) {
      StoreOptions m = parse_url((*ring_urls)[i]);
      if (m.kind != StoreOptions::Kind::Tcp || m.cluster) {
        throw InvalidArgument("ring server #" + std::to_string(i + 1) +
                              " must be a redis://, rediss:// or redis+sentinel:// URL (not memory://, unix:// or a "
                              "cluster URL)");
      }
      apply_tls_keywords(m, tls);
      // The Sentinel keywords apply to every member that is a Sentinel group.
      if (m.sentinel && sentinel_username) set_sentinel_option(m, "sentinel_username", *sentinel_username);
      if (m.sentinel && sentinel_password) set_sentinel_option(m, "sentinel_password", *sentinel_password);
      if (m.sentinel && !m.sentinel_username.empty() && m.sentinel_password.empty()) {
        throw InvalidArgument("ring server #" + std::to_string(i + 1) + ": sentinel_username needs sentinel_password");
      }
      members.push_back(std::move(m));
    }
    const bool any_sentinel =
        std::any_of(members.begin(), members.end(), [](const StoreOptions& m) { return m.sentinel; });
    if ((sentinel_username || sentinel_password) && !any_sentinel) {
      throw InvalidArgument(std::string(sentinel_username ? "sentinel_username" : "sentinel_password") +
                            " applies to Redis Sentinel only: no ring server is a redis+sentinel:// or "
                            "rediss+sentinel:// URL");
    }
    if (ring_names && ring_names->size() != ring_urls->size()) {
      throw InvalidArgument("names must give one name per server: got " + std::to_string(ring_names->size()) +
                            " names for " + std::to_string(ring_urls->size()) + " URLs");
    }
    o = members.front();
  } else {
    o = parse_url(url);
    apply_tls_keywords(o, tls);
    // Keywords override the URL's query, checked as the query is (a Sentinel option with a
    // URL that is not redis+sentinel:// is an InvalidArgument naming it).
    if (sentinel_username) set_sentinel_option(o, "sentinel_username", *sentinel_username);
    if (sentinel_password) set_sentinel_option(o, "sentinel_password", *sentinel_password);
    if (o.sentinel && !o.sentinel_username.empty() && o.sentinel_password.empty()) {
      throw InvalidArgument("sentinel_username needs sentinel_password");
    }
  }
  o.connect_timeout = std::chrono::milliseconds(seconds_arg(connect_timeout, "connect_timeout", true));
  o.command_timeout = std::chrono::milliseconds(seconds_arg(command_timeout, "command_timeout", true));
  o.pool_timeout = std::chrono::milliseconds(seconds_arg(pool_timeout, "pool_timeout", true));
  o.sweep_interval = std::chrono::milliseconds(seconds_arg(sweep_interval, "sweep_interval", true));
  if (max_connections < 1) {
    throw InvalidArgument("max_connections must be >= 1, got " + std::to_string(max_connections));
  }
  o.max_connections = max_connections;
  o.connections = connections;  // validated by the Redis store (1..4); unused by memory://
  o.keepalive = keepalive;
  if (spin) {
    if (!std::isfinite(*spin) || *spin < 0 || *spin > 0.001) {
      throw InvalidArgument("spin must be None (automatic) or a number of seconds from 0 to 0.001, got " +
                            py::repr(py::float_(*spin)).cast<std::string>());
    }
    o.spin = std::chrono::microseconds(std::llround(*spin * 1e6));
  }
  if (clock) o.clock = clock;  // on Redis: the client's idea of now (the server keeps its own)
  for (auto& m : members) {
    m.connect_timeout = o.connect_timeout;
    m.command_timeout = o.command_timeout;
    m.pool_timeout = o.pool_timeout;
    m.max_connections = o.max_connections;
    m.connections = o.connections;
    m.keepalive = o.keepalive;
    m.spin = o.spin;
    m.clock = o.clock;
  }
  if (!members.empty()) {
    o.ring = std::move(members);
    if (ring_names) o.ring_names = *ring_names;
  }
  ResilienceOptions r;
  r.breaker = breaker;
  if (!budget.is_none()) r.budget = std::chrono::milliseconds(seconds_arg(budget, "budget", false));
  if (fallback && fallback->empty()) throw InvalidArgument("fallback must be \"memory://\" or None, got ''");
  return open_resilient_store(o, r, fallback.value_or(std::string()));
}

}  // namespace

void register_store(py::module_& m) {
  py::class_<ManualClock, std::shared_ptr<ManualClock>>(
      m, "ManualClock",
      "A clock that only moves when told to, for the memory store: windows turn over and keys "
      "expire exactly when you advance it. Thread-safe.")
      .def(py::init([](double start) { return std::make_shared<ManualClock>(epoch_ms_arg(start, "start")); }),
           py::arg("start") = 1'700'000'000.0, "Start at `start` seconds since the Unix epoch.")
      .def("now", [](const ManualClock& c) { return static_cast<double>(c.now_ms()) / 1000.0; },
           "Current time in seconds since the epoch.")
      .def("set", [](ManualClock& c, double t) { c.set(epoch_ms_arg(t, "t")); }, py::arg("t"),
           "Jump to `t` seconds since the epoch.")
      .def("advance",
           [](ManualClock& c, double seconds) {
             const std::int64_t step = epoch_ms_arg(seconds, "seconds");
             if (step < 0) throw InvalidArgument("a ManualClock only moves forward; got " + std::to_string(seconds));
             std::int64_t then = 0;
             if (__builtin_add_overflow(c.now_ms(), step, &then) || then > 9'000'000'000'000'000'000) {
               throw InvalidArgument("advance(" + std::to_string(seconds) + ") would move the clock past its range");
             }
             c.advance(step);
           },
           py::arg("seconds"), "Move forward by `seconds` (millisecond precision).");

  py::class_<Store, std::shared_ptr<Store>>(m, "Store", "A connection to Redis or the embedded memory store.")
      .def(
          "execute",
          [](Store& s, py::args args) {
            Command cmd = command_from(args, "execute() needs a command name");
            Reply r;
            {
              NetworkWait wait;
              r = s.execute_one(std::move(cmd));
            }
            return to_python(r);
          },
          "Run one command (e.g. execute('PTTL', key)). Bulk strings come back as bytes, "
          "status replies as str; error replies raise ReplyError.")
      .def(
          "execute_many",
          [](Store& s, const std::vector<py::tuple>& commands) {
            const std::vector<Request> batch = commands_from(commands);
            std::vector<Reply> replies;
            {
              NetworkWait wait;
              replies = s.execute(batch);
            }
            return replies_to_python(replies);
          },
          py::arg("commands"),
          "Run several commands in one round trip (a pipeline). Error replies are returned as str.")
      .def(
          "ping",
          [](Store& s) {
            Reply r;
            {
              NetworkWait wait;
              r = s.execute_one(Command{{"PING"}});
            }
            r.check();
            return true;
          },
          "Round-trip a PING; raises ConnectionError/AuthenticationError if the store is unusable.")
      .def("__enter__", [](std::shared_ptr<Store> s) { return s; })
      .def("__exit__", [](Store& s, py::args) {
        NetworkWait wait;  // closing joins the store's threads
        LeaseTable::give_back_all_of(&s);  // leased limits' unused units first
        s.close();
      })
      .def("now", [](const Store& s) { return static_cast<double>(s.now_ms()) / 1000.0; },
           "This store's clock in seconds since the epoch (the ManualClock for memory:// if given).")
      .def_property_readonly("url", &Store::describe, "The store's URL, without the password.")
      .def(
          "nodes",
          [](std::shared_ptr<Store> s) {
            std::vector<std::shared_ptr<Store>> nodes;
            {
              py::gil_scoped_release release;  // a cluster may ask a node for its slot table
              nodes = s->nodes();
            }
            if (nodes.empty()) nodes.push_back(std::move(s));
            return nodes;
          },
          "One store per master of a Redis Cluster, or per member of a client-side ring in the order "
          "given (execute, execute_many, ping, address), for what is about one node: KEYS, SCAN, DBSIZE, "
          "INFO, FLUSHALL. A single server is its own only node.")
      .def_property_readonly(
          "address",
          [](const Store& s) {
            if (const auto* r = dynamic_cast<const RedisStore*>(&s)) return r->address();
            return s.describe();
          },
          "host:port of a Redis server (the socket path for unix://); the URL for any other store.")
      .def(
          "cluster_stats",
          [](Store& s) {
            Store* inner = &s;
            if (auto* r = dynamic_cast<ResilientStore*>(inner)) inner = r->primary().get();
            redis::ClusterStats st;
            if (auto* r = dynamic_cast<RedisStore*>(inner)) st = r->cluster_stats();
            py::dict out;
            out["moved"] = st.moved;
            out["ask"] = st.ask;
            out["tryagain"] = st.tryagain;
            out["clusterdown"] = st.clusterdown;
            out["refreshes"] = st.refreshes;
            return out;
          },
          "Redis Cluster replies met since the store opened, counted per request: MOVED, ASK, "
          "TRYAGAIN, CLUSTERDOWN, and CLUSTER SLOTS refreshes started. All 0 on any other store.")
      .def_property_readonly("is_memory", &Store::is_memory, "True for the embedded memory:// store.")
      .def(
          "sweep",
          [](Store& s) -> std::size_t {
            auto* mem = dynamic_cast<MemoryStore*>(&s);
            if (!mem) throw InvalidArgument("sweep() applies to memory:// only; Redis expires keys itself");
            NetworkWait wait;  // a sweep of a large keyspace takes a while
            return mem->sweep();
          },
          "memory:// only: free expired keys now (a background sweep also does). Returns how many.")
      .def(
          "stored_keys",
          [](Store& s) -> std::size_t {
            auto* mem = dynamic_cast<MemoryStore*>(&s);
            if (!mem) throw InvalidArgument("stored_keys() applies to memory:// only; use DBSIZE on Redis");
            return mem->stored_keys();
          },
          "memory:// only: keys held in memory, including expired ones not yet swept.")
      .def(
          "close",
          [](Store& s) {
            NetworkWait wait;  // closing joins the store's threads
            LeaseTable::give_back_all_of(&s);  // leased limits' unused units first
            s.close();
          },
          "Close every connection (or stop the memory store's sweeper). Later calls raise ConnectionError.");

  m.def(
      "open_store",
      [](const std::string& url, py::object connect_timeout, py::object command_timeout, int max_connections,
         bool keepalive, py::object pool_timeout, std::shared_ptr<ManualClock> clock, py::object sweep_interval,
         int connections, std::optional<std::string> ssl_ca_certs, std::optional<std::string> ssl_certfile,
         std::optional<std::string> ssl_keyfile, std::optional<std::string> ssl_cert_reqs,
         std::optional<bool> ssl_check_hostname, std::optional<std::string> ssl_server_name, py::object budget,
         bool breaker, std::optional<std::string> fallback, std::optional<std::vector<std::string>> ring_urls,
         std::optional<std::vector<std::string>> ring_names, std::optional<std::string> sentinel_username,
         std::optional<std::string> sentinel_password, std::optional<double> spin) {
        const TlsKeywords tls{std::move(ssl_ca_certs), std::move(ssl_certfile), std::move(ssl_keyfile),
                              std::move(ssl_cert_reqs), std::move(ssl_server_name), ssl_check_hostname};
        return open_store_shim(url, std::move(connect_timeout), std::move(command_timeout), max_connections,
                               keepalive, std::move(pool_timeout), std::move(clock), std::move(sweep_interval), connections,
                               tls, std::move(budget), breaker, std::move(fallback), ring_urls, ring_names,
                               sentinel_username, sentinel_password, spin);
      },
      py::arg("url"), py::arg("connect_timeout"), py::arg("command_timeout"), py::arg("max_connections"),
      py::arg("keepalive"), py::arg("pool_timeout"), py::arg("clock"), py::arg("sweep_interval"),
      py::arg("connections") = 1, py::arg("ssl_ca_certs") = py::none(), py::arg("ssl_certfile") = py::none(), py::arg("ssl_keyfile") = py::none(),
      py::arg("ssl_cert_reqs") = py::none(), py::arg("ssl_check_hostname") = py::none(),
      py::arg("ssl_server_name") = py::none(), py::arg("budget") = py::none(), py::arg("breaker") = true,
      py::arg("fallback") = py::none(), py::arg("ring_urls") = py::none(), py::arg("ring_names") = py::none(),
      py::arg("sentinel_username") = py::none(), py::arg("sentinel_password") = py::none(),
      py::arg("spin") = py::none(),
      "Open a store (with ring_urls: a client-side hash ring over those servers, url unused); use "
      "redcount.connect() instead.");

  py::class_<ResilientStore, Store, std::shared_ptr<ResilientStore>>(
      m, "ResilientStore",
      "A Redis store with a latency budget, a circuit breaker and an optional fallback store "
      "(redcount.connect(url, budget=..., fallback=...)). Thread-safe.")
      .def_property_readonly(
          "breaker_state",
          [](const ResilientStore& s) {
            drain_breaker_log();
            switch (s.state()) {
              case ResilientStore::State::Closed: return "closed";
              case ResilientStore::State::Open: return "open";
              case ResilientStore::State::HalfOpen: return "half-open";
            }
            return "closed";
          },
          "'closed' (calls go to Redis), 'open' (they fail fast or go to the fallback) or 'half-open' "
          "(a probe is on its way). Always 'closed' when the breaker is off.")
      .def_property_readonly(
          "using_fallback",
          [](const ResilientStore& s) {
            drain_breaker_log();
            return s.using_fallback();
          },
          "True while calls go to the fallback store.")
      .def_property_readonly(
          "breaker_open",
          [](const ResilientStore& s) {
            drain_breaker_log();
            return s.state() != ResilientStore::State::Closed;
          },
          "True while the breaker is open or half-open (redcount.web.metrics reads it).")
      .def_property_readonly(
          "fallback_active",
          [](const ResilientStore& s) {
            drain_breaker_log();
            return s.using_fallback();
          },
          "The same as using_fallback (redcount.web.metrics reads it).")
      .def_property_readonly(
          "breaker_switches",
          [](const ResilientStore& s) {
            drain_breaker_log();
            return s.switches();
          },
          "How many times the breaker opened or closed since the store was opened.")
      .def_property_readonly(
          "node_breakers",
          [](const ResilientStore& s) {
            drain_breaker_log();
            py::dict out;
            for (const auto& n : s.node_breakers()) {
              out[py::str(n.where)] = n.state == BreakerState::Open       ? "open"
                                      : n.state == BreakerState::HalfOpen ? "half-open"
                                                                          : "closed";
            }
            return out;
          },
          "On a Redis Cluster or a ring (one breaker per node): {node: 'closed' | 'open' | 'half-open'} "
          "for every node seen so far; breaker_state then sums them up ('open' while any is). Empty "
          "on a single server.")
      .def_property_readonly("budget",
                             [](const ResilientStore& s) -> std::optional<double> {
                               if (s.options().budget.count() == 0) return std::nullopt;
                               return static_cast<double>(s.options().budget.count()) / 1000.0;
                             },
                             "The latency budget in seconds, or None.")
      .def_property_readonly("breaker", [](const ResilientStore& s) { return s.options().breaker; },
                             "Whether the circuit breaker is on.")
      .def_property_readonly("fallback",
                             [](const ResilientStore& s) -> std::optional<std::string> {
                               if (!s.fallback()) return std::nullopt;
                               return s.fallback()->describe();
                             },
                             "The fallback store's URL, or None.");

  m.def(
      "_take_breaker_events",
      [] {
        // Never waits: a thread blocked here with the GIL released would have to take it
        // back in a destructor, which aborts the process if that happens during interpreter
        // shutdown. The watcher thread polls instead (redcount/store.py).
        py::list out;
        for (const auto& e : take_breaker_events()) {
          const int level = e.level == BreakerEvent::Level::Debug ? 10 : e.level == BreakerEvent::Level::Info ? 20 : 30;
          out.append(py::make_tuple(level, e.message));
        }
        return out;
      },
      "Circuit-breaker switches recorded since the last call, as (logging level, message). Used by "
      "redcount.store to log them.");
}

}  // namespace redcount::bind
