// tpushim.Event (a tpushim::Event) and tpushim.CallerEvent. The
// asyncio and concurrent.futures conveniences (__await__, result,
// exception) are added in tpushim/_events.py.

#include "python/src/events.h"

#include <Python.h>

#include <optional>
#include <string>
#include <utility>

#include "python/src/common.h"

namespace tpushim_py {

py::object WrapEvent(tpushim::Event event,
                     std::vector<std::shared_ptr<KeepAlive>> holds) {
  DropReady(holds);
  return py::cast(PyEvent{std::move(event), std::move(holds)});
}

void RegisterEvents(py::module_& m) {
  py::class_<PyEvent>(m, "Event", R"doc(
The completion of one operation (a transfer, a deallocation).

wait(timeout=None) -> bool   True once done, False on timeout; raises the
                             operation's error if it failed.
done() -> bool               Whether it has completed (successfully or not).
add_done_callback(fn)        fn(event) runs once done, on the module's
                             dispatcher thread with the GIL.
result(timeout=None), exception(timeout=None), await event: see tpushim.
)doc")
      .def("done",
           [](PyEvent& e) {
             if (!e.event.IsReady()) return false;
             DropReady(e.holds);
             return true;
           })
      .def(
          "wait",
          [](PyEvent& e, std::optional<double> timeout) {
            std::optional<absl::Status> status =
                WaitInterruptibly(e.event, timeout);
            if (!status.has_value()) return false;
            DropReady(e.holds);
            ThrowIfError(*status);
            return true;
          },
          py::arg("timeout") = py::none())
      .def(
          "_wait_status",
          [](PyEvent& e, std::optional<double> timeout) -> py::object {
            // None on timeout, else None for OK or the error object.
            std::optional<absl::Status> status =
                WaitInterruptibly(e.event, timeout);
            if (!status.has_value()) return py::make_tuple(false, py::none());
            DropReady(e.holds);
            if (status->ok()) return py::make_tuple(true, py::none());
            return py::make_tuple(true, ErrorObject(*status));
          },
          py::arg("timeout") = py::none())
      .def(
          "add_done_callback",
          [](py::object self, py::object fn) {
            if (!PyCallable_Check(fn.ptr())) {
              throw py::type_error(
                  "add_done_callback: fn must be callable, got " +
                  std::string(py::str(py::type::of(fn).attr("__name__"))));
            }
            PyObject* fn_ref = fn.release().ptr();
            PyObject* self_ref = self.ptr();
            Py_INCREF(self_ref);
            const PyEvent& event = self.cast<const PyEvent&>();
            event.event.AddCallback([fn_ref, self_ref](absl::Status) {
              PostCallback(fn_ref, self_ref);
            });
          },
          py::arg("fn"),
          "Calls fn(event) once the event is done (soon, if it is already), "
          "on the module's dispatcher thread with the GIL. An exception fn "
          "raises goes to sys.unraisablehook.")
      .def("__repr__", [](const PyEvent& e) {
        if (!e.event.IsReady()) return std::string("<tpushim.Event pending>");
        absl::Status status = e.event.Await();
        return status.ok()
                   ? std::string("<tpushim.Event done>")
                   : "<tpushim.Event failed: " + status.ToString() + ">";
      });

  py::class_<PyCallerEvent>(m, "CallerEvent", R"doc(
An event the program sets itself (System.create_event()): usable wherever
an Event is (its .event), set once with set() or set(error). Dropped
unset, its event fails with tpushim.CancelledError.
)doc")
      .def_property_readonly(
          "event",
          [](const PyCallerEvent& e) { return WrapEvent(e.caller->event()); })
      .def(
          "set",
          [](PyCallerEvent& e, py::object error) {
            absl::Status status =
                error.is_none() ? absl::OkStatus() : StatusOfError(error);
            ThrowIfError(e.caller->Set(std::move(status)));
          },
          py::arg("error") = py::none(),
          "Completes the event: OK, or failed with `error` (a "
          "tpushim.Error; its code and message). A second set() is "
          "tpushim.FailedPreconditionError.");
}

}  // namespace tpushim_py
