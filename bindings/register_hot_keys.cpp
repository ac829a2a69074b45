// Hot keys and process metrics: redcount._core.HotKeys, HotKey, observe_hot_keys() and
// the operation counts behind redcount.metrics().
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "common.h"
#include "redcount/store/hot_keys.h"
#include "redcount/common/metrics.h"
#include "redcount/store/store.h"

namespace redcount::bind {

void register_hot_keys(py::module_& m) {
  py::class_<HotKey>(m, "HotKey", "One key of HotKeys.top(): its estimated count and error bound.")
      .def_property_readonly("key", [](const HotKey& k) { return key_text(k.key); })
      .def_readonly("count", &HotKey::count, "An upper bound of the key's true count.")
      .def_readonly("error", &HotKey::error, "The true count is in [count - error, count].")
      .def("__eq__", [](const HotKey& a, const HotKey& b) {
        return a.key == b.key && a.count == b.count && a.error == b.error;
      })
      .def("__repr__", [](const HotKey& k) {
        return "HotKey(key=" + std::string(py::repr(key_text(k.key))) + ", count=" + std::to_string(k.count) +
               ", error=" + std::to_string(k.error) + ")";
      });

  // Observations take no GIL release: each is a short critical section with no I/O, and
  // releasing and retaking the GIL would cost more than the step itself.
  py::class_<HotKeys, std::shared_ptr<HotKeys>>(m, "HotKeys", "A Space-Saving top-K of keys. Thread-safe.")
      .def(py::init<std::int64_t>(), py::arg("capacity") = 1000)
      .def(
          "observe",
          [](HotKeys& hk, py::handle key, std::int64_t n) { hk.observe(text_arg(key, "key"), n); },
          py::arg("key"), py::arg("n") = 1, "Count n occurrences of key.")
      .def("top", &HotKeys::top, py::arg("n") = 10, "Up to n keys by estimated count, descending.")
      .def("reset", &HotKeys::reset, "Forget every key and the total.")
      .def_property_readonly("total", &HotKeys::total, "The weight of every observation so far.")
      .def_property_readonly("capacity", &HotKeys::capacity)
      .def("__len__", &HotKeys::size);

  py::class_<HotKeysStore, Store, std::shared_ptr<HotKeysStore>>(
      m, "HotKeysStore", "A store whose requests' keys are observed by a HotKeys (see observe_hot_keys).")
      .def_property_readonly("hot_keys", &HotKeysStore::hot_keys)
      .def_property_readonly("inner", &HotKeysStore::inner, "The store the requests go to.")
      // What the wrapped store offers (a ResilientStore's breaker_state...) reads through.
      .def("__getattr__", [](const HotKeysStore& s, const std::string& name) -> py::object {
        if (name.size() >= 2 && name.compare(0, 2, "__") == 0) throw py::attribute_error(name);
        return py::cast(s.inner()).attr(name.c_str());
      });

  m.def(
      "observe_hot_keys",
      [](std::shared_ptr<Store> store, std::shared_ptr<HotKeys> hot_keys) -> std::shared_ptr<Store> {
        return observe_hot_keys(std::move(store), std::move(hot_keys));
      },
      py::arg("store"), py::arg("hot_keys"), "store, with every request's key observed by hot_keys.");

  m.def(
      "_metrics_counts",
      [] {
        const MetricsCounts c = metrics_counts();
        return py::make_tuple(c.writes_ok, c.writes_failed, c.reads, c.reads_failed, c.idempotent_writes,
                              c.idempotent_hits);
      },
      "(writes_ok, writes_failed, reads, reads_failed, idempotent_writes, idempotent_hits) so far.");
  m.def("_reset_metrics", &reset_metrics, "Zero the process's operation counts.");
}

}  // namespace redcount::bind
