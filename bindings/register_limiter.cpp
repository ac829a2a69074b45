// Limiters: redcount._core.LimitSet, Decision, LimitStats and LimiterCore.
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "aio.h"
#include "common.h"
#include "redcount/common/errors.h"
#include "redcount/limiters/gate.h"
#include "redcount/limiters/leased.h"
#include "redcount/limiters/policies.h"
#include "redcount/limiters/limiter.h"
#include "redcount/common/limit_string.h"
#include "redcount/store/scripts.h"
#include "redcount/common/window.h"
#include "redcount/store/time_source.h"

namespace redcount::bind {
namespace {

struct LimitSet {
  std::string text;
  std::vector<RateLimit> limits;
};

// redcount._core.LimiterCore: a strategy plus a cache of parsed limit strings, so that
// limiter.hit("10/minute", key) parses "10/minute" once.
struct LimiterHandle {
  std::shared_ptr<Store> store;  // what the *_async methods submit their operations to
  std::unique_ptr<LimiterStrategy> strategy;
  bool memory = false;  // nothing to wait for on the memory store: keep the GIL
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const LimitSet>> parsed;

  std::shared_ptr<const LimitSet> limits(py::handle limit) {
    // The same str object as last time (a literal at a call site): no type lookup, no
    // hashing, no lock. Only touched with the GIL held, which serialises it.
    if (limit.ptr() == last_text.ptr() && last_set) return last_set;
    if (!PyUnicode_Check(limit.ptr()) && py::isinstance<LimitSet>(limit)) {
      // Borrowed: the caller's LimitSet outlives the call (it is an argument).
      return std::shared_ptr<const LimitSet>(std::shared_ptr<const LimitSet>(), &limit.cast<const LimitSet&>());
    }
    if (!PyUnicode_Check(limit.ptr())) {
      throw py::type_error("limit must be a str or LimitSet, got " +
                           std::string(py::str(py::type::handle_of(limit).attr("__name__"))));
    }
    std::string text = text_arg(limit, "limit");
    std::shared_ptr<const LimitSet> set;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = parsed.find(text);
      if (it != parsed.end()) set = it->second;
    }
    if (!set) {
      set = std::make_shared<const LimitSet>(LimitSet{text, parse_limits(text)});
      std::lock_guard<std::mutex> lock(mu);
      if (parsed.size() < 4096) parsed.emplace(std::move(text), set);
    }
    last_text = py::reinterpret_borrow<py::object>(limit);
    last_set = set;
    return set;
  }
  py::object last_text;
  std::shared_ptr<const LimitSet> last_set;

  // hit_all's items: an iterable of (limit, key) pairs.
  std::vector<KeyedLimits> items(py::handle items) {
    if (PyUnicode_Check(items.ptr()) || PyBytes_Check(items.ptr()) || !py::isinstance<py::iterable>(items)) {
      throw py::type_error("items must be a list of (limit, key) pairs, got " +
                           std::string(py::str(py::type::handle_of(items).attr("__name__"))));
    }
    std::vector<KeyedLimits> out;
    for (py::handle item : items) {
      if (!PyTuple_Check(item.ptr()) && !PyList_Check(item.ptr())) {
        throw py::type_error("each item must be a (limit, key) pair, got " +
                             std::string(py::str(py::type::handle_of(item).attr("__name__"))));
      }
      py::sequence pair = py::reinterpret_borrow<py::sequence>(item);
      if (pair.size() != 2) {
        throw InvalidArgument("each item must be a (limit, key) pair, got " + std::to_string(pair.size()) +
                              " elements");
      }
      out.push_back(KeyedLimits{limits(pair[0])->limits, text_arg(pair[1], "key")});
    }
    return out;
  }
  static std::string tag_of(py::handle tag) { return tag.is_none() ? std::string() : text_arg(tag, "tag"); }

  // The operations of refund, reserve and settle (sync and async) from their Python arguments.
  std::shared_ptr<Op<Adjustment>> refund_op(py::handle limit, py::handle key, py::handle cost, py::handle rid,
                                            py::handle tag, py::handle decision) {
    std::optional<std::int64_t> charged_at_us;
    if (!decision.is_none()) {
      if (!py::isinstance<Decision>(decision)) {
        throw InvalidArgument("decision must be the Decision of the hit being refunded, got " +
                              std::string(py::str(py::type::of(decision).attr("__name__"))));
      }
      charged_at_us = decision.cast<const Decision&>().charged_at_us;
      if (!charged_at_us) {
        throw InvalidArgument(
            "decision charged nothing that refund() can find: pass the Decision of an allowed hit() "
            "(a refused hit, test(), hit_all() and a decision made without the store carry no charge)");
      }
    }
    return strategy->make_refund(limits(limit)->limits, text_arg(key, "key"), int_arg(cost, "cost"),
                                 request_id_arg(rid, "request_id must not be empty"), tag_of(tag), charged_at_us);
  }
  std::shared_ptr<Op<Adjustment>> reserve_op(py::handle limit, py::handle key, py::handle cost, py::handle rid,
                                             py::handle deadline, py::handle tag) {
    return strategy->make_reserve(limits(limit)->limits, text_arg(key, "key"), int_arg(cost, "cost"),
                                  request_id_arg(rid, "request_id must not be empty"),
                                  seconds_arg(deadline, "deadline", false), tag_of(tag));
  }
  std::shared_ptr<Op<Adjustment>> settle_op(py::handle limit, py::handle key, py::handle rid, py::handle actual,
                                            py::handle tag) {
    return strategy->make_settle(limits(limit)->limits, text_arg(key, "key"),
                                 request_id_arg(rid, "request_id must not be empty"), int_arg(actual, "actual"),
                                 tag_of(tag));
  }
  // A leased hit admits from a per-process lease of the key's untagged state.
  static void check_lease_tag(py::handle lease, const std::string& tag) {
    if (!lease.is_none() && !tag.empty()) {
      throw InvalidArgument("lease= and tag= cannot be combined: leases are taken from a key's untagged state");
    }
  }

  // What runs in front of the decisions (policies.h): allow and deny lists, the refusal
  // cache, a penalty and on_unavailable. Set by _set_guard before the limiter is used.
  std::shared_ptr<Guard> guard;
  std::string prefix;

