// The bindings' conversion shims: Python arguments to C++ values and C++ results to Python
// objects, for every register_<area>.cpp. Each argument shim checks the Python type itself
// (a bool is not an int, a float is not a key) and names the argument in its error, so that
// a bad argument fails the same way whichever function it was given to.
//
//   .def("get", [](FixedWindowCounter& c, py::handle key) {
//     const std::string k = text_arg(key, "key");   // convert with the GIL held
//     NetworkWait wait;                              // then wait without it (gil.h)
//     return c.get(k);
//   })
//
// All of them run with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "redcount/crdt/pn_counter.h"
#include "redcount/store/reply.h"
#include "redcount/sharded/sharded_counter.h"
#include "redcount/store/store.h"

namespace py = pybind11;

namespace redcount::bind {

// ------------------------------------------------------------------------------ arguments

// str -> UTF-8, bytes -> as is (validated as UTF-8 by the core). Anything else is a
// TypeError; a str with lone surrogates is a clear InvalidArgument.
std::string text_arg(py::handle obj, const char* what);
// A Python int that fits int64; bool and float are refused. Past int64 -> InvalidArgument.
std::int64_t int_arg(py::handle obj, const char* what);
// -int_arg(obj, what), refusing the one int64 that has no negation.
std::int64_t negated_int_arg(py::handle obj, const char* what);
// Seconds (int or float) -> whole milliseconds, > 0 (or >= 0 when allow_zero).
std::int64_t seconds_arg(py::handle obj, const char* what, bool allow_zero);
// A `timeout` in seconds (>= 0), or None for no timeout.
std::optional<std::chrono::milliseconds> timeout_arg(py::handle timeout);
// Seconds since the epoch (ManualClock) -> ms, refusing what the clock cannot hold: NaN and
// infinities, and times past about 285,000 years either way.
std::int64_t epoch_ms_arg(double seconds, const char* what);
// A request id, or None for none (""). `empty_message`: the InvalidArgument for "".
std::string request_id_arg(py::handle request_id, const char* empty_message);
// Texts of an iterable (e.g. counter names), each named `what` in an error.
std::vector<std::string> text_list_arg(const py::iterable& items, const char* what);

// One argument of a raw command: str/bytes as text, int and float in decimal.
std::string command_arg(py::handle obj);
// execute('INCR', key): one command from its arguments; `empty_message` is the
// InvalidArgument for none at all.
Command command_from(const py::tuple& args, const char* empty_message);
// execute_many([(...), ...]): the batch, every command checked before anything is sent.
std::vector<Request> commands_from(const std::vector<py::tuple>& commands);

// ShardedCounter.incr_many's [(name, amount) or (name, amount, request_id or None), ...].
std::vector<ShardedIncrement> increments_arg(const py::iterable& items);
// PNCounter.merge_components' {region: (p, n)}.
std::vector<PNComponent> components_arg(py::handle obj);

// ------------------------------------------------------------------------------- results

// A reply as Python: nil None, integer int, bulk string bytes, status str, array list;
// an error reply raises its ReplyError.
py::object to_python(const Reply& r);
// execute_many's replies: as to_python, except that error replies are returned as str.
py::list replies_to_python(const std::vector<Reply>& replies);
// {key: value} in request order: `keys` is the list of the caller's own key objects (so a
// bytes key comes back as the same bytes), `values` the core's results for them.
py::object keyed_values(const std::vector<std::int64_t>& values, py::handle keys);
// Milliseconds -> seconds as a float.
inline double ms_to_seconds(std::int64_t ms) { return static_cast<double>(ms) / 1000.0; }
// A stored key as str. Keys are bytes on the wire; one that is not UTF-8 (a raw command's)
// still comes back as a str, its bad bytes as lone surrogates (os.fsdecode's convention).
py::str key_text(const std::string& key);
// {region: (p, n)}, the Python face of a PN-counter's components.
py::dict components_dict(const std::vector<PNComponent>& cs);

}  // namespace redcount::bind
