// absl::Status → the tpushim.Error subclass of its code, and the
// interruptible wait every blocking call uses.

#include <Python.h>

#include <string>

#include "python/src/common.h"

namespace tpushim_py {

py::object ErrorObject(const absl::Status& status) {
  // tpushim/_errors.py picks the class (one per code) and splits XLA's
  // memory report off the message.
  py::object from_status =
      py::module_::import("tpushim._errors").attr("_from_status");
  return from_status(static_cast<int>(status.code()),
                     std::string(status.message()));
}

void ThrowStatus(const absl::Status& status) {
  py::object error = ErrorObject(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())),
                  error.ptr());
  throw py::error_already_set();
}

std::optional<absl::Status> WaitInterruptibly(const tpushim::Event& event,
                                              std::optional<double> timeout) {
  if (timeout.has_value() && !(*timeout >= 0)) {
    throw py::value_error(
        "timeout=" + py::repr(py::float_(*timeout)).cast<std::string>() +
        ": must be >= 0 seconds, or None to wait for good");
  }
  if (event.IsReady()) return event.Await();
  const absl::Time deadline = timeout.has_value()
                                  ? absl::Now() + absl::Seconds(*timeout)
                                  : absl::InfiniteFuture();
  while (true) {
    const absl::Duration slice = std::min(
        kWaitSlice, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    std::optional<absl::Status> status;
    {
      GilRelease release;
      status = event.AwaitWithTimeout(slice);
    }
    if (status.has_value()) return status;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (absl::Now() >= deadline) return std::nullopt;
  }
}

std::shared_ptr<tpushim::System> Runtime::Use(const char* what) const {
  std::shared_ptr<tpushim::System> system = Peek();
  if (system == nullptr) {
    throw py::value_error(std::string(what) +
                          ": the tpushim.System it belongs to is closed");
  }
  return system;
}

std::shared_ptr<tpushim::System> Runtime::Peek() const {
  absl::MutexLock lock(&mu_);
  return system_;
}

bool Runtime::closed() const { return Peek() == nullptr; }

std::shared_ptr<tpushim::System> Runtime::Close() {
  absl::MutexLock lock(&mu_);
  return std::move(system_);
}

}  // namespace tpushim_py

namespace tpushim_py {

absl::Status StatusOfError(const py::handle& error) {
  int code = static_cast<int>(absl::StatusCode::kUnknown);
  if (py::hasattr(error, "code")) {
    py::object value = error.attr("code");
    if (py::isinstance<py::int_>(value)) code = value.cast<int>();
  }
  if (code <= 0 ||
      code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<int>(absl::StatusCode::kUnknown);
  }
  std::string message = py::str(error).cast<std::string>();
  if (py::hasattr(error, "message")) {
    message = py::str(error.attr("message")).cast<std::string>();
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

}  // namespace tpushim_py
