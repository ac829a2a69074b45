// Counters: redcount._core.FixedWindowCounter, RetryStats and Calendar (the time-zone
// periods that calendar windows use; redcount.calendar builds them from zoneinfo).
#include <pybind11/stl.h>

#include <optional>

#include "aio.h"
#include "common.h"
#include "redcount/common/calendar.h"
#include "redcount/common/errors.h"
#include "redcount/common/window.h"
#include "redcount/counters/fixed_window.h"
#include "redcount/counters/sliding_window.h"
#include "redcount/store/time_source.h"

namespace redcount::bind {
namespace {

constexpr const char* kEmptyRequestId = "request_id must not be empty";

std::unique_ptr<FixedWindowCounter> make_counter(std::shared_ptr<Store> store, py::handle name, py::handle window,
                                                 py::handle prefix, py::handle grace, bool stagger,
                                                 const std::string& mode, const std::string& on_error,
                                                 std::int64_t queue_capacity, py::handle retry_backoff,
                                                 py::handle retry_backoff_max, std::shared_ptr<Calendar> calendar,
                                                 const std::string& calendar_unit) {
  FixedWindowOptions o;
  o.name = text_arg(name, "name");
  o.prefix = text_arg(prefix, "prefix");
  o.window_ms = seconds_arg(window, "window", false);
  o.grace_ms = seconds_arg(grace, "grace", true);
  o.stagger = stagger;
  if (mode == "script") {
    o.mode = FixedWindowOptions::Mode::Script;
  } else if (mode == "commands") {
    o.mode = FixedWindowOptions::Mode::Commands;
  } else {
    throw InvalidArgument("mode must be 'script' or 'commands', got '" + mode + "'");
  }
  if (on_error == "raise") {
    o.on_error = FixedWindowOptions::OnError::Raise;
  } else if (on_error == "queue") {
    o.on_error = FixedWindowOptions::OnError::Queue;
  } else {
    throw InvalidArgument("on_error must be 'raise' or 'queue', got '" + on_error + "'");
  }
  o.queue_capacity = queue_capacity;  // checked by the core, with the backoffs
  o.retry_backoff_min = std::chrono::milliseconds(seconds_arg(retry_backoff, "retry_backoff", false));
  o.retry_backoff_max = std::chrono::milliseconds(seconds_arg(retry_backoff_max, "retry_backoff_max", false));
  if (calendar) {
    o.calendar_unit = require_calendar_unit(calendar_unit, 1, *calendar);
    o.calendar = std::move(calendar);
  }
  return std::make_unique<FixedWindowCounter>(std::move(store), std::move(o));
}

}  // namespace

void register_counters(py::module_& m) {
  py::class_<RetryStats>(m, "RetryStats", "Counts of the retry queue's traffic since the counter was made.")
      .def_readonly("queued", &RetryStats::queued, "Increments put in the queue.")
      .def_readonly("retried", &RetryStats::retried, "Retry attempts of queued increments.")
      .def_readonly("delivered", &RetryStats::delivered, "Queued increments that finally landed.")
      .def_readonly("dropped", &RetryStats::dropped, "Dropped because their window (plus grace) had ended.")
      .def_readonly("overflowed", &RetryStats::overflowed, "Refused because the queue was full.")
      .def_readonly("failed", &RetryStats::failed,
                    "Dropped on a non-transient error, or still queued when the counter was closed.")
      .def_readonly("pending", &RetryStats::pending, "In the queue now.")
      .def_readonly("last_error", &RetryStats::last_error, "The most recent transient error, or ''.")
      .def("__repr__", [](const RetryStats& s) {
        return "RetryStats(queued=" + std::to_string(s.queued) + ", retried=" + std::to_string(s.retried) +
               ", delivered=" + std::to_string(s.delivered) + ", dropped=" + std::to_string(s.dropped) +
               ", overflowed=" + std::to_string(s.overflowed) + ", failed=" + std::to_string(s.failed) +
               ", pending=" + std::to_string(s.pending) + ")";
      });

  py::class_<Calendar, std::shared_ptr<Calendar>>(
      m, "Calendar", "A time zone's calendar periods (C++); use redcount.calendar.calendar().")
      .def(py::init([](const std::string& zone, std::vector<std::int64_t> at_ms, std::vector<std::int64_t> offsets_ms,
                       int anchor_day) {
             return std::make_shared<Calendar>(zone, std::move(at_ms), std::move(offsets_ms), anchor_day);
           }),
           py::arg("zone"), py::arg("at_ms"), py::arg("offsets_ms"), py::arg("anchor_day") = 1,
           "`at_ms`: ascending instants (epoch ms) at which the UTC offset changes; `offsets_ms`: one more "
           "offset than instants, [0] before the first change, [i + 1] from at_ms[i].")
      .def_property_readonly("zone", &Calendar::zone)
      .def_property_readonly("anchor_day", &Calendar::anchor_day)
      .def(
          "period",
          [](const Calendar& c, const std::string& unit, std::int64_t now_ms, std::int64_t multiple) {
            const Period p = c.period(require_calendar_unit(unit, multiple, c), now_ms, multiple);
            return std::make_pair(p.start_ms, p.end_ms);
          },
          py::arg("unit"), py::arg("now_ms"), py::arg("multiple") = 1,
          "(start_ms, end_ms) of the day, week, month or year (of `multiple` of them, counted from a fixed "
          "epoch) that contains `now_ms` (epoch ms).")
      .def("offset_at", &Calendar::offset_at, py::arg("utc_ms"), "The UTC offset (ms) in force at an instant.");

  py::class_<FixedWindowCounter>(m, "FixedWindowCounter", "The C++ fixed-window counter; use redcount.FixedWindowCounter.")
      .def(py::init(&make_counter), py::arg("store"), py::arg("name"), py::arg("window"), py::arg("prefix"),
           py::arg("grace"), py::arg("stagger"), py::arg("mode"), py::arg("on_error"), py::arg("queue_capacity"),
           py::arg("retry_backoff"), py::arg("retry_backoff_max"), py::arg("calendar") = nullptr,
           py::arg("calendar_unit") = "")
      .def(
          "incr",
          [](FixedWindowCounter& c, py::handle key, py::handle amount, py::handle request_id) {
            const std::string k = text_arg(key, "key");
            const std::int64_t a = int_arg(amount, "amount");
            const std::string rid = request_id_arg(request_id, kEmptyRequestId);
            NetworkWait wait(c.store()->is_memory());
            return c.incr(k, a, rid);
          },
          py::arg("key"), py::arg("amount") = 1, py::kw_only(), py::arg("request_id") = py::none(),
          "Add `amount` (>= 1) to `key`'s count in the current window and return the new count.\n\n"
          "With on_error='queue', a transient failure queues the increment for retry and returns 0.\n"
          "With `request_id`, a repeat of the same id in the same window is counted once.")
      .def(
          "incr_many",
          [](FixedWindowCounter& c, py::dict amounts) {
            std::vector<std::pair<std::string, std::int64_t>> items;
            py::list keys;
            items.reserve(amounts.size());
            for (auto [k, v] : amounts) {
              items.emplace_back(text_arg(k, "key"), int_arg(v, "amount"));
              keys.append(k);
            }
            std::vector<std::int64_t> counts;
            {
              NetworkWait wait;
              counts = c.incr_many(items);
            }
            return keyed_values(counts, keys);
          },
          py::arg("amounts"),
          "Increment many keys in one round trip: {key: amount} -> {key: count}. Every key and "
          "amount is validated before anything is sent.")
      .def(
          "get",
          [](FixedWindowCounter& c, py::handle key) {
            const std::string k = text_arg(key, "key");
            NetworkWait wait;
            return c.get(k);
          },
          py::arg("key"), "The count of `key` in the current window (0 if none).")
      .def(
          "get_many",
          [](FixedWindowCounter& c, const std::vector<py::object>& keys) {
            std::vector<std::string> ks;
            py::list originals;
            for (const auto& k : keys) {
              ks.push_back(text_arg(k, "key"));
              originals.append(k);
            }
            std::vector<std::int64_t> counts;
            {
              NetworkWait wait;
              counts = c.get_many(ks);
            }
            return keyed_values(counts, originals);
          },
          py::arg("keys"), "Counts of many keys in the current window, in one round trip.")
      .def(
          "ttl",
          [](FixedWindowCounter& c, py::handle key) {
            const std::string k = text_arg(key, "key");
            std::int64_t ms;
            {
              NetworkWait wait;
              ms = c.pttl(k);
            }
            return ms < 0 ? static_cast<double>(ms) : static_cast<double>(ms) / 1000.0;
          },
          py::arg("key"),
          "Seconds until the current window's key expires; -2.0 if it does not exist, -1.0 if it "
          "has no TTL (which redcount never leaves behind).")
      .def("storage_key", [](const FixedWindowCounter& c, py::handle key) { return c.storage_key(text_arg(key, "key")); },
           py::arg("key"), "The Redis key that holds `key`'s count in the current window.")
      .def(
          "current_window",
          [](const FixedWindowCounter& c, py::handle key) {
            const std::string k = text_arg(key, "key");
            validate_key(k);
            WindowPos p = c.window(k);
            return py::make_tuple(static_cast<double>(p.start_ms) / 1000.0, static_cast<double>(p.end_ms) / 1000.0);
          },
          py::arg("key"), "(start, end) of `key`'s current window, in seconds since the epoch.")
      .def(
          "flush",
          [](FixedWindowCounter& c, py::object timeout) {
            auto t = timeout_arg(timeout);
            NetworkWait wait;  // waits for the retry thread
            return c.flush(t);
          },
          py::arg("timeout") = py::none(),
          "Retry everything queued now and wait until the queue is empty or `timeout` seconds pass. "
          "Returns how many increments are still pending (0 = all delivered or dropped).")
      .def(
          "close",
          [](FixedWindowCounter& c, py::object timeout) {
            auto t = timeout_arg(timeout);
            NetworkWait wait;  // waits for the retry thread
            return c.close(t);
          },
          py::arg("timeout") = 5.0,
          "Flush within `timeout` seconds, then stop the retry thread. Returns how many increments "
          "could not be delivered (they are counted in stats().failed).")
      .def_property_readonly("pending", &FixedWindowCounter::pending, "Increments waiting in the retry queue.")
      .def("stats", &FixedWindowCounter::stats, "A snapshot of the retry queue's counters.")
      .def_property_readonly("name", [](const FixedWindowCounter& c) { return c.options().name; })
      .def_property_readonly("prefix", [](const FixedWindowCounter& c) { return c.options().prefix; })
      .def_property_readonly("window", [](const FixedWindowCounter& c) { return static_cast<double>(c.options().window_ms) / 1000.0; })
      .def_property_readonly("grace", [](const FixedWindowCounter& c) { return static_cast<double>(c.options().grace_ms) / 1000.0; })
      .def_property_readonly("mode", [](const FixedWindowCounter& c) {
        return c.options().mode == FixedWindowOptions::Mode::Script ? "script" : "commands";
      })
      .def_property_readonly("on_error", [](const FixedWindowCounter& c) {
        return c.options().on_error == FixedWindowOptions::OnError::Raise ? "raise" : "queue";
      })
      .def_property_readonly("store", [](const FixedWindowCounter& c) { return c.store(); })
      // The same calls as operations for redcount.aio: each returns the result when it
      // completed at once (memory://), else a future the store's I/O thread completes.
      .def(
          "incr_async",
          [](FixedWindowCounter& c, py::handle key, py::handle amount, py::handle request_id) {
            const std::string k = text_arg(key, "key");
            const std::int64_t a = int_arg(amount, "amount");
            const std::string rid = request_id_arg(request_id, kEmptyRequestId);
            return aio::submit_async(c.store(), c.make_incr(k, a, rid), [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("key"), py::arg("amount") = 1, py::kw_only(), py::arg("request_id") = py::none())
      .def(
          "incr_many_async",
          [](FixedWindowCounter& c, py::dict amounts) {
            std::vector<std::pair<std::string, std::int64_t>> items;
            py::list keys;
            items.reserve(amounts.size());
            for (auto [k, v] : amounts) {
              items.emplace_back(text_arg(k, "key"), int_arg(v, "amount"));
              keys.append(k);
            }
            return aio::submit_async(c.store(), c.make_incr_many(items), &keyed_values, std::move(keys));
          },
          py::arg("amounts"))
      .def(
          "get_async",
          [](FixedWindowCounter& c, py::handle key) {
            return aio::submit_async(c.store(), c.make_get(text_arg(key, "key")),
                                     [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("key"))
      .def(
          "get_many_async",
          [](FixedWindowCounter& c, const std::vector<py::object>& keys) {
            std::vector<std::string> ks;
            py::list originals;
            for (const auto& k : keys) {
              ks.push_back(text_arg(k, "key"));
              originals.append(k);
            }
            return aio::submit_async(c.store(), c.make_get_many(ks), &keyed_values, std::move(originals));
          },
          py::arg("keys"))
      .def(
          "ttl_async",
          [](FixedWindowCounter& c, py::handle key) {
            return aio::submit_async(c.store(), c.make_pttl(text_arg(key, "key")), [](std::int64_t& ms) {
              return py::float_(ms < 0 ? static_cast<double>(ms) : static_cast<double>(ms) / 1000.0);
            });
          },
          py::arg("key"));

  py::class_<SlidingWindowCounter>(m, "SlidingWindowCounter",
                                   "The C++ sliding-window counter; use redcount.SlidingWindowCounter.")
      .def(py::init([](std::shared_ptr<Store> store, py::handle name, py::handle window, py::handle prefix,
                       const std::string& clock) {
             if (!store) throw InvalidArgument("store must not be None");
             return std::make_unique<SlidingWindowCounter>(std::move(store), text_arg(name, "name"),
                                                           seconds_arg(window, "window", false),
                                                           text_arg(prefix, "prefix"), parse_clock_mode(clock));
           }),
           py::arg("store"), py::arg("name"), py::arg("window"), py::arg("prefix"), py::arg("clock"))
      .def(
          "add",
          [](SlidingWindowCounter& c, py::handle key, py::handle amount) {
            const std::string k = text_arg(key, "key");
            const std::int64_t a = int_arg(amount, "amount");
            NetworkWait wait;
            return c.add(k, a);
          },
          py::arg("key"), py::arg("amount"))
      .def(
          "count",
          [](SlidingWindowCounter& c, py::handle key) {
            const std::string k = text_arg(key, "key");
            NetworkWait wait;
            return c.count(k);
          },
          py::arg("key"))
      .def(
          "add_unique",
          [](SlidingWindowCounter& c, py::handle key, py::handle item) {
            const std::string k = text_arg(key, "key");
            const std::string i = text_arg(item, "item");
            NetworkWait wait;
            return c.add_unique(k, i);
          },
          py::arg("key"), py::arg("item"))
      .def(
          "count_unique",
          [](SlidingWindowCounter& c, py::handle key) {
            const std::string k = text_arg(key, "key");
            NetworkWait wait;
            return c.count_unique(k);
          },
          py::arg("key"))
      .def(
          "clear",
          [](SlidingWindowCounter& c, py::handle key) {
            const std::string k = text_arg(key, "key");
            NetworkWait wait;
            c.clear(k);
          },
          py::arg("key"))
      .def(
          "storage_keys",
          [](const SlidingWindowCounter& c, py::handle key) {
            const std::string k = text_arg(key, "key");
            return py::make_tuple(c.events_key(k), c.weight_key(k), c.unique_key(k));
          },
          py::arg("key"), "The Redis keys behind `key`: (events, extra weight, distinct items).")
      .def_property_readonly("name", &SlidingWindowCounter::name)
      .def_property_readonly("prefix", &SlidingWindowCounter::prefix)
      .def_property_readonly("window",
                             [](const SlidingWindowCounter& c) { return static_cast<double>(c.window_ms()) / 1000.0; },
                             "Window in seconds.")
      .def_property_readonly("clock",
                             [](const SlidingWindowCounter& c) { return std::string(clock_mode_name(c.clock())); },
                             "The time source in force: 'client', 'server' or 'server-offset'.")
      .def_property_readonly("store", &SlidingWindowCounter::store)
      .def(
          "add_async",
          [](SlidingWindowCounter& c, py::handle key, py::handle amount) {
            auto op = c.make_add(text_arg(key, "key"), int_arg(amount, "amount"));
            return aio::submit_async(c.store(), std::move(op), [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("key"), py::arg("amount"))
      .def(
          "count_async",
          [](SlidingWindowCounter& c, py::handle key) {
            return aio::submit_async(c.store(), c.make_count(text_arg(key, "key")),
                                     [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("key"))
      .def(
          "add_unique_async",
          [](SlidingWindowCounter& c, py::handle key, py::handle item) {
            auto op = c.make_add_unique(text_arg(key, "key"), text_arg(item, "item"));
            return aio::submit_async(c.store(), std::move(op), [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("key"), py::arg("item"))
      .def(
          "count_unique_async",
          [](SlidingWindowCounter& c, py::handle key) {
            return aio::submit_async(c.store(), c.make_count_unique(text_arg(key, "key")),
                                     [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("key"))
      .def(
          "clear_async",
          [](SlidingWindowCounter& c, py::handle key) {
            return aio::submit_async(c.store(), c.make_clear(text_arg(key, "key")),
                                     [](std::monostate&) { return py::none(); });
          },
          py::arg("key"));
}

}  // namespace redcount::bind
