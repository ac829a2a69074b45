// The conversion shims of convert.h.
#include "convert.h"

#include <cmath>
#include <limits>
#include <utility>

#include "redcount/common/errors.h"
#include "redcount/common/window.h"

namespace redcount::bind {

// ------------------------------------------------------------------------------ arguments

std::string text_arg(py::handle obj, const char* what) {
  if (PyUnicode_Check(obj.ptr())) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(obj.ptr(), &size);
    if (data == nullptr) {
      PyErr_Clear();
      throw InvalidArgument(std::string(what) + " is not valid Unicode text (it contains lone surrogates)");
    }
    return std::string(data, static_cast<std::size_t>(size));
  }
  if (PyBytes_Check(obj.ptr())) {
    return std::string(PyBytes_AS_STRING(obj.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(obj.ptr())));
  }
  throw py::type_error(std::string(what) + " must be str or bytes, got " +
                       std::string(Py_TYPE(obj.ptr())->tp_name));
}

std::int64_t int_arg(py::handle obj, const char* what) {
  if (!PyLong_Check(obj.ptr()) || PyBool_Check(obj.ptr())) {
    throw py::type_error(std::string(what) + " must be an int, got " + std::string(Py_TYPE(obj.ptr())->tp_name));
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
  if (overflow != 0) {
    throw InvalidArgument(std::string(what) + " " + std::string(py::str(obj)).substr(0, 40) +
                          " is outside the 64-bit integer range");
  }
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

std::int64_t negated_int_arg(py::handle obj, const char* what) {
  const std::int64_t a = int_arg(obj, what);
  if (a == std::numeric_limits<std::int64_t>::min()) {
    throw InvalidArgument(std::string(what) + " is outside the allowed range");
  }
  return -a;
}

std::int64_t seconds_arg(py::handle obj, const char* what, bool allow_zero) {
  if (PyBool_Check(obj.ptr()) || !(PyLong_Check(obj.ptr()) || PyFloat_Check(obj.ptr()))) {
    throw py::type_error(std::string(what) + " must be a number of seconds, got " +
                         std::string(Py_TYPE(obj.ptr())->tp_name));
  }
  // PyFloat_AsDouble, not py::cast: an int past the double range (10**400) must be a
  // clear InvalidInputError naming the argument, not pybind11's bare cast error.
  const double s = PyFloat_AsDouble(obj.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw InvalidArgument(std::string(what) + " is too large to be a number of seconds");
  }
  if (allow_zero && s == 0) return 0;
  if (allow_zero && s < 0) {
    throw InvalidArgument(std::string(what) + " must be >= 0 seconds, got " + std::string(py::str(obj)));
  }
  return window_seconds_to_ms(s, what);
}

std::optional<std::chrono::milliseconds> timeout_arg(py::handle timeout) {
  if (timeout.is_none()) return std::nullopt;
  return std::chrono::milliseconds(seconds_arg(timeout, "timeout", true));
}

std::int64_t epoch_ms_arg(double seconds, const char* what) {
  constexpr double kMaxMs = 9.0e18;
  const double ms = seconds * 1000.0;
  if (!std::isfinite(seconds) || ms > kMaxMs || ms < -kMaxMs) {
    throw InvalidArgument(std::string(what) + " must be a finite number of seconds within +-9e15, got " +
                          std::string(py::repr(py::float_(seconds))));
  }
  return static_cast<std::int64_t>(std::llround(ms));
}

std::string request_id_arg(py::handle request_id, const char* empty_message) {
  if (request_id.is_none()) return {};
  std::string rid = text_arg(request_id, "request_id");
  if (rid.empty()) throw InvalidArgument(empty_message);
  return rid;
}

std::vector<std::string> text_list_arg(const py::iterable& items, const char* what) {
  std::vector<std::string> out;
  for (py::handle item : items) out.push_back(text_arg(item, what));
  return out;
}

std::string command_arg(py::handle obj) {
  if (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr())) return std::string(py::str(obj));
  if (PyFloat_Check(obj.ptr())) return std::string(py::repr(obj));
  return text_arg(obj, "command argument");
}

Command command_from(const py::tuple& args, const char* empty_message) {
  Command cmd;
  for (py::handle a : args) cmd.args.push_back(command_arg(a));
  if (cmd.args.empty()) throw InvalidArgument(empty_message);
  return cmd;
}

std::vector<Request> commands_from(const std::vector<py::tuple>& commands) {
  std::vector<Request> batch;
  for (const auto& t : commands) batch.emplace_back(command_from(t, "execute_many() got an empty command"));
  return batch;
}

std::vector<ShardedIncrement> increments_arg(const py::iterable& items) {
  std::vector<ShardedIncrement> out;
  for (py::handle item : items) {
    if (!py::isinstance<py::tuple>(item)) {
      throw py::type_error("incr_many takes (name, amount) or (name, amount, request_id) tuples");
    }
    py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 2 && t.size() != 3) {
      throw InvalidArgument("incr_many takes (name, amount) or (name, amount, request_id) tuples, got one of " +
                            std::to_string(t.size()) + " items");
    }
    ShardedIncrement inc;
    inc.name = text_arg(t[0], "name");
    inc.amount = int_arg(t[1], "amount");
    if (t.size() == 3) {
      inc.request_id = request_id_arg(t[2], "request_id must not be empty (pass None for no request id)");
    }
    out.push_back(std::move(inc));
  }
  return out;
}

