// Multi-region PN-counters: redcount._core.PNCounter.
#include <pybind11/stl.h>

#include "aio.h"
#include "common.h"
#include "redcount/common/errors.h"
#include "redcount/crdt/pn_counter.h"

namespace redcount::bind {
namespace {

std::unique_ptr<PNCounter> make_pn(std::shared_ptr<Store> store, py::handle name, py::handle region,
                                   py::handle prefix) {
  PNCounterOptions o;
  o.name = text_arg(name, "name");
  o.region = text_arg(region, "region");
  o.prefix = text_arg(prefix, "prefix");
  return std::make_unique<PNCounter>(std::move(store), std::move(o));
}

std::int64_t amount_arg(py::handle amount) { return int_arg(amount, "amount"); }

}  // namespace

void register_pn(py::module_& m) {
  py::class_<PNCounter>(m, "PNCounter", "The C++ PN-counter; use redcount.PNCounter.")
      .def(py::init(&make_pn), py::arg("store"), py::arg("name"), py::arg("region"), py::arg("prefix"))
      .def(
          "incr",
          [](PNCounter& c, py::handle amount) {
            auto op = c.make_incr(amount_arg(amount));
            NetworkWait wait;
            return run(*c.store(), *op);
          },
          py::arg("amount") = 1, "Add amount (>= 1) to this region's P; returns the region's new P.")
      .def(
          "decr",
          [](PNCounter& c, py::handle amount) {
            auto op = c.make_decr(amount_arg(amount));
            NetworkWait wait;
            return run(*c.store(), *op);
          },
          py::arg("amount") = 1, "Add amount (>= 1) to this region's N; returns the region's new N.")
      .def(
          "value",
          [](PNCounter& c) {
            NetworkWait wait;
            return c.value();
          },
          "sum(P) - sum(N) over the regions known on this store.")
      .def(
          "components",
          [](PNCounter& c) {
            std::vector<PNComponent> cs;
            {
              NetworkWait wait;
              cs = c.components();
            }
            return components_dict(cs);
          },
          "{region: (p, n)} as stored here.")
      .def(
          "merge_components",
          [](PNCounter& c, py::handle components) {
            auto op = c.make_merge_components(components_arg(components));
            NetworkWait wait;
            return run(*c.store(), *op);
          },
          py::arg("components"), "Fold {region: (p, n)} in (per-field maximum); returns the fields raised.")
      .def(
          "merge",
          [](PNCounter& c, std::shared_ptr<Store> other) {
            if (!other) throw InvalidArgument("other must be a Store");
            NetworkWait wait;
            return c.merge(*other);
          },
          py::arg("other"), "Merge this counter's components from another store here.")
      .def_property_readonly("p_key", &PNCounter::p_key)
      .def_property_readonly("n_key", &PNCounter::n_key)
      .def_property_readonly("name", [](const PNCounter& c) { return c.options().name; })
      .def_property_readonly("region", [](const PNCounter& c) { return c.options().region; })
      .def_property_readonly("prefix", [](const PNCounter& c) { return c.options().prefix; })
      .def_property_readonly("store", [](const PNCounter& c) { return c.store(); })
      .def(
          "incr_async",
          [](PNCounter& c, py::handle amount) {
            return aio::submit_async(c.store(), c.make_incr(amount_arg(amount)), [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("amount") = 1)
      .def(
          "decr_async",
          [](PNCounter& c, py::handle amount) {
            return aio::submit_async(c.store(), c.make_decr(amount_arg(amount)), [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("amount") = 1)
      .def("value_async",
           [](PNCounter& c) {
             return aio::submit_async(c.store(), c.make_value(), [](std::int64_t& n) { return py::int_(n); });
           })
      .def("components_async",
           [](PNCounter& c) {
             return aio::submit_async(c.store(), c.make_components(),
                                      [](std::vector<PNComponent>& cs) -> py::object { return components_dict(cs); });
           })
      .def(
          "merge_components_async",
          [](PNCounter& c, py::handle components) {
            return aio::submit_async(c.store(), c.make_merge_components(components_arg(components)),
                                     [](std::int64_t& n) { return py::int_(n); });
          },
          py::arg("components"));
}

}  // namespace redcount::bind