  // penalty=: None (the limiter's), False (none for this call) or a redcount.Penalty,
  // whose fields are read here (the Penalty checked their types; PenaltyConfig the ranges).
  static CallPenalty penalty_arg(py::handle p) {
    if (p.is_none()) return {};
    if (p.ptr() == Py_False) return CallPenalty::off();
    if (!py::hasattr(p, "after") || !py::hasattr(p, "max_block") || py::isinstance<py::bool_>(p)) {
      throw py::type_error(
          "penalty must be a redcount.Penalty, None (the limiter's) or False (none for this call), got " +
          std::string(py::repr(p)));
    }
    return CallPenalty::of(penalty_config(p));
  }
  static PenaltyConfig penalty_config(py::handle p) {
    return PenaltyConfig::make(p.attr("after").cast<std::int64_t>(), p.attr("within").cast<double>(),
                               p.attr("block").cast<double>(), p.attr("factor").cast<double>(),
                               p.attr("max_block").cast<double>());
  }
  // Whether a call goes through the guard: something is configured in front of the limiter,
  // the call brings its own penalty, or (sync) a failed store is decided by on_unavailable.
  bool guarded(const CallPenalty& p, bool sync = true) const {
    return guard->active() || p.kind == CallPenalty::Kind::Given ||
           (sync && guard->on_unavailable() != OnUnavailable::Raise);
  }
  // hit or test (charge false) through the guard. A leased call decides in this process, so
  // its steps are the guard's pieces around it: the lists and the cache, the block as a PTTL
  // of its own, the lease, then what follows a refusal.
  Decision guarded_one(const std::vector<RateLimit>& limits, const std::string& k, std::int64_t c,
                       const std::string& t, py::handle lease, const CallPenalty& p, bool charge) {
    if (lease.is_none()) {
      auto op = charge ? guard->make_hit(*strategy, limits, k, c, t, p) : guard->make_test(*strategy, limits, k, c, t, p);
      NetworkWait wait(memory);
      return run(*store, *op);
    }
    const std::int64_t n = lease_units(limits, k, c, lease);
    if (auto d = guard->decide_locally(limits, k, c, t, p)) return *d;
    auto check = guard->make_block_check(limits, k, p);
    Decision d;
    {
      NetworkWait wait(memory);
      if (auto blocked = run(*store, *check)) return *blocked;
    }
    try {
      if (charge) {
        if (auto local = leases->admit_local(limits, k, c)) {
          d = *local;
        } else {
          NetworkWait wait(memory);
          d = leases->hit(limits, k, c, n);
        }
      } else if (auto peek = leases->peek_local(limits, k, c)) {
        d = *peek;
      } else {
        NetworkWait wait(memory);
        d = strategy->test(limits, k, c);
      }
    } catch (const ConnectionError&) {
      d = unavailable_decision(guard->on_unavailable(), std::current_exception());
    }
    if (d.allowed || d.unavailable) return d;
    auto after = guard->make_after(limits, k, c, t, p, std::move(d), charge);
    NetworkWait wait(memory);
    return run(*store, *after);
  }

  // Leased limits (leased.h): local admissions keep the GIL; a refill releases it.
  std::shared_ptr<LeaseTable> leases;
  std::int64_t lease_units(const std::vector<RateLimit>& limits, std::string_view key, std::int64_t cost,
                           py::handle lease) const {
    const std::int64_t n = int_arg(lease, "lease");
    leases->check(n);
    validate_cost(limits, cost);
    validate_key(key);
    return n;
  }
  Decision leased_hit(const std::vector<RateLimit>& limits, const std::string& key, std::int64_t cost,
                      py::handle lease) {
    const std::int64_t n = lease_units(limits, key, cost, lease);
    if (auto d = leases->admit_local(limits, key, cost)) return *d;
    NetworkWait wait(memory);
    return leases->hit(limits, key, cost, n);
  }
  py::object leased_hit_async(const std::vector<RateLimit>& limits, const std::string& key, std::int64_t cost,
                              py::handle lease) {
    const std::int64_t n = lease_units(limits, key, cost, lease);
    if (auto d = leases->admit_local(limits, key, cost)) return py::cast(*d);
    LeaseTable::Step s = leases->begin(limits, key, cost, n, false);
    if (s.decided) {
      // Units of leases past their time go back without the caller waiting for them.
      if (s.give_back) run_async(store, s.give_back, [](std::exception_ptr) {});
      return py::cast(*s.decided);
    }
    auto op = std::move(s.refill.op);
    return aio::submit_async(store, std::move(op), [table = leases, refill = s.refill](LeaseGrant& g) {
      return py::cast(table->install(refill, g));
    });
  }
};

// LimiterCore.hit as a CPython vectorcall method. pybind11 matches keyword arguments by
// making a string of each parameter name on every call and passes positional ones in a
// new tuple: for a leased hit admitted in the process that was most of the call's cost.
// This front reads the usual calls itself (`limit, key[, cost]`, with `lease=` and `cost=`
// found among the call's interned keyword names by pointer) and raises as pybind11 would
// (its translators); a call it does not read (other keywords, a missing argument) goes
// to pybind11's `hit`, which decides it or says what is wrong.
PyObject* g_hit_slow = nullptr;  // pybind11's LimiterCore.hit (a function taking self first)

PyObject* slow_hit(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  std::vector<PyObject*> all(static_cast<std::size_t>(1 + nargs + nkw));
  all[0] = self;
  for (Py_ssize_t i = 0; i < nargs + nkw; ++i) all[static_cast<std::size_t>(1 + i)] = args[i];
  return PyObject_Vectorcall(g_hit_slow, all.data(), static_cast<std::size_t>(1 + nargs), kwnames);
}

bool name_is(PyObject* name, PyObject* interned) {
  return name == interned || PyUnicode_Compare(name, interned) == 0;
}

PyObject* fast_hit(PyObject* self, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  static PyObject* const lease_name = PyUnicode_InternFromString("lease");
  static PyObject* const cost_name = PyUnicode_InternFromString("cost");
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs != 2 && nargs != 3) return slow_hit(self, args, nargs, kwnames);
  PyObject* lease = nullptr;
  PyObject* cost = nargs == 3 ? args[2] : nullptr;
  for (Py_ssize_t i = 0; kwnames != nullptr && i < PyTuple_GET_SIZE(kwnames); ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    if (lease == nullptr && name_is(name, lease_name)) {
      lease = args[nargs + i];
    } else if (cost == nullptr && name_is(name, cost_name)) {
      cost = args[nargs + i];
    } else {
      return slow_hit(self, args, nargs, kwnames);
    }
  }
  try {
    auto& h = py::cast<LimiterHandle&>(py::handle(self));
    if (h.guarded({})) return slow_hit(self, args, nargs, kwnames);  // the guard decides (policies.h)
    auto limits = h.limits(args[0]);
    const std::string k = text_arg(args[1], "key");
    const std::int64_t c = cost == nullptr ? 1 : int_arg(cost, "cost");
    if (lease != nullptr && lease != Py_None) return py::cast(h.leased_hit(limits->limits, k, c, lease)).release().ptr();
    Decision d;
    {
      NetworkWait wait(h.memory);
      d = h.strategy->hit(limits->limits, k, c);
    }
    return py::cast(std::move(d)).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
}

PyMethodDef g_fast_hit_def = {
    "hit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_hit)), METH_FASTCALL | METH_KEYWORDS,
    "hit($self, /, limit, key, cost=1, *, lease=None, tag=None, penalty=None)\n--\n\n"
    "Charge `cost` against `key` if every limit allows it; return the Decision. `limit` is a "
    "string like '10/minute' or '5/second;100/hour' (parsed once and cached) or a LimitSet. "
    "`lease=N` (fixed-window, sliding-window-approx): take up to N units at a time into this "
    "process and admit from them locally (see docs/leased-limits.md). `tag`: the key's state "
    "under that hash tag, the state hit_all(..., tag=) charges. `penalty=`: this call's penalty "
    "(see docs/penalties.md)."};

// Puts fast_hit in front of pybind11's LimiterCore.hit.
void install_fast_hit(py::handle cls) {
  g_hit_slow = py::getattr(cls, "hit").release().ptr();  // kept for the module's life
  PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &g_fast_hit_def);
  if (descr == nullptr) throw py::error_already_set();
  const int rc = PyObject_SetAttrString(cls.ptr(), "hit", descr);
  Py_DECREF(descr);
  if (rc != 0) throw py::error_already_set();
}

