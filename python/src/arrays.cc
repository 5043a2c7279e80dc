// NumPy arrays and the runtime's memory: pinned arrays over buffers of the
// premapped region (_System._pinned_empty), registered host memory
// (_System.register), device arrays (_System.device_put, DeviceArray,
// device_get) and byte-range transfers (DeviceArray.write / read).
//
// Lifetimes: an ndarray from _pinned_empty has a PinnedBuffer as its base,
// which holds the region's buffer and the System; a transfer keeps the
// host array it reads or writes alive until its event is ready
// (a KeepAlive, held by the DeviceArray, the Events made from it and the
// call's frame, dropped on the caller's thread when it sees the transfer
// done); a DeviceArray holds its Runtime and fails with ValueError once
// its System is closed.

#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "python/src/common.h"
#include "python/src/events.h"
#include "python/src/system.h"
#include "tpushim/memory.h"

namespace tpushim_py {
namespace {

std::string Str(const py::handle& value) {
  return py::str(value).cast<std::string>();
}

// A buffer of the premapped region, the base of a pinned ndarray.
struct PinnedBuffer {
  std::shared_ptr<tpushim::System> system;  // outlives `buffer`
  tpushim::PinnedHostBuffer buffer;
};

struct PyRegistration {
  py::object array;  // outlives `registration`
  tpushim::HostRegistration registration;
};

struct PyDeviceArray {
  std::shared_ptr<Runtime> runtime;
  tpushim::MemoryBuffer buffer;  // invalid when zero-size
  std::vector<py::ssize_t> shape;
  py::dtype dtype;
  std::string element;  // XLA's element type, "f32"
  int device = 0;
  std::string memory_kind;
  std::string xla_shape;
  uint64_t on_device_size = 0;
  uint64_t nbytes = 0;
  tpushim::Event ready;
  tpushim::Event host_released;
  // The host arrays its transfers still use (device_put's source, write's
  // src, read's out), kept alive until each transfer lets go of them.
  std::vector<std::shared_ptr<KeepAlive>> holds;
  bool deleted = false;

  PyDeviceArray() = default;
  PyDeviceArray(const PyDeviceArray&) = delete;
  PyDeviceArray& operator=(const PyDeviceArray&) = delete;
  PyDeviceArray(PyDeviceArray&&) = default;
  ~PyDeviceArray() {
    if (deleted || !buffer.valid() || runtime == nullptr) return;
    std::shared_ptr<tpushim::System> system = runtime->Peek();
    // Freed once the transfers on it are done; nothing to report to.
    if (system != nullptr) system->Free(buffer).IgnoreError();
  }

  // Keeps `hold` (null: nothing to keep) with the others still pending.
  void Hold(std::shared_ptr<KeepAlive> hold) {
    DropReady(holds);
    if (hold != nullptr) holds.push_back(std::move(hold));
  }

