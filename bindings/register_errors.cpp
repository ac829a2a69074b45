// Maps the C++ error tree onto Python exceptions under redcount.RedcountError.
#include <cstring>

#include "common.h"
#include "redcount/common/errors.h"
#include "redcount/store/reply.h"

namespace redcount::bind {
namespace {

// Created once at import and kept for the life of the process.
PyObject* g_base = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_connection = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_protocol = nullptr;
PyObject* g_reply = nullptr;
PyObject* g_auth = nullptr;
PyObject* g_script = nullptr;
PyObject* g_queue_full = nullptr;
PyObject* g_store_closed = nullptr;
PyObject* g_unavailable = nullptr;

// An error's text as a Python str. Error replies quote what the server was sent (an
// unknown command, a bad argument given as bytes), which need not be UTF-8: bytes that
// are not become \xNN instead of a UnicodeDecodeError in place of the error.
PyObject* message_of(const char* what) {
  return PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "backslashreplace");
}

void set_error(PyObject* type, const char* what) {
  PyObject* text = message_of(what);
  if (text == nullptr) return;  // the decoder's own error stays set
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}

// An instance of `type` with `what` as its message; nullptr with an error set on failure.
PyObject* instance(PyObject* type, const char* what) {
  PyObject* text = message_of(what);
  if (text == nullptr) return nullptr;
  PyObject* exc = PyObject_CallOneArg(type, text);
  Py_DECREF(text);
  return exc;
}

PyObject* make(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  std::string qualified = std::string("redcount.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // the module keeps a reference too
  return type;
}

// The members of redcount.Outcome (a str enum defined in Python, redcount/errors.py, where
// it is documented), looked up at the first batch that needs them and kept from then on.
// Without the package (the module imported on its own) they are the plain strings the
// enum's members are equal to.
py::object outcome(const char* member, const char* value) {
  try {
    return py::module_::import("redcount.errors").attr("Outcome").attr(member);
  } catch (py::error_already_set&) {
    return py::str(value);
  }
}

// A ConnectionError instance carrying `maybe_applied`: whether the request reached the
// server before the failure (so it may have run) or certainly did not run.
// With `outcomes` when the batch failed part-way (a cluster node lost): one entry per
// request, its reply (a ReplyError instance for an error reply), Outcome.MAYBE or
// Outcome.NOT_SENT.
void set_connection_error(PyObject* type, const ConnectionError& e) {
  PyObject* exc = instance(type, e.what());
  if (exc == nullptr) return;  // the conversion's own error stays set
  bool ok = PyObject_SetAttrString(exc, "maybe_applied", e.maybe_applied() ? Py_True : Py_False) == 0;
  if (ok && e.outcomes()) {
    try {
      static PyObject* maybe = outcome("MAYBE", "maybe").release().ptr();
      static PyObject* not_sent = outcome("NOT_SENT", "not sent").release().ptr();
      py::list outcomes;
      for (const auto& o : *e.outcomes()) {
        if (o.kind == RequestOutcome::Kind::Maybe) {
          outcomes.append(py::handle(maybe));
        } else if (o.kind == RequestOutcome::Kind::NotSent) {
          outcomes.append(py::handle(not_sent));
        } else if (o.reply.is_error()) {
          PyObject* reply_error = instance(g_reply, o.reply.str.c_str());
          if (reply_error == nullptr) throw py::error_already_set();
          outcomes.append(py::reinterpret_steal<py::object>(reply_error));
        } else {
          outcomes.append(to_python(o.reply));
        }
      }
      ok = PyObject_SetAttrString(exc, "outcomes", outcomes.ptr()) == 0;
    } catch (py::error_already_set&) {
      ok = false;
    }
  }
  if (ok) PyErr_SetObject(type, exc);
  Py_DECREF(exc);
}

}  // namespace

void register_errors(py::module_& m) {
  g_base = make(m, "RedcountError", "Base class of every error redcount raises.",
                py::make_tuple(py::handle(PyExc_Exception)));
  g_invalid = make(m, "InvalidInputError",
                   "A bad argument (empty or huge key, non-UTF-8 bytes, window <= 0, bad limit "
                   "string, bad URL...). Raised before anything is sent or stored. Also a ValueError.",
                   py::make_tuple(py::handle(g_base), py::handle(PyExc_ValueError)));
  g_connection = make(m, "ConnectionError",
                      "The store could not be reached: refused, reset, unknown host, closed. Transient. "
                      "`maybe_applied` is True when the request had been sent (it may or may not have run), "
                      "False when it certainly did not run.",
                      py::make_tuple(py::handle(g_base), py::handle(PyExc_ConnectionError)));
  // Where nothing says otherwise (an error raised by Python code), nothing was sent.
  if (PyObject_SetAttrString(g_connection, "maybe_applied", Py_False) != 0) throw py::error_already_set();
  if (PyObject_SetAttrString(g_connection, "outcomes", Py_None) != 0) throw py::error_already_set();
  g_store_closed = make(m, "StoreClosed",
                        "The store was closed: nothing was sent. Not transient: a retry cannot help.",
                        py::make_tuple(py::handle(g_connection)));
  g_timeout = make(m, "TimeoutError",
                   "A connect, command or pool timeout expired. A sent command may or may not have run.",
                   py::make_tuple(py::handle(g_connection), py::handle(PyExc_TimeoutError)));
  g_unavailable = make(m, "Unavailable",
                       "The store could not decide within the budget, or its circuit breaker is open "
                       "(redcount.connect(url, budget=..., fallback=...)). A ConnectionError.",
                       py::make_tuple(py::handle(g_connection)));
  g_protocol = make(m, "ProtocolError", "The server's reply was not what the protocol allows.",
                    py::make_tuple(py::handle(g_base)));
  g_reply = make(m, "ReplyError", "The server answered with an error reply (ERR, WRONGTYPE, READONLY...).",
                 py::make_tuple(py::handle(g_base)));
  g_auth = make(m, "AuthenticationError", "AUTH failed or the server needs a password: check the URL.",
                py::make_tuple(py::handle(g_reply)));
  g_script = make(m, "ScriptError", "A Lua script failed on the server.", py::make_tuple(py::handle(g_reply)));
  g_queue_full = make(m, "RetryQueueFull",
                      "The retry queue is full: the increment was neither applied nor queued.",
                      py::make_tuple(py::handle(g_base)));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error&) {
      set_python_error(p);
    }
  });
}

void set_python_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument& e) {
    set_error(g_invalid, e.what());
  } catch (const StoreClosed& e) {
    set_connection_error(g_store_closed, e);
  } catch (const Unavailable& e) {
    set_connection_error(g_unavailable, e);
  } catch (const TimeoutError& e) {
    set_connection_error(g_timeout, e);
  } catch (const ConnectionError& e) {
    set_connection_error(g_connection, e);
  } catch (const ProtocolError& e) {
    set_error(g_protocol, e.what());
  } catch (const AuthenticationError& e) {
    set_error(g_auth, e.what());
  } catch (const ScriptError& e) {
    set_error(g_script, e.what());
  } catch (const ReplyError& e) {
    set_error(g_reply, e.what());
  } catch (const RetryQueueFull& e) {
    set_error(g_queue_full, e.what());
  } catch (const Error& e) {
    set_error(g_base, e.what());
  }
}

py::object exception_object(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (py::error_already_set& e) {
    return e.value();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const Error&) {
    set_python_error(error);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
  py::error_already_set raised;  // takes the error set above
  return raised.value();
}

}  // namespace redcount::bind