// Decision's truth value from the type's nb_bool slot: `if limiter.hit(...)` is how a
// decision is read, and pybind11's __bool__ went through its dispatcher (a generic call,
// argument loading, a Python bool) on every test; for a leased hit admitted in the process
// that was a third of the call.
int decision_bool(PyObject* self) {
  try {
    return py::cast<const Decision&>(py::handle(self)).allowed ? 1 : 0;
  } catch (py::error_already_set& e) {
    e.restore();
    return -1;
  } catch (...) {
    py::detail::try_translate_exceptions();
    return -1;
  }
}

void install_fast_bool(py::handle cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  if (type->tp_as_number == nullptr) return;  // keeps pybind11's __bool__
  type->tp_as_number->nb_bool = &decision_bool;
  PyType_Modified(type);
}

}  // namespace

void register_limiter(py::module_& m) {
  py::class_<RateLimit>(m, "RateLimit", "One parsed limit, e.g. 100 per 5 minutes.")
      .def_readonly("amount", &RateLimit::amount)
      .def_readonly("multiple", &RateLimit::multiple)
      .def_readonly("unit", &RateLimit::unit)
      .def_readonly("burst", &RateLimit::burst, "The 'burst N' given, or 0 (then the capacity is the amount).")
      .def_property_readonly("window", [](const RateLimit& r) { return ms_to_seconds(r.window_ms); }, "Window in seconds.")
      .def("__str__", &RateLimit::text)
      .def("__repr__", [](const RateLimit& r) { return "RateLimit('" + r.text() + "')"; });

  py::class_<LimitSet>(m, "LimitSet", "A parsed limit string; all of its limits must hold.")
      .def(py::init([](py::handle text) {
             std::string t = text_arg(text, "limit");
             return LimitSet{t, parse_limits(t)};
           }),
           py::arg("text"))
      .def_readonly("text", &LimitSet::text)
      .def_property_readonly("limits", [](const LimitSet& s) { return s.limits; })
      .def("__len__", [](const LimitSet& s) { return s.limits.size(); })
      .def("__str__", [](const LimitSet& s) { return s.text; })
      .def("__repr__", [](const LimitSet& s) { return "LimitSet('" + s.text + "')"; });

  py::class_<Decision>(m, "Decision", "The outcome of a rate-limit check. Truthy when allowed.")
      .def_readonly("allowed", &Decision::allowed, "Whether the hit is (or would be) allowed.")
      .def_readonly("limit", &Decision::limit, "The amount of the binding limit.")
      .def_readonly("remaining", &Decision::remaining, "Hits of cost 1 still allowed under every limit.")
      .def_property_readonly("reset_after", [](const Decision& d) { return ms_to_seconds(d.reset_after_ms); },
                             "Seconds until the binding limit's window resets.")
      .def_property_readonly("retry_after", [](const Decision& d) { return ms_to_seconds(d.retry_after_ms); },
                             "0 when allowed; else seconds until the same hit would be allowed.")
      .def_readonly("unavailable", &Decision::unavailable,
                    "True when the store was unavailable and the limiter's on_unavailable policy "
                    "('allow' or 'deny') decided without it.")
      .def_static(
          "_without_store",
          [](bool allowed, double retry_after) {
            Decision d;
            d.allowed = allowed;
            d.unavailable = true;
            d.retry_after_ms = allowed ? 0 : static_cast<std::int64_t>(retry_after * 1000.0);
            return d;
          },
          py::arg("allowed"), py::arg("retry_after") = 0.0,
          "A decision made without the store (Limiter(on_unavailable='allow'|'deny')).")
      .def_static(
          "_local",
          [](bool allowed, std::int64_t limit, std::int64_t remaining, double reset_after, double retry_after) {
            Decision d;
            d.allowed = allowed;
            d.limit = limit;
            d.remaining = remaining;
            d.reset_after_ms = static_cast<std::int64_t>(reset_after * 1000.0);
            d.retry_after_ms = allowed ? 0 : static_cast<std::int64_t>(retry_after * 1000.0);
            return d;
          },
          py::arg("allowed"), py::arg("limit"), py::arg("remaining"), py::arg("reset_after"), py::arg("retry_after"),
          "A decision made in this process from what the store said before (allow and deny lists, the "
          "refusal cache, penalties): the fields as given, unavailable=False.")
      .def_property_readonly(
          "refused_by",
          [](const Decision& d) -> py::object {
            if (d.allowed || d.binding_key.empty()) return py::none();
            return py::make_tuple(d.binding_limit, d.binding_key);
          },
          "hit_all()/test_all(), when refused: (limit, key) of the refusing limit (the one that frees up "
          "last when several refuse), e.g. ('100/minute', 'user:42'); None otherwise.")
      .def_property_readonly(
          "charged_at",
          [](const Decision& d) -> py::object {
            if (!d.charged_at_us) return py::none();
            return py::float_(static_cast<double>(*d.charged_at_us) / 1e6);
          },
          "An allowed hit(): when it charged, in seconds since the epoch by the limiter's clock "
          "(refund(..., decision=) credits only what still holds that charge). None when nothing was "
          "charged or it is not known (test(), hit_all(), a refused hit, a decision made without the store).")
      .def_property_readonly(
          "bound_by",
          [](const Decision& d) -> py::object {
            if (d.binding_key.empty()) return py::none();
            return py::make_tuple(d.binding_limit, d.binding_key);
          },
          "hit_all()/test_all(): (limit, key) of the binding limit: the refusing one when refused, else "
          "the one with the fewest hits left. None from hit() and test().")
      .def_property_readonly(
          "per_key",
          [](const Decision& d) -> py::object {
            if (d.per_item.empty()) return py::none();
            py::list out;
            for (const auto& [amount, remaining] : d.per_item) out.append(py::make_tuple(amount, remaining));
            return out;
          },
          "hit_all()/test_all(): for each (limit, key) item, in order, (limit, remaining) of its tightest "
          "limit as decided (when refused, what the call saw; nothing of it was kept). None from hit() and "
          "test().")
      .def("__bool__", [](const Decision& d) { return d.allowed; })
      .def("__repr__", [](const Decision& d) {
        return std::string("Decision(allowed=") + (d.allowed ? "True" : "False") + ", limit=" + std::to_string(d.limit) +
               ", remaining=" + std::to_string(d.remaining) + ", reset_after=" +
               std::string(py::repr(py::float_(ms_to_seconds(d.reset_after_ms)))) + ", retry_after=" +
               std::string(py::repr(py::float_(ms_to_seconds(d.retry_after_ms)))) +
               (d.unavailable ? ", unavailable=True)" : ")");
      });

  py::class_<LimitStats>(m, "LimitStats", "The state of one limit for one key.")
      .def_readonly("limit", &LimitStats::limit)
      .def_readonly("count", &LimitStats::count)
      .def_readonly("remaining", &LimitStats::remaining)
      .def_property_readonly("reset_after", [](const LimitStats& s) { return ms_to_seconds(s.reset_after_ms); })
      .def("__repr__", [](const LimitStats& s) {
        return "LimitStats(limit='" + s.limit.text() + "', count=" + std::to_string(s.count) +
               ", remaining=" + std::to_string(s.remaining) + ", reset_after=" +
               std::string(py::repr(py::float_(ms_to_seconds(s.reset_after_ms)))) + ")";
      });

  py::class_<Lease>(m, "Lease",
                    "A slot taken by Limiter.acquire() under strategy='concurrency'. Give it back with "
                    "Limiter.release(); if it is never released it expires after its lease_timeout.")
      .def_readonly("key", &Lease::key, "The business key the slot belongs to.")
      .def_readonly("id", &Lease::id, "The lease's unique id.")
      .def_readonly("max_in_flight", &Lease::max_in_flight)
      .def_property_readonly("expires_at", [](const Lease& l) { return ms_to_seconds(l.expires_at_ms); },
                             "When the lease expires by itself, in seconds since the epoch (limiter clock).")
      .def_property_readonly("released", [](const Lease& l) { return l.released && l.released->load(); },
                             "Whether release() was called.")
      .def("__repr__", [](const Lease& l) {
        return "Lease(key='" + l.key + "', id='" + l.id + "', released=" +
               ((l.released && l.released->load()) ? "True" : "False") + ")";
      });

  py::class_<Adjustment>(m, "Adjustment",
                         "What Limiter.refund(), reserve() and settle() did. Truthy when it was applied now.")
      .def_property_readonly(
          "status",
          [](const Adjustment& a) {
            switch (a.status) {
              case Adjustment::Status::Applied: return "applied";
              case Adjustment::Status::Duplicate: return "duplicate";
              case Adjustment::Status::Refused: return "refused";
              case Adjustment::Status::Expired: return "expired";
            }
            return "applied";
          },
          "'applied' (done now), 'duplicate' (already done under this request_id: nothing changed), "
          "'refused' (reserve(): a limit refused the estimate; nothing charged) or 'expired' (settle(): "
          "no reservation under that request_id, never made, refused or past its deadline, where it "
          "settled at the estimate; nothing changed).")
      .def_property_readonly("applied", [](const Adjustment& a) { return a.status == Adjustment::Status::Applied; })
      .def_property_readonly("duplicate",
                             [](const Adjustment& a) { return a.status == Adjustment::Status::Duplicate; })
      .def_readonly("units", &Adjustment::units,
                    "refund(): units given back (the fewest over the limits). reserve(): the estimate charged. "
                    "settle(): > 0 given back (the fewest over the limits: only where the reservation charged), "
                    "< 0 charged (estimate - actual).")
      .def_readonly("estimate", &Adjustment::estimate, "reserve()/settle(): the reservation's estimate (0 if none).")
      .def_readonly("decision", &Adjustment::decision,
                    "The key's state afterwards (what hit(limit, key, 1) would decide); reserve(): the "
                    "reservation's own decision.")
      .def("__bool__", [](const Adjustment& a) { return a.status == Adjustment::Status::Applied; })
      .def("__repr__", [](const Adjustment& a) {
        const char* s = a.status == Adjustment::Status::Applied     ? "applied"
                        : a.status == Adjustment::Status::Duplicate ? "duplicate"
                        : a.status == Adjustment::Status::Refused   ? "refused"
                                                                    : "expired";
        return std::string("Adjustment(status='") + s + "', units=" + std::to_string(a.units) +
               ", estimate=" + std::to_string(a.estimate) + ")";
      });

  py::class_<LimiterHandle> limiter_core(m, "LimiterCore", "A strategy's C++ implementation; use redcount.Limiter.");
  limiter_core
      .def(py::init([](std::shared_ptr<Store> store, const std::string& strategy, py::handle prefix,
                       const std::string& clock, py::handle sub_buckets, std::shared_ptr<Calendar> calendar) {
             LimiterOptions o;
             o.calendar = std::move(calendar);
             o.prefix = text_arg(prefix, "prefix");
             o.clock = parse_clock_mode(clock);
             o.sub_buckets = int_arg(sub_buckets, "sub_buckets");
             auto h = std::make_unique<LimiterHandle>();
             h->memory = store && store->is_memory();
             h->store = store;
             h->prefix = o.prefix;
             h->strategy = make_limiter(std::move(store), strategy, std::move(o));
             h->leases = LeaseTable::create(*h->strategy);
             h->guard = std::make_shared<Guard>(h->store, h->prefix, Guard::Options{});
             return h;
           }),
           py::arg("store"), py::arg("strategy"), py::arg("prefix"), py::arg("clock"), py::arg("sub_buckets"),
           py::arg("calendar") = nullptr)
      .def_property_readonly("clock",
                             [](const LimiterHandle& h) { return std::string(clock_mode_name(h.strategy->clock())); },
                             "The time source in force: 'client', 'server' or 'server-offset'.")
      .def(
          "hit",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle lease, py::handle tag,
             py::handle penalty) -> py::object {
            auto limits = h.limits(limit);
            const std::string k = text_arg(key, "key");
            const std::int64_t c = int_arg(cost, "cost");
            const std::string t = LimiterHandle::tag_of(tag);
            LimiterHandle::check_lease_tag(lease, t);
            const CallPenalty p = LimiterHandle::penalty_arg(penalty);
            if (h.guarded(p)) return py::cast(h.guarded_one(limits->limits, k, c, t, lease, p, true));
            if (!lease.is_none()) [[unlikely]] return py::cast(h.leased_hit(limits->limits, k, c, lease));
            Decision d;
            if (!t.empty()) {
              auto op = h.strategy->make_hit(limits->limits, k, c, t);
              NetworkWait wait(h.memory);
              d = run(*h.store, *op);
            } else {
              NetworkWait wait(h.memory);
              d = h.strategy->hit(limits->limits, k, c);
            }
            return py::cast(std::move(d));
          },
          py::arg("limit"), py::arg("key"), py::arg("cost") = 1, py::kw_only(), py::arg("lease") = py::none(),
          py::arg("tag") = py::none(), py::arg("penalty") = py::none(),
          "Charge `cost` against `key` if every limit allows it; return the Decision. `limit` is a "
          "string like '10/minute' or '5/second;100/hour' (parsed once and cached) or a LimitSet. "
          "`lease=N` (fixed-window, sliding-window-approx): take up to N units at a time into this "
          "process and admit from them locally (see docs/leased-limits.md). `tag`: the key's state "
          "under that hash tag, the state hit_all(..., tag=) charges. `penalty=`: this call's penalty "
          "(see docs/penalties.md).")
      .def(
          "_set_guard",
          [](LimiterHandle& h, std::vector<std::string> allow, std::vector<std::string> deny, std::size_t refusal_cache,
             py::handle penalty, const std::string& on_unavailable) {
            Guard::Options o;
            o.allow = std::move(allow);
            o.deny = std::move(deny);
            o.refusal_cache = refusal_cache;
            if (!penalty.is_none()) o.penalty = LimiterHandle::penalty_config(penalty);
            o.on_unavailable = on_unavailable == "allow"  ? OnUnavailable::Allow
                               : on_unavailable == "deny" ? OnUnavailable::Deny
                                                          : OnUnavailable::Raise;
            h.guard = std::make_shared<Guard>(h.store, h.prefix, std::move(o));
          },
          py::arg("allow"), py::arg("deny"), py::arg("refusal_cache"), py::arg("penalty"), py::arg("on_unavailable"),
          "Put allow and deny lists (keys and CIDRs), a refusal cache of that many keys (0: none), a "
          "redcount.Penalty (or None) and on_unavailable ('raise', 'allow', 'deny') in front of hit, "
          "test, hit_all and test_all. Called once, before the limiter is used.")
      .def_property_readonly("_guarded", [](const LimiterHandle& h) { return h.guard->active(); },
                             "Whether lists, a refusal cache or a penalty are in front of the decisions.")
      .def_property_readonly(
          "_refusal_cache",
          [](const LimiterHandle& h) -> py::object {
            if (h.guard->cache() == nullptr) return py::none();
            return py::make_tuple(h.guard->cache()->size(), h.guard->cache()->hits());
          },
          "(entries, refusals answered from it) of the refusal cache, or None without one.")
      .def(
          "_forget",
          [](LimiterHandle& h, py::handle key, py::handle tag) {
            if (h.guard->cache() != nullptr) {
              h.guard->cache()->drop(refusal_state_key(text_arg(key, "key"), LimiterHandle::tag_of(tag)));
            }
          },
          py::arg("key"), py::arg("tag") = py::none(), "Forget `key`'s cached refusal (its state changed here).")
      .def(
          "_decide_locally",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle tag,
             py::handle penalty) -> std::optional<Decision> {
            auto limits = h.limits(limit);
            return h.guard->decide_locally(limits->limits, text_arg(key, "key"), int_arg(cost, "cost"),
                                           LimiterHandle::tag_of(tag), LimiterHandle::penalty_arg(penalty));
          },
          py::arg("limit"), py::arg("key"), py::arg("cost"), py::arg("tag"), py::arg("penalty"),
          "A decision the lists or the refusal cache make (None: ask the store). For a leased asyncio call.")
      .def(
          "_block_check_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle penalty) {
            auto limits = h.limits(limit);
            auto op = h.guard->make_block_check(limits->limits, text_arg(key, "key"), LimiterHandle::penalty_arg(penalty));
            return aio::submit_async(h.store, std::move(op), [](std::optional<Decision>& d) { return py::cast(d); });
          },
          py::arg("limit"), py::arg("key"), py::arg("penalty"),
          "The penalty's block of `key` as a PTTL of its own: the blocked Decision, or None.")
      .def(
          "_after_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle tag, py::handle penalty,
             const Decision& decided, bool charge) {
            auto limits = h.limits(limit);
            auto op = h.guard->make_after(limits->limits, text_arg(key, "key"), int_arg(cost, "cost"),
                                          LimiterHandle::tag_of(tag), LimiterHandle::penalty_arg(penalty), decided,
                                          charge, OnUnavailable::Raise);
            return aio::submit_async(h.store, std::move(op), [](Decision& d) { return py::cast(d); });
          },
          py::arg("limit"), py::arg("key"), py::arg("cost"), py::arg("tag"), py::arg("penalty"), py::arg("decision"),
          py::arg("charge"), "What follows a leased decision: a refusal counted by the penalty and filed in the cache.")
      .def(
          "return_leases",
          [](LimiterHandle& h) {
            NetworkWait wait(h.memory);
            return h.leases->give_back_all();
          },
          "Give every unused leased unit back to the store; returns how many went back.")
      .def_property_readonly("leased_units", [](const LimiterHandle& h) { return h.leases->held(); },
                             "Leased units this process holds and has not admitted yet.")
      .def_property(
          "lease_ttl", [](const LimiterHandle& h) { return ms_to_seconds(h.leases->ttl_ms()); },
          [](LimiterHandle& h, py::handle ttl) { h.leases->set_ttl_ms(seconds_arg(ttl, "lease_ttl", false)); },
          "Seconds a lease may hold units before they go back to the store.")
      .def(
          "test",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle lease, py::handle tag) {
            auto limits = h.limits(limit);
            const std::string k = text_arg(key, "key");
            const std::int64_t c = int_arg(cost, "cost");
            const std::string t = LimiterHandle::tag_of(tag);
            LimiterHandle::check_lease_tag(lease, t);
            if (h.guarded({})) return h.guarded_one(limits->limits, k, c, t, lease, {}, false);
            if (!t.empty()) {
              auto op = h.strategy->make_test(limits->limits, k, c, t);
              NetworkWait wait(h.memory);
              return run(*h.store, *op);
            }
            if (!lease.is_none()) {
              (void)h.lease_units(limits->limits, k, c, lease);
              if (auto d = h.leases->peek_local(limits->limits, k, c)) return *d;
            }
            NetworkWait wait(h.memory);
            return h.strategy->test(limits->limits, k, c);
          },
          py::arg("limit"), py::arg("key"), py::arg("cost") = 1, py::kw_only(), py::arg("lease") = py::none(),
          py::arg("tag") = py::none(),
          "What hit() would decide now, without charging anything. `lease=N`: answered from this "
          "process's lease of the key when it holds `cost` units, else by the store; never takes a lease. "
          "`tag`: as in hit().")
      .def(
          "stats",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle tag) {
            auto limits = h.limits(limit);
            const std::string k = text_arg(key, "key");
            auto op = h.strategy->make_stats(limits->limits, k, LimiterHandle::tag_of(tag));
            NetworkWait wait(h.memory);
            return run(*h.store, *op);
          },
          py::arg("limit"), py::arg("key"), py::kw_only(), py::arg("tag") = py::none(), "The count, remaining hits and reset time of `key` under each limit.")
      .def(
          "reset",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle tag) {
            auto limits = h.limits(limit);
            const std::string k = text_arg(key, "key");
            auto op = h.guard->make_reset(*h.strategy, limits->limits, k, LimiterHandle::tag_of(tag));
            NetworkWait wait(h.memory);
            run(*h.store, *op);
          },
          py::arg("limit"), py::arg("key"), py::kw_only(), py::arg("tag") = py::none(), "Forget `key`'s state under these limits.")
      .def(
          "hit_all",
          [](LimiterHandle& h, py::handle items, py::handle cost, py::handle tag, py::handle penalty) {
            auto all = h.items(items);
            const std::int64_t c = int_arg(cost, "cost");
            const std::string t = LimiterHandle::tag_of(tag);
            const CallPenalty p = LimiterHandle::penalty_arg(penalty);
            // Validates before the GIL goes.
            auto op = h.guarded(p) ? h.guard->make_hit_all(*h.strategy, all, c, t, p) : h.strategy->make_hit_all(all, c, t);
            NetworkWait wait(h.memory);
            return run(*h.store, *op);
          },
          py::arg("items"), py::arg("cost") = 1, py::kw_only(), py::arg("tag") = py::none(),
          py::arg("penalty") = py::none(),
          "One decision across several (limit, key) pairs: charges `cost` against all of them if every "
          "limit allows it, else against none.")
      .def(
          "test_all",
          [](LimiterHandle& h, py::handle items, py::handle cost, py::handle tag) {
            auto all = h.items(items);
            const std::int64_t c = int_arg(cost, "cost");
            const std::string t = LimiterHandle::tag_of(tag);
            auto op = h.guarded({}) ? h.guard->make_test_all(*h.strategy, all, c, t) : h.strategy->make_test_all(all, c, t);
            NetworkWait wait(h.memory);
            return run(*h.store, *op);
          },
          py::arg("items"), py::arg("cost") = 1, py::kw_only(), py::arg("tag") = py::none(),
          "What hit_all() would decide now, without charging anything.")
      .def(
          "acquire",
          [](LimiterHandle& h, py::handle max_in_flight, py::handle key, py::handle lease_timeout) {
            const std::int64_t n = int_arg(max_in_flight, "max_in_flight");
            const std::string k = text_arg(key, "key");
            const std::int64_t t = seconds_arg(lease_timeout, "lease_timeout", false);
            NetworkWait wait(h.memory);
            return h.strategy->acquire(n, k, t);
          },
          py::arg("max_in_flight"), py::arg("key"), py::kw_only(), py::arg("lease_timeout") = 60.0,
          "Take one of `key`'s `max_in_flight` slots, or return None when all are taken (strategy="
          "'concurrency'). The lease frees itself after `lease_timeout` seconds if never released.")
      .def(
          "release",
          [](LimiterHandle& h, const Lease& lease) {
            NetworkWait wait(h.memory);
            return h.strategy->release(lease);
          },
          py::arg("lease"),
          "Give the slot back: True when the lease was still held, False when it had already expired. "
          "Releasing the same lease twice raises InvalidInputError.")
      .def(
          "in_flight",
          [](LimiterHandle& h, py::handle key) {
            const std::string k = text_arg(key, "key");
            NetworkWait wait(h.memory);
            return h.strategy->in_flight(k);
          },
          py::arg("key"), "Leases of `key` held now (strategy='concurrency').")
      .def(
          "refund",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle request_id,
             py::handle tag, py::handle decision) {
            auto op = h.refund_op(limit, key, cost, request_id, tag, decision);
            NetworkWait wait(h.memory);
            return run(*h.store, *op);
          },
          py::arg("limit"), py::arg("key"), py::arg("cost") = 1, py::kw_only(), py::arg("request_id") = py::none(),
          py::arg("tag") = py::none(), py::arg("decision") = py::none(),
          "Give back up to `cost` units charged to `key` (where `decision`, the hit's Decision, charged; "
          "without it the current window); once per request_id.")
      .def(
          "reserve",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle request_id,
             py::handle deadline, py::handle tag) {
            auto op = h.reserve_op(limit, key, cost, request_id, deadline, tag);
            NetworkWait wait(h.memory);
            return run(*h.store, *op);
          },
          py::arg("limit"), py::arg("key"), py::arg("cost"), py::kw_only(), py::arg("request_id"),
          py::arg("deadline"), py::arg("tag") = py::none(), "Charge the estimate `cost` if allowed and record the reservation until `deadline`.")
      .def(
          "settle",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle request_id, py::handle actual,
             py::handle tag) {
            auto op = h.settle_op(limit, key, request_id, actual, tag);
            NetworkWait wait(h.memory);
            return run(*h.store, *op);
          },
          py::arg("limit"), py::arg("key"), py::kw_only(), py::arg("request_id"), py::arg("actual"),
          py::arg("tag") = py::none(),
          "Settle the reservation `request_id` at `actual` units, once.")
      .def(
          "refund_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle request_id,
             py::handle tag, py::handle decision) {
            auto op = h.refund_op(limit, key, cost, request_id, tag, decision);
            return aio::submit_async(h.store, std::move(op), [](Adjustment& a) { return py::cast(a); });
          },
          py::arg("limit"), py::arg("key"), py::arg("cost") = 1, py::kw_only(), py::arg("request_id") = py::none(),
          py::arg("tag") = py::none(), py::arg("decision") = py::none())
      .def(
          "reserve_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle request_id,
             py::handle deadline, py::handle tag) {
            auto op = h.reserve_op(limit, key, cost, request_id, deadline, tag);
            return aio::submit_async(h.store, std::move(op), [](Adjustment& a) { return py::cast(a); });
          },
          py::arg("limit"), py::arg("key"), py::arg("cost"), py::kw_only(), py::arg("request_id"),
          py::arg("deadline"), py::arg("tag") = py::none())
      .def(
          "settle_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle request_id, py::handle actual,
             py::handle tag) {
            auto op = h.settle_op(limit, key, request_id, actual, tag);
            return aio::submit_async(h.store, std::move(op), [](Adjustment& a) { return py::cast(a); });
          },
          py::arg("limit"), py::arg("key"), py::kw_only(), py::arg("request_id"), py::arg("actual"),
          py::arg("tag") = py::none())
      // The same calls as operations for redcount.aio: each returns the result when it
      // completed at once (memory://), else a future the store's I/O thread completes.
      .def(
          "hit_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle lease, py::handle tag,
             py::handle penalty) {
            auto limits = h.limits(limit);
            const std::string t = LimiterHandle::tag_of(tag);
            LimiterHandle::check_lease_tag(lease, t);
            const CallPenalty p = LimiterHandle::penalty_arg(penalty);
            if (h.guarded(p, false) && !lease.is_none() && p.kind != CallPenalty::Kind::Off) {
              // A leased hit decides in this process: redcount.aio puts the guard's steps
              // (_decide_locally, _block_check_async, _after_async) around the leased decision,
              // which it asks for with penalty=False.
              throw InvalidArgument("a leased hit_async under the guard takes penalty=False (redcount.aio guards it)");
            }
            if (h.guarded(p, false) && lease.is_none()) {
              auto op = h.guard->make_hit(*h.strategy, limits->limits, text_arg(key, "key"), int_arg(cost, "cost"), t, p,
                                          OnUnavailable::Raise);
              return aio::submit_async(h.store, std::move(op), [](Decision& d) { return py::cast(d); });
            }
            if (!lease.is_none()) [[unlikely]] {
              return h.leased_hit_async(limits->limits, text_arg(key, "key"), int_arg(cost, "cost"), lease);
            }
            auto op = h.strategy->make_hit(limits->limits, text_arg(key, "key"), int_arg(cost, "cost"), t);
            return aio::submit_async(h.store, std::move(op), [](Decision& d) { return py::cast(d); });
          },
          py::arg("limit"), py::arg("key"), py::arg("cost") = 1, py::kw_only(), py::arg("lease") = py::none(),
          py::arg("tag") = py::none(), py::arg("penalty") = py::none())
      .def(
          "test_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle cost, py::handle lease, py::handle tag) {
            auto limits = h.limits(limit);
            const std::string k = text_arg(key, "key");
            const std::int64_t c = int_arg(cost, "cost");
            const std::string t = LimiterHandle::tag_of(tag);
            LimiterHandle::check_lease_tag(lease, t);
            if (h.guarded({}, false) && lease.is_none()) {  // a leased test: redcount.aio guards it
              auto op = h.guard->make_test(*h.strategy, limits->limits, k, c, t, {}, OnUnavailable::Raise);
              return aio::submit_async(h.store, std::move(op), [](Decision& d) { return py::cast(d); });
            }
            if (!lease.is_none()) {
              (void)h.lease_units(limits->limits, k, c, lease);
              if (auto d = h.leases->peek_local(limits->limits, k, c)) return py::cast(*d);
            }
            auto op = h.strategy->make_test(limits->limits, k, c, t);
            return aio::submit_async(h.store, std::move(op), [](Decision& d) { return py::cast(d); });
          },
          py::arg("limit"), py::arg("key"), py::arg("cost") = 1, py::kw_only(), py::arg("lease") = py::none(),
          py::arg("tag") = py::none())
      .def(
          "stats_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle tag) {
            auto limits = h.limits(limit);
            auto op = h.strategy->make_stats(limits->limits, text_arg(key, "key"), LimiterHandle::tag_of(tag));
            return aio::submit_async(h.store, std::move(op), [](std::vector<LimitStats>& s) { return py::cast(s); });
          },
          py::arg("limit"), py::arg("key"), py::kw_only(), py::arg("tag") = py::none())
      .def(
          "reset_async",
          [](LimiterHandle& h, py::handle limit, py::handle key, py::handle tag) {
            auto limits = h.limits(limit);
            auto op = h.guard->make_reset(*h.strategy, limits->limits, text_arg(key, "key"), LimiterHandle::tag_of(tag));
            return aio::submit_async(h.store, std::move(op), [](std::monostate&) { return py::none(); });
          },
          py::arg("limit"), py::arg("key"), py::kw_only(), py::arg("tag") = py::none())
      .def(
          "hit_all_async",
          [](LimiterHandle& h, py::handle items, py::handle cost, py::handle tag, py::handle penalty) {
            auto all = h.items(items);
            const std::int64_t c = int_arg(cost, "cost");
            const std::string t = LimiterHandle::tag_of(tag);
            const CallPenalty p = LimiterHandle::penalty_arg(penalty);
            auto op = h.guarded(p, false) ? h.guard->make_hit_all(*h.strategy, all, c, t, p, OnUnavailable::Raise)
                                          : h.strategy->make_hit_all(all, c, t);
            return aio::submit_async(h.store, std::move(op), [](Decision& d) { return py::cast(d); });
          },
          py::arg("items"), py::arg("cost") = 1, py::kw_only(), py::arg("tag") = py::none(),
          py::arg("penalty") = py::none())
      .def(
          "test_all_async",
          [](LimiterHandle& h, py::handle items, py::handle cost, py::handle tag) {
            auto all = h.items(items);
            const std::int64_t c = int_arg(cost, "cost");
            const std::string t = LimiterHandle::tag_of(tag);
            auto op = h.guarded({}, false) ? h.guard->make_test_all(*h.strategy, all, c, t, {}, OnUnavailable::Raise)
                                           : h.strategy->make_test_all(all, c, t);
            return aio::submit_async(h.store, std::move(op), [](Decision& d) { return py::cast(d); });
          },
          py::arg("items"), py::arg("cost") = 1, py::kw_only(), py::arg("tag") = py::none())
      .def(
          "acquire_async",
          [](LimiterHandle& h, py::handle max_in_flight, py::handle key, py::handle lease_timeout) {
            const std::int64_t n = int_arg(max_in_flight, "max_in_flight");
            const std::string k = text_arg(key, "key");
            const std::int64_t t = seconds_arg(lease_timeout, "lease_timeout", false);
            auto op = h.strategy->make_acquire(n, k, t);
            return aio::submit_async(h.store, std::move(op), [](std::optional<Lease>& l) { return py::cast(l); });
          },
          py::arg("max_in_flight"), py::arg("key"), py::kw_only(), py::arg("lease_timeout") = 60.0)
      .def(
          "release_async",
          [](LimiterHandle& h, const Lease& lease) {
            auto op = h.strategy->make_release(lease);
            return aio::submit_async(h.store, std::move(op), [](bool& held) { return py::bool_(held); });
          },
          py::arg("lease"))
      .def(
          "in_flight_async",
          [](LimiterHandle& h, py::handle key) {
            auto op = h.strategy->make_in_flight(text_arg(key, "key"));
            return aio::submit_async(h.store, std::move(op), [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("key"));
  install_fast_hit(limiter_core);
  install_fast_bool(m.attr("Decision"));

  m.def("limiter_strategies", &limiter_strategies, "Names accepted by Limiter(strategy=...).");

  // Leased limits at the end of a process (leased.h): what atexit and Celery's shutdown
  // signals call, and the leased-units metric.
  m.def(
      "_return_all_leases",
      [](bool ending) {
        NetworkWait wait;  // a round trip per store whose leases hold units
        return LeaseTable::give_back_everything(ending);
      },
      py::arg("ending") = true,
      "Give every unused leased unit of every limiter in this process back to its store; returns "
      "how many went back. `ending`: the process is ending, so later leases take only their hit's cost.");
  m.def("_leased_units", &LeaseTable::held_everywhere,
        "Leased units held and not admitted yet, over every limiter in this process.");
  m.def("_sigterm_returns_leases", &LeaseTable::sigterm_armed,
        "Whether a SIGTERM to this process gives its leased units back before it ends.");

  m.def(
      "_check_penalty",
      [](std::int64_t after, double within, double block, double factor, double max_block) {
        (void)PenaltyConfig::make(after, within, block, factor, max_block);
      },
      py::arg("after"), py::arg("within"), py::arg("block"), py::arg("factor"), py::arg("max_block"),
      "Raise InvalidInputError, naming the field and its range, for a penalty penalty.lua would refuse.");

  // The penalty script (cpp/lua/penalty.lua; the memory store runs its twin): counts one
  // refusal of a key and starts its block, atomically, in one round trip.
  m.def(
      "_penalty",
      [](std::shared_ptr<Store> store, std::vector<std::string> keys, std::vector<std::string> args) {
        std::vector<Request> batch;
        batch.emplace_back(ScriptCall{&kPenaltyScript, std::move(keys), std::move(args)});
        std::vector<Reply> replies;
        {
          NetworkWait wait;  // a round trip to Redis
          replies = store->execute(batch);
        }
        return to_python(replies.front());
      },
      py::arg("store"), py::arg("keys"), py::arg("args"),
      "Run penalty.lua: KEYS block, count, last; ARGV after, within_ms, block_ms, factor, max_ms. "
      "Returns [ms, started].");
}

}  // namespace redcount::bind