  // The System, for `what`; ValueError when closed or deleted.
  std::shared_ptr<tpushim::System> Use(const char* what) const {
    if (deleted) {
      throw py::value_error(
          absl::StrCat(what, ": this DeviceArray was deleted"));
    }
    return runtime->Use(what);
  }
};

// XLA's element type of a host dtype. `as` may name "bfloat16", which
// NumPy lacks: the host array then holds its bits as uint16 (or void2).
std::string ElementOf(const py::dtype& dtype, const py::object& as,
                      const char* what) {
  const char kind = dtype.kind();
  const py::ssize_t size = dtype.itemsize();
  if (!as.is_none()) {
    const std::string name = Str(as);
    if (name != "bfloat16" && name != "bf16") {
      throw py::type_error(absl::StrCat(
          what, ": dtype='", name,
          "': only 'bfloat16' may be named by string (NumPy has no "
          "bfloat16; its bits travel as uint16)"));
    }
    if (!((kind == 'u' || kind == 'V') && size == 2)) {
      throw py::type_error(absl::StrCat(
          what,
          ": dtype='bfloat16' needs the bits in a uint16 (or void2) "
          "array, not ",
          Str(dtype)));
    }
    return "bf16";
  }
  switch (kind) {
    case 'b':
      if (size == 1) return "pred";
      break;
    case 'i':
    case 'u':
      if (size == 1 || size == 2 || size == 4 || size == 8) {
        return absl::StrCat(kind == 'i' ? "s" : "u", size * 8);
      }
      break;
    case 'f':
      if (size == 2 || size == 4 || size == 8)
        return absl::StrCat("f", size * 8);
      break;
    case 'c':
      if (size == 8 || size == 16) return absl::StrCat("c", size * 8);
      break;
    default:
      break;
  }
  throw py::type_error(absl::StrCat(
      what, ": dtype ", Str(dtype),
      " has no XLA element type; use bool, int8..int64, uint8..uint64, "
      "float16/32/64, complex64/128, or uint16 with dtype='bfloat16'"));
}

std::string Dims(const std::vector<py::ssize_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// The dense row-major layout host memories hold: {n-1,...,0}.
std::string DenseLayout(size_t rank) {
  if (rank == 0) return "";
  std::vector<size_t> minor_to_major;
  for (size_t i = rank; i-- > 0;) minor_to_major.push_back(i);
  return absl::StrCat("{", absl::StrJoin(minor_to_major, ","), "}");
}

std::vector<py::ssize_t> ShapeOf(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

// `array` as a NumPy array, C-contiguous and in native byte order (copied
// when it is not: device_put takes whatever np.asarray takes).
py::array Contiguous(const py::handle& array, const char* what) {
  py::object converted;
  if (py::isinstance<py::array>(array)) {
    converted = py::reinterpret_borrow<py::object>(array);
  } else {
    try {
      converted = py::module_::import("numpy").attr("asarray")(array);
    } catch (py::error_already_set& e) {
      throw py::type_error(absl::StrCat(
          what, ": expected a NumPy array (or what np.asarray takes), got ",
          Str(py::type::of(array).attr("__name__"))));
    }
  }
  py::array a = py::reinterpret_borrow<py::array>(converted);
  if (a.dtype().byteorder() == '>') {
    a = a.attr("astype")(a.dtype().attr("newbyteorder")("="));
  }
  if (!(a.flags() & py::array::c_style)) {
    a = py::module_::import("numpy").attr("ascontiguousarray")(a);
  }
  return a;
}

// An array the runtime writes into: used as given, never copied.
py::array Destination(const py::handle& out, const char* what) {
  if (!py::isinstance<py::array>(out)) {
    throw py::type_error(absl::StrCat(what, ": out must be a NumPy array, got ",
                                      Str(py::type::of(out).attr("__name__"))));
  }
  py::array a = py::reinterpret_borrow<py::array>(out);
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(
        absl::StrCat(what,
                     ": out must be C-contiguous (np.ascontiguousarray "
                     "makes one; the runtime writes through it)"));
  }
  if (!a.writeable()) {
    throw py::value_error(absl::StrCat(what, ": out is read-only"));
  }
  return a;
}

int DeviceIndex(const py::handle& device, const tpushim::System& system,
                const char* what) {
  py::object value = py::reinterpret_borrow<py::object>(device);
  if (!py::isinstance<py::int_>(value) && py::hasattr(value, "id")) {
    value = value.attr("id");  // a tpushim.Device
  }
  if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value)) {
    throw py::type_error(
        absl::StrCat(what, ": device must be an int or a tpushim.Device, got ",
                     Str(py::type::of(device).attr("__name__"))));
  }
  const long long index = value.cast<long long>();
  if (index < 0 || index >= system.device_count()) {
    throw py::value_error(absl::StrCat(what, ": device=", index,
                                       ": this System has devices 0..",
                                       system.device_count() - 1));
  }
  return static_cast<int>(index);
}

tpushim::MemoryKind KindOf(const std::string& kind, const char* what) {
  if (kind == "device") return tpushim::MemoryKind::kDevice;
  if (kind == "pinned_host") return tpushim::MemoryKind::kPinnedHost;
  if (kind == "unpinned_host") return tpushim::MemoryKind::kUnpinnedHost;
  throw py::value_error(absl::StrCat(
      what, ": memory_kind='", kind,
      "': accepted kinds are 'device', 'pinned_host', 'unpinned_host'"));
}

py::array PinnedEmpty(const PySystem& self,
                      const std::vector<py::ssize_t>& shape,
                      const py::dtype& dtype) {
  std::shared_ptr<tpushim::System> system = self.runtime->Use("pinned_empty");
  uint64_t nbytes = static_cast<uint64_t>(dtype.itemsize());
  for (py::ssize_t d : shape) {
    if (d < 0) {
      throw py::value_error(absl::StrCat("pinned_empty: shape ", Dims(shape),
                                         " has a negative dimension"));
    }
    nbytes *= static_cast<uint64_t>(d);
  }
  if (nbytes == 0) return py::array(dtype, shape);  // nothing to pin
  absl::StatusOr<tpushim::PinnedHostBuffer> buffer;
  {
    GilRelease release;
    buffer = system->AllocatePinnedHost(nbytes);
  }
  ThrowIfError(buffer.status());
  void* data = buffer->data();
  py::object owner = py::cast(PinnedBuffer{system, *std::move(buffer)});
  return py::array(dtype, shape, data, owner);
}

// Device memory to device memory (on one device or two): one device copy
// after `src` is ready, layout and all.
py::object CopyToDevice(tpushim::System& system, const PyDeviceArray& src,
                        int device, int memory) {
  PyDeviceArray dev;
  dev.runtime = src.runtime;
  dev.shape = src.shape;
  dev.dtype = src.dtype;
  dev.element = src.element;
  dev.device = device;
  dev.memory_kind = src.memory_kind;
  dev.xla_shape = src.xla_shape;
  dev.nbytes = src.nbytes;
  if (!src.buffer.valid()) return py::cast(std::move(dev));  // zero-size
  absl::StatusOr<tpushim::MemoryCopy> copy;
  {
    // Copied with the GIL held: another thread's write() assigns it so.
    tpushim::Event wait_for[] = {src.ready};
    GilRelease release;
    copy = system.CopyToMemory(src.buffer, memory, wait_for);
  }
  ThrowIfError(copy.status());
  dev.buffer = copy->buffer;
  dev.xla_shape = copy->buffer.shape();
  dev.on_device_size = copy->buffer.size();
  dev.ready = copy->event;
  dev.host_released = copy->event;
  return py::cast(std::move(dev));
}

py::array DeviceGet(PyDeviceArray& dev, const py::object& out_arg);

py::object DevicePut(const PySystem& self, const py::object& value,
                     const py::object& device_arg, const std::string& kind_name,
                     const py::object& as) {
  const char* what = "device_put";
  std::shared_ptr<tpushim::System> system = self.runtime->Use(what);
  py::object source = value;
  const int device = DeviceIndex(device_arg, *system, what);
  const tpushim::MemoryKind kind = KindOf(kind_name, what);
  if (py::isinstance<PyDeviceArray>(value)) {
    PyDeviceArray& other = value.cast<PyDeviceArray&>();
    if (other.runtime != self.runtime) {
      throw py::value_error(
          "device_put: this DeviceArray belongs to another tpushim.System; "
          "np.asarray() it first");
    }
    other.Use(what);
    if (kind == tpushim::MemoryKind::kDevice && other.memory_kind == "device") {
      return CopyToDevice(*system, other, device,
                          system->memory_of_kind(kind, device));
    }
    // Between a device's tiled layout and a host memory's dense array:
    // through the host.
    source = DeviceGet(other, py::none());
  }
  py::array array = Contiguous(source, what);

  PyDeviceArray dev;
  dev.runtime = self.runtime;
  dev.shape = ShapeOf(array);
  dev.dtype = array.dtype();
  dev.element = ElementOf(dev.dtype, as, what);
  dev.device = device;
  dev.memory_kind = kind_name;
  dev.nbytes = static_cast<uint64_t>(array.nbytes());
  const int memory = system->memory_of_kind(kind, device);
  const std::string shape = dev.element + Dims(dev.shape);

  if (kind == tpushim::MemoryKind::kDevice) {
    tpushim::DeviceBufferSpec spec{shape, "device_put", ""};
    if (dev.nbytes == 0) {
      // Nothing to hold or move; the shape still has its layout.
      dev.xla_shape = shape;
      return py::cast(std::move(dev));
    }
    absl::StatusOr<tpushim::MemoryBuffer> buffer;
    absl::StatusOr<tpushim::TransferEvents> events;
    const void* data = array.data();
    {
      GilRelease release;
      buffer = system->AllocateInMemory(memory, spec);
      if (buffer.ok()) {
        // The engine moves an array whose device image is the dense
        // array in place when it lies in pinned or registered memory.
        events = system->TransferArrayToDeviceWithEvents(
            data, buffer->device_buffer());
        if (!events.ok()) system->Free(*buffer).IgnoreError();
      }
    }
    ThrowIfError(buffer.status());
    ThrowIfError(events.status());
    dev.buffer = *buffer;
    dev.xla_shape = buffer->shape();
    dev.on_device_size = buffer->size();
    dev.ready = events->ready;
    dev.host_released = events->host_released;
    dev.Hold(KeepAlive::Until(dev.host_released, array));
    return py::cast(std::move(dev));
  }

  // Host memories hold the dense row-major array, as a host layout does.
  dev.xla_shape = shape + DenseLayout(dev.shape.size());
  dev.on_device_size = dev.nbytes;
  if (dev.nbytes == 0) return py::cast(std::move(dev));
  absl::StatusOr<tpushim::MemoryCopy> copy;
  const void* data = array.data();
  {
    GilRelease release;
    copy = system->CreateMemoryBuffer(
        data, dev.nbytes, memory,
        tpushim::HostBufferSemantics::kImmutableOnlyDuringCall);
  }
  ThrowIfError(copy.status());
  dev.buffer = copy->buffer;
  dev.ready = copy->event;
  dev.host_released = copy->event;
  return py::cast(std::move(dev));
}

py::array DeviceGet(PyDeviceArray& dev, const py::object& out_arg) {
  const char* what = "device_get";
  std::shared_ptr<tpushim::System> system = dev.Use(what);
  py::array out;
  if (out_arg.is_none()) {
    out = py::array(dev.dtype, dev.shape);
  } else {
    out = Destination(out_arg, what);
    if (!out.dtype().is(dev.dtype) &&
        !out.dtype().attr("__eq__")(dev.dtype).cast<bool>()) {
      throw py::value_error(absl::StrCat(what, ": out has dtype ",
                                         Str(out.dtype()), ", the DeviceArray ",
                                         Str(dev.dtype)));
    }
    if (ShapeOf(out) != dev.shape) {
      throw py::value_error(
          absl::StrCat(what, ": out has shape ", Dims(ShapeOf(out)),
                       ", the DeviceArray ", Dims(dev.shape)));
    }
  }
  if (dev.nbytes == 0) return out;
  void* data = out.mutable_data();
  if (dev.memory_kind == "device") {
    absl::StatusOr<tpushim::Event> done;
    {
      // Copied with the GIL held: another thread's write() assigns it so.
      tpushim::Event wait_for[] = {dev.ready};
      GilRelease release;
      done = system->TransferArrayFromDevice(dev.buffer.device_buffer(), data,
                                             wait_for);
    }
    ThrowIfError(done.status());
    // Interrupted, the transfer still writes into `out`: `hold` keeps it
    // alive (handed to the event's callback as the frame unwinds).
    std::shared_ptr<KeepAlive> hold = KeepAlive::Until(*done, out);
    ThrowIfError(*WaitInterruptibly(*done, std::nullopt));
    DropReady(dev.holds);  // the read waited for dev.ready
    return out;
  }
  // A copy: the wait releases the GIL, and another thread may assign it.
  const tpushim::Event ready = dev.ready;
  ThrowIfError(*WaitInterruptibly(ready, std::nullopt));
  DropReady(dev.holds);
  std::memcpy(data, dev.buffer.data(), dev.nbytes);
  return out;
}

}  // namespace

