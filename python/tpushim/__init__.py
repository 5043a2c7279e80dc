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

docs/python.md has the whole API.
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
