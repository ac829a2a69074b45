// Sharded idempotent counters and quotas: redcount._core.ShardedCounter, Reading, Quota and
// QuotaResult.
#include <pybind11/stl.h>

#include <optional>

#include "aio.h"
#include "common.h"
#include "redcount/sharded/buffered.h"
#include "redcount/common/errors.h"
#include "redcount/common/window.h"
#include "redcount/sharded/quota.h"
#include "redcount/sharded/sharded_counter.h"

namespace redcount::bind {
namespace {

std::string optional_id(py::handle request_id) {
  return request_id_arg(request_id, "request_id must not be empty (pass None for no request id)");
}

std::int64_t negated(py::handle amount) { return negated_int_arg(amount, "amount"); }

std::shared_ptr<ShardedCounter> make_sharded(std::shared_ptr<Store> store, py::handle name, std::int64_t shards,
                                             py::handle idempotency_ttl, const std::string& route, py::handle prefix,
                                             std::int64_t log_maxlen, const std::string& on_error,
                                             std::int64_t queue_capacity, py::handle retry_backoff,
                                             py::handle retry_backoff_max) {
  ShardedOptions o;
  o.name = text_arg(name, "name");
  o.prefix = text_arg(prefix, "prefix");
  o.shards = shards;
  o.idempotency_ttl_ms = seconds_arg(idempotency_ttl, "idempotency_ttl", false);
  if (route == "request-id") {
    o.route = ShardedOptions::Route::RequestId;
  } else if (route == "random") {
    o.route = ShardedOptions::Route::Random;
  } else {
    throw InvalidArgument("route must be 'request-id' or 'random', got '" + route + "'");
  }
  o.log_maxlen = log_maxlen;
  if (on_error == "raise") {
    o.on_error = ShardedOptions::OnError::Raise;
  } else if (on_error == "queue") {
    o.on_error = ShardedOptions::OnError::Queue;
  } else {
    throw InvalidArgument("on_error must be 'raise' or 'queue', got '" + on_error + "'");
  }
  o.queue_capacity = queue_capacity;  // checked by the core, with the backoffs
  o.retry_backoff_min = std::chrono::milliseconds(seconds_arg(retry_backoff, "retry_backoff", false));
  o.retry_backoff_max = std::chrono::milliseconds(seconds_arg(retry_backoff_max, "retry_backoff_max", false));
  return std::make_shared<ShardedCounter>(std::move(store), std::move(o));
}

std::int64_t staleness_arg(py::handle s) { return seconds_arg(s, "max_staleness", true); }

std::unique_ptr<Quota> make_quota(std::shared_ptr<Store> store, py::handle name, py::handle floor, py::handle ceiling,
                                  py::handle soft, py::handle idempotency_ttl, std::int64_t durable,
                                  py::handle durable_timeout, py::handle prefix, std::shared_ptr<Calendar> calendar,
                                  const std::string& reset, py::handle reset_to, py::handle grace) {
  QuotaOptions o;
  if (calendar) {
    o.period = require_calendar_unit(reset, 1, *calendar);
    o.calendar = std::move(calendar);
    o.reset_to = int_arg(reset_to, "reset_to");
    o.grace_ms = seconds_arg(grace, "grace", true);
  }
  o.name = text_arg(name, "name");
  o.prefix = text_arg(prefix, "prefix");
  o.floor = int_arg(floor, "floor");
  if (!ceiling.is_none()) o.ceiling = int_arg(ceiling, "ceiling");
  if (!soft.is_none()) o.soft = int_arg(soft, "soft");
  o.idempotency_ttl_ms = seconds_arg(idempotency_ttl, "idempotency_ttl", false);
  o.durable = durable;
  o.durable_timeout = std::chrono::milliseconds(seconds_arg(durable_timeout, "durable_timeout", false));
  return std::make_unique<Quota>(std::move(store), std::move(o));
}

py::object quota_result(QuotaResult& r) { return py::cast(r); }

}  // namespace

void register_sharded(py::module_& m) {
  py::class_<Reading>(m, "Reading", "A counter value and how old it may be (read()).")
      .def_readonly("value", &Reading::value)
      .def_readonly("staleness_ms", &Reading::staleness_ms,
                    "The value reflects the store at some moment within the last staleness_ms milliseconds.")
      .def("__iter__", [](const Reading& r) { return py::iter(py::make_tuple(r.value, r.staleness_ms)); })
      .def("__eq__", [](const Reading& a, const Reading& b) {
        return a.value == b.value && a.staleness_ms == b.staleness_ms;
      })
      .def("__repr__", [](const Reading& r) {
        return "Reading(value=" + std::to_string(r.value) + ", staleness_ms=" + std::to_string(r.staleness_ms) + ")";
      });

  py::class_<ShardGeneration>(m, "ShardGeneration", "One generation of a sharded counter's shards (see reshard).")
      .def_readonly("first", &ShardGeneration::first, "Its first shard index.")
      .def_readonly("count", &ShardGeneration::count, "How many shards it has.")
      .def_readonly("retired_ms", &ShardGeneration::retired_ms,
                    "When a reshard replaced it (ms since the epoch, store clock); 0 for the current one.")
      .def_property_readonly("shards", [](const ShardGeneration& g) {
        std::vector<std::int64_t> out;
        for (std::int64_t i = 0; i < g.count; ++i) out.push_back(g.first + i);
        return out;
      }, "Its shard indices.")
      .def("__repr__", [](const ShardGeneration& g) {
        return "ShardGeneration(first=" + std::to_string(g.first) + ", count=" + std::to_string(g.count) +
               ", retired_ms=" + std::to_string(g.retired_ms) + ")";
      });

  py::class_<ShardLayout>(m, "ShardLayout", "A sharded counter's shard generations, oldest first.")
      .def_readonly("version", &ShardLayout::version, "1 = as created; +1 per reshard.")
      .def_readonly("generations", &ShardLayout::generations)
      .def_property_readonly("current", [](const ShardLayout& l) { return l.current(); },
                             "The generation that takes the writes.")
      .def_property_readonly("total", &ShardLayout::total,
                             "Shard indices over all generations (0 .. total-1), which every read sums.")
      .def("__repr__", [](const ShardLayout& l) {
        std::string out = "ShardLayout(version=" + std::to_string(l.version) + ", generations=[";
        for (std::size_t i = 0; i < l.generations.size(); ++i) {
          const ShardGeneration& g = l.generations[i];
          out += (i ? ", " : "") + std::to_string(g.first) + ".." + std::to_string(g.first + g.count - 1);
        }
        return out + "])";
      });

  py::class_<ShardedCounter, std::shared_ptr<ShardedCounter>>(m, "ShardedCounter", "The C++ sharded counter; use redcount.ShardedCounter.")
      .def(py::init(&make_sharded), py::arg("store"), py::arg("name"), py::arg("shards"), py::arg("idempotency_ttl"),
           py::arg("route"), py::arg("prefix"), py::arg("log_maxlen"), py::arg("on_error"), py::arg("queue_capacity"),
           py::arg("retry_backoff"), py::arg("retry_backoff_max"))
      .def(
          "incr",
          [](ShardedCounter& c, py::handle amount, py::handle request_id) {
            const std::int64_t a = int_arg(amount, "amount");
            const std::string rid = optional_id(request_id);
            NetworkWait wait;
            return c.incr(a, rid);
          },
          py::arg("amount") = 1, py::kw_only(), py::arg("request_id") = py::none(),
          "Add `amount` (non-zero; negative subtracts). True when applied, False when `request_id` was "
          "already applied within idempotency_ttl.")
      .def(
          "decr",
          [](ShardedCounter& c, py::handle amount, py::handle request_id) {
            const std::int64_t a = negated(amount);
            const std::string rid = optional_id(request_id);
            NetworkWait wait;
            return c.incr(a, rid);
          },
          py::arg("amount") = 1, py::kw_only(), py::arg("request_id") = py::none(), "incr(-amount).")
      .def(
          "adjust",
          [](ShardedCounter& c, py::handle amount, const std::string& reason, py::handle request_id) {
            const std::int64_t a = int_arg(amount, "delta");
            const std::string rid = optional_id(request_id);
            NetworkWait wait;
            return c.adjust(a, reason, rid);
          },
          py::arg("delta"), py::arg("reason"), py::kw_only(), py::arg("request_id") = py::none(),
          "An audited correction: incr(delta) whose log entry carries `reason`.")
      .def(
          "incr_many",
          [](ShardedCounter& c, const py::iterable& items) {
            auto in = increments_arg(items);
            NetworkWait wait;
            return c.incr_many(in);
          },
          py::arg("items"),
          "[(name, amount[, request_id]), ...] over counters of this prefix and layout, in one round trip; "
          "a list of applied flags in input order.")
      .def(
          "value",
          [](ShardedCounter& c) {
            NetworkWait wait;
            return c.value();
          },
          "All shards summed, in one round trip.")
      .def(
          "shard_values",
          [](ShardedCounter& c) {
            NetworkWait wait;
            return c.shard_values();
          },
          "Each shard's value, in shard order.")
      .def(
          "values",
          [](ShardedCounter& c, const py::list& names) {
            auto ns = text_list_arg(names, "name");
            std::vector<std::int64_t> v;
            {
              NetworkWait wait;
              v = c.values(ns);
            }
            return keyed_values(v, names);
          },
          py::arg("names"), "{name: value} of counters with this prefix and shard count, in one round trip.")
      .def(
          "read",
          [](ShardedCounter& c, py::handle max_staleness) {
            const std::int64_t ms = staleness_arg(max_staleness);
            NetworkWait wait;
            return c.read(ms);
          },
          py::arg("max_staleness") = 0.25,
          "The value from this object's cache when at most max_staleness seconds old, else fresh.")
      .def(
          "shard_of", [](const ShardedCounter& c, py::handle rid) { return c.shard_of(text_arg(rid, "request_id")); },
          py::arg("request_id"), "The shard a write with this request id goes to.")
      .def(
          "key_of",
          [](const ShardedCounter& c, std::int64_t shard, py::handle suffix) {
            return c.key_of(shard, text_arg(suffix, "suffix"));
          },
          py::arg("shard"), py::arg("suffix") = "",
          "A shard's value key (its hash tag); suffix 'log' or 'rid:<id>' for its other keys.")
      .def(
          "flush",
          [](ShardedCounter& c, py::object timeout) {
            auto t = timeout_arg(timeout);
            NetworkWait wait;  // waits for the retry thread
            return c.flush(t);
          },
          py::arg("timeout") = py::none())
      .def(
          "close",
          [](ShardedCounter& c, py::object timeout) {
            auto t = timeout_arg(timeout);
            NetworkWait wait;  // waits for the retry thread
            return c.close(t);
          },
          py::arg("timeout") = 5.0)
      .def_property_readonly("pending", &ShardedCounter::pending)
      .def("stats", &ShardedCounter::stats)
      .def_property_readonly("name", [](const ShardedCounter& c) { return c.options().name; })
      .def_property_readonly("prefix", [](const ShardedCounter& c) { return c.options().prefix; })
      .def_property_readonly("shards", [](const ShardedCounter& c) { return c.cached_layout().current().count; })
      .def_property_readonly("idempotency_ttl", [](const ShardedCounter& c) {
        return static_cast<double>(c.options().idempotency_ttl_ms) / 1000.0;
      })
      .def_property_readonly("route", [](const ShardedCounter& c) {
        return c.options().route == ShardedOptions::Route::RequestId ? "request-id" : "random";
      })
      .def_property_readonly("log_maxlen", [](const ShardedCounter& c) { return c.options().log_maxlen; })
      .def_property_readonly("on_error", [](const ShardedCounter& c) {
        return c.options().on_error == ShardedOptions::OnError::Raise ? "raise" : "queue";
      })
      .def_property_readonly("store", [](const ShardedCounter& c) { return c.store(); })
      // The same calls as operations for redcount.aio (see register_counters.cpp).
      .def(
          "incr_async",
          [](ShardedCounter& c, py::handle amount, py::handle request_id) {
            return aio::submit_async(c.store(), c.make_incr(int_arg(amount, "amount"), optional_id(request_id)),
                                     [](bool& b) { return py::bool_(b); });
          },
          py::arg("amount") = 1, py::kw_only(), py::arg("request_id") = py::none())
      .def(
          "adjust_async",
          [](ShardedCounter& c, py::handle amount, const std::string& reason, py::handle request_id) {
            return aio::submit_async(c.store(), c.make_adjust(int_arg(amount, "delta"), reason, optional_id(request_id)),
                                     [](bool& b) { return py::bool_(b); });
          },
          py::arg("delta"), py::arg("reason"), py::kw_only(), py::arg("request_id") = py::none())
      .def(
          "decr_async",
          [](ShardedCounter& c, py::handle amount, py::handle request_id) {
            return aio::submit_async(c.store(), c.make_incr(negated(amount), optional_id(request_id)),
                                     [](bool& b) { return py::bool_(b); });
          },
          py::arg("amount") = 1, py::kw_only(), py::arg("request_id") = py::none())
      .def(
          "incr_many_async",
          [](ShardedCounter& c, const py::iterable& items) {
            return aio::submit_async(c.store(), c.make_incr_many(increments_arg(items)),
                                     [](std::vector<bool>& v) { return py::cast(v); });
          },
          py::arg("items"))
      .def("value_async",
           [](ShardedCounter& c) {
             return aio::submit_async(c.store(), c.make_value(), [](std::int64_t& n) { return py::int_(n); });
           })
      .def("shard_values_async",
           [](ShardedCounter& c) {
             return aio::submit_async(c.store(), c.make_shard_values(),
                                      [](std::vector<std::int64_t>& v) { return py::cast(v); });
           })
      .def(
          "values_async",
          [](ShardedCounter& c, const py::list& names) {
            py::list originals;
            for (py::handle n : names) originals.append(n);
            return aio::submit_async(c.store(), c.make_values(text_list_arg(names, "name")), &keyed_values, std::move(originals));
          },
          py::arg("names"))
      .def(
          "read_async",
          [](ShardedCounter& c, py::handle max_staleness) {
            return aio::submit_async(c.store(), c.make_read(staleness_arg(max_staleness)),
                                     [](Reading& r) { return py::cast(r); });
          },
          py::arg("max_staleness") = 0.25)
      .def(
          "reshard",
          [](ShardedCounter& c, py::handle new_shards) {
            const std::int64_t n = int_arg(new_shards, "new_shards");
            NetworkWait wait;
            return c.reshard(n);
          },
          py::arg("new_shards"), "Move the writes to a new generation of new_shards shards; the new layout.")
      .def(
          "layout",
          [](ShardedCounter& c) {
            NetworkWait wait;
            return c.layout();
          },
          "The shard layout as the store holds it now.")
      .def_property_readonly("cached_layout", &ShardedCounter::cached_layout,
                             "The layout this object last saw (no I/O).")
      .def_property_readonly("layout_key", &ShardedCounter::layout_key,
                             "The layout key {<prefix>:<name>}:layout (absent until a reshard).")
      .def(
          "reshard_async",
          [](ShardedCounter& c, py::handle new_shards) {
            return aio::submit_async(c.store(), c.make_reshard(int_arg(new_shards, "new_shards")),
                                     [](ShardLayout& l) { return py::cast(l); });
          },
          py::arg("new_shards"))
      .def("layout_async", [](ShardedCounter& c) {
        return aio::submit_async(c.store(), c.make_layout(), [](ShardLayout& l) { return py::cast(l); });
      });

  py::class_<BufferedStats>(m, "BufferedStats", "Counts of a BufferedCounter's flushes since it was made.")
      .def_readonly("flushes", &BufferedStats::flushes, "Batches the store acknowledged.")
      .def_readonly("flushed_units", &BufferedStats::flushed_units, "Their net amount.")
      .def_readonly("retries", &BufferedStats::retries, "Failed flush attempts that were retried.")
      .def_readonly("failed_units", &BufferedStats::failed_units,
                    "Net amount given up: a non-transient error, an id that would expire, or close().")
      .def_readonly("pending", &BufferedStats::pending, "Net amount not yet acknowledged by the store.")
      .def_readonly("last_error", &BufferedStats::last_error)
      .def("__repr__", [](const BufferedStats& s) {
        return "BufferedStats(flushes=" + std::to_string(s.flushes) + ", flushed_units=" +
               std::to_string(s.flushed_units) + ", retries=" + std::to_string(s.retries) +
               ", failed_units=" + std::to_string(s.failed_units) + ", pending=" + std::to_string(s.pending) + ")";
      });

  py::class_<BufferedCounter>(m, "BufferedCounter", "The C++ buffered writer; use redcount.BufferedCounter.")
      .def(py::init([](std::shared_ptr<ShardedCounter> counter, py::handle flush_every, std::int64_t max_pending) {
             BufferedOptions o;
             o.flush_every = std::chrono::milliseconds(seconds_arg(flush_every, "flush_every", false));
             o.max_pending = max_pending;
             return std::make_unique<BufferedCounter>(std::move(counter), o);
           }),
           py::arg("counter"), py::arg("flush_every"), py::arg("max_pending"))
      // The hot path: an atomic add, so the GIL is kept (releasing it would cost more).
      .def("incr", [](BufferedCounter& b, std::int64_t amount) { b.incr(amount); }, py::arg("amount") = 1,
           "Add `amount` (non-zero, |amount| <= 2**40) to the pending sum; no I/O.")
      .def(
          "flush",
          [](BufferedCounter& b, py::object timeout) {
            auto t = timeout_arg(timeout);
            NetworkWait wait;  // waits for the flusher's round trip
            return b.flush(t);
          },
          py::arg("timeout") = py::none(), "Write what is pending now; returns the units still pending.")
      .def(
          "close",
          [](BufferedCounter& b, py::object timeout) {
            auto t = timeout_arg(timeout);
            NetworkWait wait;  // waits for the flusher
            return b.close(t);
          },
          py::arg("timeout") = 5.0, "Flush, then stop; returns the units given up (also in stats().failed_units).")
      .def_property_readonly("pending", &BufferedCounter::pending, "Net units not yet acknowledged by the store.")
      .def("stats", &BufferedCounter::stats)
      .def_property_readonly("flush_every", [](const BufferedCounter& b) {
        return static_cast<double>(b.options().flush_every.count()) / 1000.0;
      })
      .def_property_readonly("max_pending", [](const BufferedCounter& b) { return b.options().max_pending; });

  py::class_<QuotaResult>(m, "QuotaResult",
                          "What a quota call did; true when it was applied (bool(result) == result.applied).")
      .def_readonly("applied", &QuotaResult::applied)
      .def_readonly("value", &QuotaResult::value, "The value after the call (the current value when refused).")
      .def_readonly("duplicate", &QuotaResult::duplicate, "A repeat of a request id already applied.")
      .def_readonly("soft_exceeded", &QuotaResult::soft_exceeded, "The value is below the soft threshold.")
      .def_readonly("replicas", &QuotaResult::replicas, "Replicas that acknowledged the write; -1 when not asked.")
      .def_readonly("durable_ok", &QuotaResult::durable_ok,
                    "False when fewer than `durable` replicas acknowledged a write within durable_timeout "
                    "(the write is applied on the master all the same).")
      .def("__bool__", [](const QuotaResult& r) { return r.applied; })
      .def("__repr__", [](const QuotaResult& r) {
        return std::string("QuotaResult(applied=") + (r.applied ? "True" : "False") +
               ", value=" + std::to_string(r.value) + ", duplicate=" + (r.duplicate ? "True" : "False") +
               ", soft_exceeded=" + (r.soft_exceeded ? "True" : "False") + ", replicas=" + std::to_string(r.replicas) +
               ", durable_ok=" + (r.durable_ok ? "True" : "False") + ")";
      });

  py::class_<Quota>(m, "Quota", "The C++ quota; use redcount.Quota.")
      .def(py::init(&make_quota), py::arg("store"), py::arg("name"), py::arg("floor"), py::arg("ceiling"),
           py::arg("soft"), py::arg("idempotency_ttl"), py::arg("durable"), py::arg("durable_timeout"),
           py::arg("prefix"), py::arg("calendar") = nullptr, py::arg("reset") = "", py::arg("reset_to") = 0,
           py::arg("grace") = 1.0)
      .def(
          "take",
          [](Quota& q, py::handle n, py::handle request_id) {
            const std::int64_t v = int_arg(n, "n");
            const std::string rid = optional_id(request_id);
            NetworkWait wait;
            return q.take(v, rid);
          },
          py::arg("n") = 1, py::kw_only(), py::arg("request_id") = py::none(),
          "Take n (>= 1) unless the value would go below the floor (then nothing changes).")
      .def(
          "give",
          [](Quota& q, py::handle n, py::handle request_id) {
            const std::int64_t v = int_arg(n, "n");
            const std::string rid = optional_id(request_id);
            NetworkWait wait;
            return q.give(v, rid);
          },
          py::arg("n") = 1, py::kw_only(), py::arg("request_id") = py::none(),
          "Give n (>= 1) back unless the value would go above the ceiling.")
      .def(
          "set",
          [](Quota& q, py::handle value) {
            const std::int64_t v = int_arg(value, "value");
            NetworkWait wait;
            return q.set(v);
          },
          py::arg("value"), "Set the value (floor <= value <= ceiling).")
      .def(
          "value",
          [](Quota& q) {
            NetworkWait wait;
            return q.value();
          },
          "The current value.")
      .def("storage_key", &Quota::storage_key, "The key of the current period (the one key, without a reset).")
      .def(
          "current_period",
          [](const Quota& q) -> std::optional<std::pair<double, double>> {
            if (!q.options().calendar) return std::nullopt;
            const Period p = q.period();
            return std::make_pair(static_cast<double>(p.start_ms) / 1000.0, static_cast<double>(p.end_ms) / 1000.0);
          },
          "(start, end) of the current period in seconds since the epoch; None without a reset.")
      .def_property_readonly("reset_to", [](const Quota& q) { return q.options().reset_to; })
      .def_property_readonly("name", [](const Quota& q) { return q.options().name; })
      .def_property_readonly("prefix", [](const Quota& q) { return q.options().prefix; })
      .def_property_readonly("floor", [](const Quota& q) { return q.options().floor; })
      .def_property_readonly("ceiling", [](const Quota& q) { return q.options().ceiling; })
      .def_property_readonly("soft", [](const Quota& q) { return q.options().soft; })
      .def_property_readonly("durable", [](const Quota& q) { return q.options().durable; })
      .def_property_readonly("store", [](const Quota& q) { return q.store(); })
      .def(
          "take_async",
          [](Quota& q, py::handle n, py::handle request_id) {
            return aio::submit_async(q.store(), q.make_take(int_arg(n, "n"), optional_id(request_id)), &quota_result);
          },
          py::arg("n") = 1, py::kw_only(), py::arg("request_id") = py::none())
      .def(
          "give_async",
          [](Quota& q, py::handle n, py::handle request_id) {
            return aio::submit_async(q.store(), q.make_give(int_arg(n, "n"), optional_id(request_id)), &quota_result);
          },
          py::arg("n") = 1, py::kw_only(), py::arg("request_id") = py::none())
      .def(
          "set_async",
          [](Quota& q, py::handle value) {
            return aio::submit_async(q.store(), q.make_set(int_arg(value, "value")), &quota_result);
          },
          py::arg("value"))
      .def("value_async", [](Quota& q) {
        return aio::submit_async(q.store(), q.make_value(), [](std::int64_t& n) { return py::int_(n); });
      });
}

}  // namespace redcount::bind
