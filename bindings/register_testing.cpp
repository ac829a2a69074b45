// redcount._core._testing: what only the tests use, built with -DREDCOUNT_TEST_HOOKS=ON
// (tests/run_all.sh turns it on; a wheel never does).
//
//   from redcount._core import _testing
//   store = _testing.DeferredStore(redcount.connect())   # completes on a worker thread
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "aio.h"
#include "common.h"
#include "redcount/common/errors.h"
#include "redcount/redis/redis_store.h"
#include "redcount/store/resilient_store.h"
#include "redcount/store/operation.h"
#include "redcount/store/store.h"

namespace redcount::bind {
namespace {

// Runs another store's batches on one worker thread, in order, and completes them there, as
// the Redis store's I/O thread does: so that the completion queue, the wake-ups and
// cancellation are tested on any store, the memory store included, with the timing in the
// test's hands (hold() stops the worker between batches). Thread-safe.
class DeferredStore final : public Store {
 public:
  explicit DeferredStore(std::shared_ptr<Store> inner) : state_(std::make_shared<State>()) {
    if (!inner) throw InvalidArgument("store must not be None");
    state_->inner = std::move(inner);
    worker_ = std::thread([s = state_] { run(*s); });
  }
  ~DeferredStore() override { stop(); }

  std::vector<Reply> execute(const std::vector<Request>& batch) override { return state_->inner->execute(batch); }
  void submit(std::vector<Request> batch, BatchDone done, CancelFlag cancelled) override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->stopping) {
        state_->jobs.push_back(Job{std::move(batch), std::move(done), std::move(cancelled)});
        if (!state_->held) state_->cv.notify_all();  // a held worker is woken by resume()
        return;
      }
    }
    done({}, std::make_exception_ptr(ConnectionError("the store is closed")));
  }
  std::int64_t now_ms() const override { return state_->inner->now_ms(); }
  std::string describe() const override { return state_->inner->describe(); }
  bool is_memory() const noexcept override { return false; }
  void close() override {
    stop();
    state_->inner->close();
  }

  void hold(bool on) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->held = on;
    state_->cv.notify_all();
  }
  // Waits (GIL released by the caller) until every submitted batch has completed.
  void wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (state_->held && !state_->jobs.empty()) throw InvalidArgument("wait_idle() while held: call resume() first");
    if (!state_->cv.wait_for(lock, timeout, [&] { return state_->jobs.empty() && !state_->busy; })) {
      throw TimeoutError("the deferred store's worker did not finish in time");
    }
  }
  std::size_t queued() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->jobs.size();
  }
  std::size_t executed() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->executed;
  }
  std::size_t dropped() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->dropped;
  }

 private:
  struct Job {
    std::vector<Request> batch;
    BatchDone done;
    CancelFlag cancelled;
  };
  // Shared with the worker, which never touches the DeferredStore itself: the last
  // reference to the store may be dropped by a completion on the worker thread.
  struct State {
    std::shared_ptr<Store> inner;
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;
    bool held = false;
    bool stopping = false;
    bool busy = false;
    std::size_t executed = 0;
    std::size_t dropped = 0;
  };

  static void run(State& s) {
    for (;;) {
      Job job;
      bool closing = false;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.cv.wait(lock, [&] { return s.stopping || (!s.held && !s.jobs.empty()); });
        if (s.jobs.empty()) return;  // stopping, nothing left
        closing = s.stopping;
        job = std::move(s.jobs.front());
        s.jobs.pop_front();
        s.busy = true;
      }
      if (closing) {
        job.done({}, std::make_exception_ptr(ConnectionError("the store was closed before the batch was sent")));
      } else if (job.cancelled && job.cancelled->load()) {
        {
          std::lock_guard<std::mutex> lock(s.mu);
          ++s.dropped;
        }
        job.done({}, std::make_exception_ptr(Cancelled("cancelled before it was sent")));
      } else {
        std::vector<Reply> replies;
        std::exception_ptr error;
        try {
          replies = s.inner->execute(job.batch);
        } catch (...) {
          error = std::current_exception();
        }
        {
          std::lock_guard<std::mutex> lock(s.mu);
          ++s.executed;
        }
        job.done(std::move(replies), error);
      }
      job = Job{};  // drop the callbacks before saying the batch is done
      std::lock_guard<std::mutex> lock(s.mu);
      s.busy = false;
      s.cv.notify_all();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stopping = true;
      state_->held = false;
      state_->cv.notify_all();
    }
    if (!worker_.joinable()) return;
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();  // dropped by its own completion; the worker exits on its own
    } else if (aio::gil_held_and_alive()) {
      NetworkWait wait;  // the worker may be waiting for the GIL to wake a loop
      worker_.join();
    } else {
      worker_.join();
    }
  }

  std::shared_ptr<State> state_;
  std::thread worker_;
};

}  // namespace

