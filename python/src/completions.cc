// The completion queue: how work the C++ runtime finishes reaches Python.
//
// Event callbacks run on the runtime's callback thread, which must never
// take the GIL (a Python thread waiting on the runtime with the GIL would
// deadlock it, and so would interpreter shutdown). They only post an item
// here; the module's dispatcher thread (tpushim/_events.py) takes the
// items with the GIL released and handles them with it: it runs the done
// callbacks and drops the references that kept arrays alive during
// transfers whose Python holders went before the transfer ended (a
// KeepAlive's holders drop it themselves otherwise, sparing a wake-up of
// this thread and a GIL hand-off on every transfer).
//
// fork(): the child gets a new, empty queue (_after_fork_in_child); the
// parent's items are left behind, unreachable (a few leaked references in
// the child, never a freed one).

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "python/src/common.h"

namespace tpushim_py {
namespace {

struct Item {
  PyObject* fn;   // null: only drop `arg`
  PyObject* arg;  // owned
};

class Queue {
 public:
  void Push(Item item) {
    absl::MutexLock lock(&mu_);
    items_.push_back(item);
  }
  // Waits up to `timeout` for items, then takes them all.
  std::vector<Item> Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto has_items = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !items_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&has_items), timeout);
    std::vector<Item> taken(items_.begin(), items_.end());
    items_.clear();
    return taken;
  }

 private:
  absl::Mutex mu_;
  std::deque<Item> items_ ABSL_GUARDED_BY(mu_);
};

// Never destroyed: C++ threads may post during interpreter shutdown.
std::atomic<Queue*> g_queue{new Queue};
// References handed to the dispatcher thread (PostRelease), for tests.
std::atomic<uint64_t> g_posted_releases{0};

}  // namespace

void PostCallback(PyObject* fn, PyObject* arg) {
  g_queue.load(std::memory_order_acquire)->Push(Item{fn, arg});
}

void PostRelease(PyObject* object) {
  g_posted_releases.fetch_add(1, std::memory_order_relaxed);
  g_queue.load(std::memory_order_acquire)->Push(Item{nullptr, object});
}

std::shared_ptr<KeepAlive> KeepAlive::Until(const tpushim::Event& event,
                                            const py::handle& object) {
  if (event.IsReady()) return nullptr;
  Py_INCREF(object.ptr());
  return std::shared_ptr<KeepAlive>(new KeepAlive(event, object.ptr()));
}

bool KeepAlive::DropIfReady() {
  if (object_ == nullptr) return true;
  if (!event_.IsReady()) return false;
  Py_DECREF(std::exchange(object_, nullptr));
  return true;
}

KeepAlive::~KeepAlive() {
  if (DropIfReady()) return;
  // The last holder went first: the event's callback (no GIL there) hands
  // the reference to the dispatcher thread once the event is ready (at
  // once, here, if it became ready since DropIfReady looked).
  PyObject* object = std::exchange(object_, nullptr);
  event_.AddCallback([object](absl::Status) { PostRelease(object); });
}

void DropReady(std::vector<std::shared_ptr<KeepAlive>>& holds) {
  std::erase_if(holds, [](const std::shared_ptr<KeepAlive>& hold) {
    return hold == nullptr || hold->DropIfReady();
  });
}

void RegisterCompletions(py::module_& m) {
  m.def(
      "_next_completions",
      [](std::optional<double> timeout) {
        const absl::Duration wait = timeout.has_value()
                                        ? absl::Seconds(*timeout)
                                        : absl::InfiniteDuration();
        std::vector<Item> items;
        {
          GilRelease release;
          items = g_queue.load(std::memory_order_acquire)->Take(wait);
        }
        py::list callbacks;
        for (const Item& item : items) {
          if (item.fn == nullptr) {
            Py_DECREF(item.arg);
            continue;
          }
          callbacks.append(
              py::make_tuple(py::reinterpret_steal<py::object>(item.fn),
                             py::reinterpret_steal<py::object>(item.arg)));
        }
        return callbacks;
      },
      py::arg("timeout") = py::none(),
      "Waits (GIL released) for completions; drops the references kept "
      "for finished transfers and returns the (fn, arg) callbacks to run.");
  m.def(
      "_posted_releases",
      []() { return g_posted_releases.load(std::memory_order_relaxed); },
      "How many kept-alive references were handed to the dispatcher thread "
      "to drop (their holders went before the transfer ended); for tests.");
  m.def(
      "_after_fork_in_child",
      []() { g_queue.store(new Queue, std::memory_order_release); },
      "A fork child starts with an empty completion queue.");
  m.def(
      "_write_unraisable",
      [](py::object error, py::object where) {
        // Reports an exception no caller can catch (a done callback that
        // raised) through sys.unraisablehook, as CPython does for __del__.
        PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(error.ptr()));
        Py_INCREF(type);
        PyObject* value = error.release().ptr();
        PyObject* traceback = PyException_GetTraceback(value);
        PyErr_Restore(type, value, traceback);
        PyErr_WriteUnraisable(where.ptr());
      },
      py::arg("error"), py::arg("where"));
}

}  // namespace tpushim_py
