// Shared pieces of the extension module tpushim._tpushim: the System as
// Python holds it (Runtime), status → exception, the completion queue
// and the per-file registration functions module.cc calls.
//
// The extension is thin: it converts Python values, releases the GIL
// around every call that may block, and calls the C++ API
// (include/tpushim/). Behaviour lives in C++; conveniences live in the
// pure-Python modules beside it (python/tpushim/).
//
// Thread-safety: Runtime is thread-safe; everything else is used with the
// GIL held unless a comment says otherwise.

#ifndef TPUSHIM_PYTHON_SRC_COMMON_H_
#define TPUSHIM_PYTHON_SRC_COMMON_H_

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tpushim/system.h"

namespace tpushim_py {

namespace py = pybind11;

// Raises the tpushim.Error subclass for `status`'s code (tpushim/_errors.py)
// with its message. REQUIRES: !status.ok(); the GIL held.
[[noreturn]] void ThrowStatus(const absl::Status& status);
// The exception object ThrowStatus raises, not raised.
py::object ErrorObject(const absl::Status& status);
// The status a tpushim.Error (or any exception: UNKNOWN) stands for.
absl::Status StatusOfError(const py::handle& error);
inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) ThrowStatus(status);
}
template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) ThrowStatus(value.status());
  return *std::move(value);
}

// One tpushim::System as the Python objects made from it hold it.
//
// close() drops the Runtime's own reference and makes every later use a
// ValueError ("... System is closed"); the C++ System is destroyed when
// the last reference goes: at once, unless a pinned array from it still
// lives or a call is running (they hold references, so their memory stays
// valid and no call races the destruction).
class Runtime {
 public:
  explicit Runtime(std::unique_ptr<tpushim::System> system)
      : system_(std::move(system)) {}

  // The System for one call; ValueError naming `what` when closed.
  std::shared_ptr<tpushim::System> Use(const char* what) const;
  // Null once closed.
  std::shared_ptr<tpushim::System> Peek() const;
  bool closed() const;
  // Returns the reference it held (the caller drops it without the GIL).
  std::shared_ptr<tpushim::System> Close();

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<tpushim::System> system_
      ABSL_GUARDED_BY(mu_);  // null once closed
};

// Releases the GIL for its scope, like py::gil_scoped_release, but its
// destructor may throw: a thread that takes the GIL back while the
// interpreter finalizes is ended by pthread_exit, whose unwinding must
// pass through here (gil_scoped_release's noexcept destructor would turn
// it into std::terminate: a crash at exit with a wait in a daemon thread).
// Only code that does not throw may run in its scope.
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;
  ~GilRelease() noexcept(false) { PyEval_RestoreThread(state_); }

 private:
  PyThreadState* state_;
};

// Waits for `event` in slices of at most kWaitSlice with the GIL released,
// checking for signals between slices (Ctrl-C raises KeyboardInterrupt
// within a slice). `timeout` in seconds (nullopt: no limit). Returns the
// event's status, or nullopt on timeout. REQUIRES: the GIL held.
inline constexpr absl::Duration kWaitSlice = absl::Milliseconds(50);
std::optional<absl::Status> WaitInterruptibly(const tpushim::Event& event,
                                              std::optional<double> timeout);

// The completion queue (completions.cc): C++ callbacks post Python work
// to it without the GIL; the module's dispatcher thread
// (tpushim/_events.py) runs it with the GIL.
//   PostCallback: calls fn(arg) on the dispatcher thread, then drops both.
//   PostRelease: drops `object` on the dispatcher thread (or whoever next
//                drains the queue with the GIL).
// Both steal a reference; safe to call without the GIL.
void PostCallback(PyObject* fn, PyObject* arg);
void PostRelease(PyObject* object);

// Keeps a Python object alive until an event is ready (the host array a
// transfer reads or writes) without waking the dispatcher thread in the
// common case: whoever holds the KeepAlive — the DeviceArray, the Events
// made from it, a call's frame — drops the reference on its own thread
// when it sees the event ready (DropIfReady; nothing runs on the event's
// completion for it). Only when the last holder goes while the event is
// still pending does the KeepAlive add an event callback that hands the
// reference to the dispatcher thread (PostRelease) once the event is
// ready. Either way it is dropped once, never before the event is ready.
//
// Held through std::shared_ptr; every member and the destructor REQUIRE
// the GIL (they may drop the reference).
class KeepAlive {
 public:
  // Null when `event` is already ready (nothing to keep). Takes a new
  // reference to `object`.
  static std::shared_ptr<KeepAlive> Until(const tpushim::Event& event,
                                          const py::handle& object);
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;
  // Drops the reference now if the event is ready; true once dropped.
  bool DropIfReady();
  // Drops it now if the event is ready, else leaves it to an event
  // callback (and so to the dispatcher thread).
  ~KeepAlive();

 private:
  KeepAlive(tpushim::Event event, PyObject* object)
      : event_(std::move(event)), object_(object) {}

  tpushim::Event event_;
  PyObject* object_;  // owned; null once dropped or handed over
};

// Drops the KeepAlives among `holds` whose events are ready and forgets
// them. REQUIRES: the GIL held.
void DropReady(std::vector<std::shared_ptr<KeepAlive>>& holds);

// tpushim::Event as Python sees it (events.cc). The Event shares `holds`
// (the references its transfer needs kept alive) and drops them when a
// wait or done() sees it ready.
py::object WrapEvent(tpushim::Event event,
                     std::vector<std::shared_ptr<KeepAlive>> holds = {});

void RegisterCompletions(py::module_& m);
void RegisterEvents(py::module_& m);
void RegisterSystem(py::module_& m);
void RegisterArrays(py::module_& m);

}  // namespace tpushim_py

#endif  // TPUSHIM_PYTHON_SRC_COMMON_H_
