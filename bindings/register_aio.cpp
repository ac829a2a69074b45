// What redcount.aio calls in redcount._core: the CompletionQueue class, the store-level
// async calls (execute_async, execute_many_async, ping_async) and the hooks redcount.aio
// installs at import. The runtime behind them is aio.{h,cpp}.
#include <pybind11/stl.h>

#include <memory>
#include <vector>

#include "aio.h"
#include "common.h"

namespace redcount::bind {

void register_aio(py::module_& m) {
  using aio::CompletionQueue;

  py::class_<CompletionQueue, std::shared_ptr<CompletionQueue>>(
      m, "CompletionQueue",
      "Finished asynchronous calls waiting for one event loop; redcount.aio makes one per loop. "
      "Thread-safe.")
      .def(py::init<py::handle>(), py::arg("loop"))
      .def_property_readonly("fd", &CompletionQueue::fd, "The fd to watch with loop.add_reader(fd, drain).")
      .def("drain", &CompletionQueue::drain, "Complete the futures of every finished call (on the loop's thread).")
      .def("close", &CompletionQueue::close,
           "Once the loop is closed: release what waits for it; later completions are dropped.")
      .def_property_readonly("closed", &CompletionQueue::closed)
      .def("use_call_soon_threadsafe", &CompletionQueue::use_call_soon_threadsafe,
           "For a loop without add_reader: the fd is watched by a thread that calls loop.call_soon_threadsafe(drain).")
      .def_property_readonly("uses_call_soon_threadsafe", &CompletionQueue::uses_call_soon_threadsafe)
      .def_property_readonly("signals", &CompletionQueue::signals,
                             "Wake-ups requested: eventfd writes.")
      .def_property_readonly("wakeups", &CompletionQueue::wakeups, "Drains that found finished calls.")
      .def_property_readonly("delivered", &CompletionQueue::delivered, "Calls completed through this queue.");

  m.def(
      "execute_async",
      [](std::shared_ptr<Store> store, py::args args) {
        std::vector<Request> batch;
        batch.emplace_back(command_from(args, "execute() needs a command name"));
        return aio::submit_async(std::move(store), std::make_shared<CommandsOp>(std::move(batch)),
                                 [](std::vector<Reply>& replies) { return to_python(replies.front()); });
      },
      py::arg("store"),
      "Store.execute() for asyncio: the reply, or a future of it (use redcount.aio.AsyncStore).");
  m.def(
      "execute_many_async",
      [](std::shared_ptr<Store> store, const std::vector<py::tuple>& commands) {
        return aio::submit_async(std::move(store), std::make_shared<CommandsOp>(commands_from(commands)),
                                 [](std::vector<Reply>& replies) { return replies_to_python(replies); });
      },
      py::arg("store"), py::arg("commands"),
      "Store.execute_many() for asyncio: the replies, or a future of them.");
  m.def(
      "ping_async",
      [](std::shared_ptr<Store> store) {
        std::vector<Request> batch;
        batch.emplace_back(Command{{"PING"}});
        return aio::submit_async(std::move(store), std::make_shared<CommandsOp>(std::move(batch)),
                                 [](std::vector<Reply>& replies) {
                                   replies.front().check();
                                   return py::bool_(true);
                                 });
      },
      py::arg("store"), "Store.ping() for asyncio: True, or a future of it.");

  m.def(
      "_aio_setup",
      [](py::handle future_type, py::handle queue_provider) { aio::setup(future_type, queue_provider); },
      py::arg("future_type"), py::arg("queue_provider"),
      "Called once by redcount.aio: the future class to make, and how to find the running loop's queue.");
  m.def(
      "_aio_cancel",
      [](py::handle future) { return aio::cancel(future); }, py::arg("future"),
      "Cancel the operation behind `future` (called by _OpFuture.cancel).");
}

}  // namespace redcount::bind
