// What every register_<area>.cpp of the pybind11 bindings includes: the registration
// functions module.cpp calls, the conversion shims (convert.h), the GIL policy for a
// blocking call (gil.h) and the mapping of C++ errors to Python exceptions
// (register_errors.cpp). Only the bindings include pybind11.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>

#include "convert.h"
#include "gil.h"

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
#ifdef REDCOUNT_TEST_HOOKS
// redcount._core._testing: classes and functions only the tests use (register_testing.cpp).
void register_testing(py::module_& m);
#endif

// Sets the Python error matching a redcount::Error (the same mapping as for exceptions that
// leave a bound function). Only for exceptions derived from redcount::Error.
void set_python_error(const std::exception_ptr& error);
// The Python exception object for a C++ exception, as a bound function would raise it:
// for asyncio, where the error goes to future.set_exception() instead of being raised.
py::object exception_object(const std::exception_ptr& error);

}  // namespace redcount::bind