std::vector<PNComponent> components_arg(py::handle obj) {
  if (!py::isinstance<py::dict>(obj)) {
    throw py::type_error("components must be a dict {region: (p, n)}, got " +
                         std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  }
  std::vector<PNComponent> out;
  for (auto [k, v] : py::reinterpret_borrow<py::dict>(obj)) {
    PNComponent c;
    c.region = text_arg(k, "region");
    if (!py::isinstance<py::tuple>(v) || py::len(v) != 2) {
      throw InvalidArgument("components['" + c.region + "'] must be a tuple (p, n)");
    }
    auto t = py::reinterpret_borrow<py::tuple>(v);
    c.p = int_arg(t[0], "p");
    c.n = int_arg(t[1], "n");
    out.push_back(std::move(c));
  }
  return out;
}

// ------------------------------------------------------------------------------- results

py::object to_python(const Reply& r) {
  switch (r.type) {
    case Reply::Type::Nil:
      return py::none();
    case Reply::Type::Integer:
      return py::int_(r.integer);
    case Reply::Type::String:
      return py::bytes(r.str);
    case Reply::Type::Status:
      return py::str(r.str);
    case Reply::Type::Error:
      r.check();  // throws the matching ReplyError
      return py::none();
    case Reply::Type::Array: {
      py::list out;
      for (const auto& e : r.elements) out.append(to_python(e));
      return out;
    }
  }
  return py::none();
}

py::list replies_to_python(const std::vector<Reply>& replies) {
  py::list out;
  for (const auto& r : replies) out.append(r.is_error() ? py::object(py::str(r.str)) : to_python(r));
  return out;
}

py::object keyed_values(const std::vector<std::int64_t>& values, py::handle keys) {
  py::dict out;
  py::list ks = py::reinterpret_borrow<py::list>(keys);
  for (std::size_t i = 0; i < values.size(); ++i) out[ks[i]] = values[i];
  return out;
}

py::str key_text(const std::string& key) {
  PyObject* s = PyUnicode_DecodeUTF8(key.data(), static_cast<Py_ssize_t>(key.size()), "surrogateescape");
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

py::dict components_dict(const std::vector<PNComponent>& cs) {
  py::dict out;
  for (const PNComponent& c : cs) out[py::str(c.region)] = py::make_tuple(c.p, c.n);
  return out;
}

}  // namespace redcount::bind
