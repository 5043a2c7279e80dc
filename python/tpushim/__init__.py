"""tpushim: the TPU host runtime shim, from Python.

    import numpy as np
    import tpushim

    with tpushim.System(premapped_buffer_size="1G",
                        device="sim://?devices=4") as system:
        host = tpushim.pinned_empty((1024, 1024), np.float32)  # in the region
        host[:] = 1
        dev = tpushim.device_put(host, device=0)   # zero-copy: no staging
        dev.ready.wait()
        back = np.asarray(dev)

What the package promises (docs/python.md has the whole API):

* Options: System(**options) takes the C++ OptionOverrides field names as
  keywords; sizes as ints or strings ("4G", "64M": 1024-based). Options
  not given come from LIBTPU_INIT_ARGS, the environment and the defaults,
  as for the C++ API. An unknown keyword is a TypeError naming it; a
  value of the wrong type a TypeError, a malformed one a ValueError; the
  runtime's own validation raises InvalidArgumentError, which is also a
  ValueError.
* The current System: the module functions (pinned_empty, register,
  device_put, device_get) take system=None, meaning the innermost System
  entered with `with` on any thread, else the only open one, else
  RuntimeError. System has the same methods.
* pinned_empty(shape, dtype) is a NumPy array over a buffer of the
  premapped region of exactly its nbytes; array.base (a PinnedBuffer)
  keeps the buffer alive. A zero-size one is an ordinary empty array.
* device_put(array, device=0, memory_kind="device") returns at once; its
  `ready` event says when the bytes are there, `host_released` when the
  host array may change. A non-contiguous (or non-native byte order)
  input is copied to a contiguous array first, as NumPy users expect.
  Device memory holds TPU's default tiled layout (`xla_shape`,
  `on_device_size` with the padding); the host memory kinds hold the
  dense row-major array. bfloat16: pass the bits as uint16 with
  dtype="bfloat16". A zero-size array has no memory and is ready at once.
* Events: wait(timeout) returns True once done, False on timeout, and
  raises the operation's error if it failed; result() / exception() as in
  concurrent.futures (TimeoutError); add_done_callback(fn) runs fn(event)
  on the package's dispatcher thread with the GIL (an exception goes to
  sys.unraisablehook); `await event` in asyncio. Blocking calls release
  the GIL and wait in slices of at most 50 ms, so Ctrl-C raises
  KeyboardInterrupt; the runtime stays usable.
* Errors: one tpushim.Error subclass per status code, with .code,
  .code_name, .message (libtpu's text) and .report (XLA's HBM report for
  device memory). Bad arguments are TypeError/ValueError and change
  nothing.
* Lifetimes: close() is idempotent; it cancels operations not started
  and lets started ones finish. Afterwards the System and its
  DeviceArrays raise ValueError; events stay valid; pinned arrays stay
  valid and keep the runtime (its region and chips) until the last of
  them goes. A transfer keeps the host array it reads or writes alive.
  Systems left open are closed at interpreter exit.
* fork(): in the child, calls on the parent's System raise
  FailedPreconditionError naming both processes; touching a pinned array
  inherited from the parent is SIGSEGV (the region is not inherited); a
  new System in the child works, with its own dispatcher thread.
"""

from . import _tpushim
from ._errors import *  # noqa: F401,F403 - the exception classes
from ._errors import __all__ as _error_names
from ._events import ensure_dispatcher as _ensure_dispatcher  # noqa: F401
from ._options import parse_size
from ._system import (Device, Memory, System, current_system, device_get,
                      device_put, pinned_empty, pinned_zeros, register)

Event = _tpushim.Event
CallerEvent = _tpushim.CallerEvent
DeviceArray = _tpushim.DeviceArray
Registration = _tpushim.Registration
PinnedBuffer = _tpushim.PinnedBuffer

__all__ = [
    "System", "Device", "Memory", "Event", "CallerEvent", "DeviceArray",
    "Registration", "PinnedBuffer", "current_system", "pinned_empty",
    "pinned_zeros", "register", "device_put", "device_get", "parse_size",
] + list(_error_names)
