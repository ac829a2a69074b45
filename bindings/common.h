// Shared helpers for the pybind11 bindings: argument conversion shims and the
// conversion of replies to Python values. Only the bindings include pybind11.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <string>

#include "redcount/store/reply.h"

namespace py = pybind11;

namespace redcount::bind {

void register_errors(py::module_& m);
void register_store(py::module_& m);
void register_counters(py::module_& m);
void register_limiter(py::module_& m);
void register_aio(py::module_& m);
void register_sharded(py::module_& m);
void register_pn(py::module_& m);
void register_hot_keys(py::module_& m);

// str -> UTF-8, bytes -> as is (validated as UTF-8 by the core). Anything else is a
// TypeError; a str with lone surrogates is a clear InvalidArgument.
std::string text_arg(py::handle obj, const char* what);
// A Python int that fits int64; bool and float are refused. Past int64 -> InvalidArgument.
std::int64_t int_arg(py::handle obj, const char* what);
// Seconds (int or float) -> whole milliseconds, > 0 (or >= 0 when allow_zero).
std::int64_t seconds_arg(py::handle obj, const char* what, bool allow_zero);
py::object to_python(const Reply& r);
// One argument of a raw command: str/bytes as text, int and float in decimal.
std::string command_arg(py::handle obj);

// Sets the Python error matching a redcount::Error (the same mapping as for exceptions that
// leave a bound function). Only for exceptions derived from redcount::Error.
void set_python_error(const std::exception_ptr& error);
// The Python exception object for a C++ exception, as a bound function would raise it:
// for asyncio, where the error goes to future.set_exception() instead of being raised.
py::object exception_object(const std::exception_ptr& error);

}  // namespace redcount::bind