void RegisterArrays(py::module_& m) {
  py::class_<PinnedBuffer>(m, "PinnedBuffer", py::buffer_protocol(),
                           "A buffer of the premapped region: the base of a "
                           "pinned array, which keeps it alive.")
      .def_buffer([](PinnedBuffer& b) {
        return py::buffer_info(
            b.buffer.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
            {static_cast<py::ssize_t>(b.buffer.size())}, {1});
      })
      .def_property_readonly(
          "nbytes", [](const PinnedBuffer& b) { return b.buffer.size(); })
      .def_property_readonly("address", [](const PinnedBuffer& b) {
        return reinterpret_cast<uintptr_t>(b.buffer.data());
      });

  py::class_<PyRegistration>(m, "Registration", R"doc(
Host memory registered for DMA (tpushim.register(array)): transfers wholly
inside it are zero-copy. Keeps the array alive while registered. A context
manager: leaving it (or unregister()) waits for the transfers inside it,
then unregisters.
)doc")
      .def(
          "unregister",
          [](PyRegistration& r) {
            absl::Status status;
            {
              GilRelease release;
              status = r.registration.Unregister();
            }
            r.array = py::none();
            ThrowIfError(status);
          },
          "Waits for the transfers inside it, then unregisters. Idempotent.")
      .def_property_readonly("active",
                             [](const PyRegistration& r) {
                               return static_cast<bool>(r.registration);
                             })
      .def_property_readonly("array",
                             [](const PyRegistration& r) { return r.array; })
      .def_property_readonly(
          "nbytes",
          [](const PyRegistration& r) { return r.registration.size(); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyRegistration& r, py::args) {
        absl::Status status;
        {
          GilRelease release;
          status = r.registration.Unregister();
        }
        r.array = py::none();
        ThrowIfError(status);
        return false;
      });

  py::class_<PyDeviceArray>(m, "DeviceArray", R"doc(
An array in one memory of a System (device_put's result). np.asarray(it)
or device_get(it, out=) brings it back as a NumPy array.
)doc")
      .def_property_readonly("shape",
                             [](const PyDeviceArray& d) {
                               py::tuple t(d.shape.size());
                               for (size_t i = 0; i < d.shape.size(); ++i) {
                                 t[i] = d.shape[i];
                               }
                               return t;
                             })
      .def_property_readonly("dtype",
                             [](const PyDeviceArray& d) { return d.dtype; })
      .def_property_readonly(
          "ndim", [](const PyDeviceArray& d) { return d.shape.size(); })
      .def_property_readonly("size",
                             [](const PyDeviceArray& d) {
                               py::ssize_t n = 1;
                               for (py::ssize_t x : d.shape) n *= x;
                               return n;
                             })
      .def_property_readonly("device",
                             [](const PyDeviceArray& d) { return d.device; })
      .def_property_readonly(
          "memory_kind", [](const PyDeviceArray& d) { return d.memory_kind; })
      .def_property_readonly("element_type",
                             [](const PyDeviceArray& d) { return d.element; })
      .def_property_readonly("xla_shape",
                             [](const PyDeviceArray& d) { return d.xla_shape; })
      .def_property_readonly(
          "on_device_size",
          [](const PyDeviceArray& d) { return d.on_device_size; })
      .def_property_readonly("nbytes",
                             [](const PyDeviceArray& d) { return d.nbytes; })
      .def_property_readonly(
          "ready",
          [](const PyDeviceArray& d) { return WrapEvent(d.ready, d.holds); })
      .def_property_readonly("host_released",
                             [](const PyDeviceArray& d) {
                               return WrapEvent(d.host_released, d.holds);
                             })
      .def_property_readonly("deleted",
                             [](const PyDeviceArray& d) { return d.deleted; })
      .def(
          "block_until_ready",
          [](py::object self) {
            PyDeviceArray& d = self.cast<PyDeviceArray&>();
            d.Use("block_until_ready");
            // A copy: the wait releases the GIL, and another thread may
            // assign it.
            const tpushim::Event ready = d.ready;
            ThrowIfError(*WaitInterruptibly(ready, std::nullopt));
            DropReady(d.holds);
            return self;
          },
          "Waits until the array is in place; raises the transfer's error.")
      .def(
          "delete",
          [](PyDeviceArray& d) {
            if (d.deleted) return;
            std::shared_ptr<tpushim::System> system = d.runtime->Peek();
            d.deleted = true;
            if (system != nullptr && d.buffer.valid()) {
              absl::StatusOr<tpushim::Event> freed = system->Free(d.buffer);
              ThrowIfError(freed.status());
              ThrowIfError(*WaitInterruptibly(*freed, std::nullopt));
            }
            DropReady(d.holds);
          },
          "Frees the array's memory once the transfers on it are done, and "
          "waits for that; using it afterwards is a ValueError.")
      .def(
          "__array__",
          [](PyDeviceArray& d, py::object dtype, py::args, py::kwargs) {
            py::array out = DeviceGet(d, py::none());
            if (dtype.is_none()) return py::object(out);
            return out.attr("astype")(dtype);
          },
          py::arg("dtype") = py::none())
      .def(
          "write",
          [](PyDeviceArray& d, const py::object& src, uint64_t offset) {
            std::shared_ptr<tpushim::System> system = d.Use("write");
            if (d.memory_kind != "device") {
              throw py::value_error(
                  "write: byte-range transfers are for memory_kind='device'");
            }
            py::array array = Contiguous(src, "write");
            absl::StatusOr<tpushim::TransferEvents> events;
            {
              // Copied with the GIL held: another thread's write()
              // assigns it so.
              tpushim::Event wait_for[] = {d.ready};
              GilRelease release;
              events = system->TransferToDeviceWithEvents(
                  array.data(), d.buffer.device_buffer(), offset,
                  static_cast<uint64_t>(array.nbytes()), wait_for);
            }
            ThrowIfError(events.status());
            std::shared_ptr<KeepAlive> hold =
                KeepAlive::Until(events->host_released, array);
            d.Hold(hold);
            absl::StatusOr<tpushim::Event> ready =
                system->BufferReadyEvent(d.buffer.device_buffer());
            if (ready.ok()) d.ready = *ready;
            return WrapEvent(events->ready, {hold});
          },
          py::arg("src"), py::arg("offset") = 0,
          "Writes src's bytes at byte `offset` of the device's layout (no "
          "relayout); returns the transfer's Event. The array's ready event "
          "then covers this write too.")
      .def(
          "read",
          [](PyDeviceArray& d, const py::object& out_arg, uint64_t offset) {
            std::shared_ptr<tpushim::System> system = d.Use("read");
            if (d.memory_kind != "device") {
              throw py::value_error(
                  "read: byte-range transfers are for memory_kind='device'");
            }
            py::array out = Destination(out_arg, "read");
            absl::StatusOr<tpushim::Event> done;
            {
              // Copied with the GIL held: another thread's write()
              // assigns it so.
              tpushim::Event wait_for[] = {d.ready};
              GilRelease release;
              done = system->TransferFromDevice(
                  d.buffer.device_buffer(), offset, out.mutable_data(),
                  static_cast<uint64_t>(out.nbytes()), wait_for);
            }
            ThrowIfError(done.status());
            std::shared_ptr<KeepAlive> hold = KeepAlive::Until(*done, out);
            d.Hold(hold);
            return WrapEvent(*done, {hold});
          },
          py::arg("out"), py::arg("offset") = 0,
          "Reads out.nbytes bytes from byte `offset` of the device's layout "
          "into out (C-contiguous, writable); returns the transfer's Event.")
      .def("__len__",
           [](const PyDeviceArray& d) {
             if (d.shape.empty())
               throw py::type_error("len() of a 0-d DeviceArray");
             return d.shape[0];
           })
      .def("__repr__", [](const PyDeviceArray& d) {
        return absl::StrCat("DeviceArray(", d.xla_shape, ", device=", d.device,
                            ", memory_kind='", d.memory_kind, "'",
                            d.deleted ? ", deleted" : "", ")");
      });

  m.def(
      "_device_get",
      [](PyDeviceArray& d, const py::object& out) { return DeviceGet(d, out); },
      py::arg("array"), py::arg("out") = py::none());

  auto system_class =
      py::reinterpret_borrow<py::class_<PySystem>>(m.attr("_System"));
  system_class
      .def("_pinned_empty", &PinnedEmpty, py::arg("shape"), py::arg("dtype"))
      .def("_device_put", &DevicePut, py::arg("array"), py::arg("device"),
           py::arg("memory_kind"), py::arg("dtype"))
      .def(
          "_device_get",
          [](const PySystem& self, PyDeviceArray& d, const py::object& out) {
            if (d.runtime != self.runtime) {
              throw py::value_error(
                  "device_get: this DeviceArray belongs to another "
                  "tpushim.System");
            }
            return DeviceGet(d, out);
          },
          py::arg("array"), py::arg("out"))
      .def(
          "_register",
          [](const PySystem& self, const py::object& value) {
            std::shared_ptr<tpushim::System> system =
                self.runtime->Use("register");
            if (!py::isinstance<py::array>(value)) {
              throw py::type_error(
                  absl::StrCat("register: expected a NumPy array, got ",
                               py::str(py::type::of(value).attr("__name__"))
                                   .cast<std::string>()));
            }
            py::array array = py::reinterpret_borrow<py::array>(value);
            if (!(array.flags() & py::array::c_style)) {
              throw py::value_error(
                  "register: the array is not C-contiguous; only contiguous "
                  "memory can be registered (np.ascontiguousarray copies it)");
            }
            if (array.nbytes() == 0) {
              throw py::value_error("register: the array is empty (0 bytes)");
            }
            absl::StatusOr<tpushim::HostRegistration> registration;
            const void* data = array.data();
            const uint64_t size = static_cast<uint64_t>(array.nbytes());
            {
              GilRelease release;
              registration = system->RegisterHostMemory(data, size);
            }
            ThrowIfError(registration.status());
            return PyRegistration{value, *std::move(registration)};
          },
          py::arg("array"));
}

}  // namespace tpushim_py