void register_testing(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "Test support; built only with -DREDCOUNT_TEST_HOOKS=ON.");
  // So that `import redcount._core._testing` finds it too (an extension module is no package).
  py::module_::import("sys").attr("modules")[py::str(t.attr("__name__"))] = t;

  py::class_<DeferredStore, Store, std::shared_ptr<DeferredStore>>(
      t, "DeferredStore",
      "Runs another store's batches on a worker thread, as the Redis store's I/O thread does, so "
      "that async completion can be tested on any store. Thread-safe.")
      .def(py::init<std::shared_ptr<Store>>(), py::arg("store"))
      .def("hold", [](DeferredStore& s) { s.hold(true); }, "Stop the worker before its next batch.")
      .def("resume", [](DeferredStore& s) { s.hold(false); }, "Let the worker go on.")
      .def(
          "wait_idle",
          [](DeferredStore& s, double timeout) {
            const std::chrono::milliseconds ms(static_cast<std::int64_t>(timeout * 1000));
            NetworkWait wait;  // the worker may need the GIL to wake a loop
            s.wait_idle(ms);
          },
          py::arg("timeout") = 10.0, "Wait until every submitted batch has completed.")
      .def_property_readonly("queued", &DeferredStore::queued, "Batches waiting for the worker.")
      .def_property_readonly("executed", &DeferredStore::executed, "Batches run on the inner store.")
      .def_property_readonly("dropped", &DeferredStore::dropped, "Batches dropped as cancelled before sending.");

  // The Sentinel store under `store` (a ResilientStore's primary included); InvalidArgument otherwise.
  const auto sentinel_store = [](std::shared_ptr<Store> store) -> std::shared_ptr<const RedisStore> {
    if (auto* r = dynamic_cast<ResilientStore*>(store.get())) store = r->primary();
    auto redis = std::dynamic_pointer_cast<const RedisStore>(store);
    if (redis == nullptr || !redis->is_sentinel()) throw InvalidArgument("not a redis+sentinel:// store");
    return redis;
  };
  t.def(
      "sentinel_state",
      [sentinel_store](const std::shared_ptr<Store>& store) -> py::tuple {
        const auto redis = sentinel_store(store);
        return py::make_tuple(redis->sentinel_master(), redis->sentinel_switches());
      },
      py::arg("store"),
      "(master 'host:port' calls go to now, or '' before the first call; master switches seen) of a Sentinel "
      "store.");
  t.def(
      "sentinel_holds",
      [sentinel_store](const std::shared_ptr<Store>& store) -> py::tuple {
        const auto h = sentinel_store(store)->sentinel_holds();
        return py::make_tuple(h[0], h[1], h[2]);
      },
      py::arg("store"),
      "(failover holds begun; switches to a promoted replica before any sentinel announced it; holds ended by "
      "Sentinel aborting the failover) of a Sentinel store.");
  t.def("inflight", &aio::inflight_count, "Futures still waiting for an operation (none may be left behind).");
  t.def(
      "echo_async",
      [](std::shared_ptr<Store> store, py::object value) {
        std::vector<Request> batch;
        batch.emplace_back(Command{{"PING"}});
        return aio::submit_async(
            std::move(store), std::make_shared<CommandsOp>(std::move(batch)),
            [](std::vector<Reply>&, py::handle context) { return py::reinterpret_borrow<py::object>(context); },
            std::move(value));
      },
      py::arg("store"), py::arg("value"), "A PING whose result is `value`, handed through submit_async's context.");
}

}  // namespace redcount::bind
