"""tpushim.System and the module-level functions that use the current one."""

import atexit
import dataclasses
import threading
import weakref

import numpy as np

from . import _events, _options, _tpushim


@dataclasses.dataclass(frozen=True)
class Device:
    """One device of a System (id is what device_put's device= takes)."""
    id: int
    name: str
    kind: str  # the backend: "sim", "vfio-nvme"
    host_chip: int
    hbm_bytes: int
    dma_engines: int
    numa_node: object  # int or None
    link_gbps: float
    latency_us: float
    block_bytes: int


@dataclasses.dataclass(frozen=True)
class Memory:
    """One memory of a System, as PJRT names its kind: "device" (a device's
    HBM), "pinned_host" (the premapped region) or "unpinned_host"."""
    id: int
    kind: str
    description: str
    devices: tuple
    capacity_bytes: int


_lock = threading.Lock()
_entered = []  # Systems entered with `with`, innermost last (any thread)
_open = weakref.WeakSet()  # Systems not closed


class System(_tpushim._System):
    """The runtime: premapped region, devices, transfer engine.

    Keyword options are the C++ OptionOverrides field names
    (premapped_buffer_size=, device=, premap=, log_dir=, visible_chips=,
    run_dir=, ...); sizes are ints or strings such as "4G". Options not
    given come from LIBTPU_INIT_ARGS, the environment and the defaults, as
    for the C++ API. An unknown keyword is a TypeError; a malformed value a
    ValueError (tpushim.InvalidArgumentError when the runtime rejects it).

    A context manager: ``with tpushim.System(...) as s:`` makes s the
    current System of the module functions and closes it on exit.
    """

    def __init__(self, **options):
        super().__init__(_options.normalize(options))
        _events.ensure_dispatcher()
        with _lock:
            _open.add(self)

    def close(self):
        """Closes the runtime; idempotent. Operations not started are
        cancelled (their events fail with tpushim.CancelledError), started
        ones finish first. Using the System, or a DeviceArray from it,
        afterwards is a ValueError. Pinned arrays from it stay valid: the
        runtime itself (its region and chips) goes when the last of them
        does."""
        with _lock:
            _open.discard(self)
            while self in _entered:
                _entered.remove(self)
        super().close()

    def __enter__(self):
        with _lock:
            _entered.append(self)
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False

    def __repr__(self):
        if self.closed:
            return "<tpushim.System closed>"
        return "<tpushim.System %d device(s), premapped %d bytes>" % (
            len(self._devices()), self.premapped_buffer_size)

    @property
    def devices(self):
        return [Device(**d) for d in self._devices()]

    @property
    def memories(self):
        return [Memory(**dict(m, devices=tuple(m["devices"])))
                for m in self._memories()]

    def memory_of_kind(self, kind, device=0):
        """The Memory of `kind` (a device's HBM for "device")."""
        for m in self.memories:
            if m.kind == kind and (kind != "device" or device in m.devices):
                return m
        raise ValueError("memory kind %r (device %r): accepted kinds are "
                         "'device', 'pinned_host', 'unpinned_host'"
                         % (kind, device))

    def memory_stats(self, memory=None):
        """Statistics of one memory as a dict (PJRT's fields: bytes_in_use,
        peak_bytes_in_use, num_allocs, largest_alloc_size, bytes_limit,
        ...). `memory`: a Memory, its id, or a kind ("pinned_host"; "device"
        is device 0's HBM). None: a list with every memory's."""
        if memory is None:
            return [self._memory_stats(m.id) for m in self.memories]
        if isinstance(memory, Memory):
            memory = memory.id
        elif isinstance(memory, str):
            memory = self.memory_of_kind(memory).id
        elif isinstance(memory, bool) or not isinstance(memory, int):
            raise TypeError("memory_stats: memory=%r: expected a Memory, its "
                            "id or a kind string" % (memory,))
        return self._memory_stats(memory)

    def pinned_empty(self, shape, dtype=np.float32):
        """A NumPy array over a buffer of the premapped region of exactly
        its nbytes (uninitialized). The array keeps the buffer alive.
        dtype="bfloat16" gives a uint16 array (NumPy has no bfloat16)."""
        shape = _shape(shape, "pinned_empty")
        return self._pinned_empty(shape, _host_dtype(dtype, "pinned_empty"))

    def pinned_zeros(self, shape, dtype=np.float32):
        """pinned_empty, filled with zeros."""
        array = self.pinned_empty(shape, dtype)
        array.fill(0)
        return array

    def register(self, array):
        """Registers a C-contiguous array's memory for DMA (PJRT's DmaMap):
        transfers wholly inside it are zero-copy. Returns a Registration (a
        context manager; unregister() ends it). The array stays alive while
        registered. A non-contiguous array is a ValueError."""
        return self._register(array)

    def device_put(self, array, device=0, memory_kind="device", *,
                   dtype=None):
        """Puts a NumPy array (or anything np.asarray takes) into a memory:
        returns a DeviceArray at once, its `ready` event telling when the
        bytes are there. Non-contiguous arrays are copied to a contiguous
        one first. dtype="bfloat16" takes a uint16 array's bits as bf16.
        A DeviceArray of this System in device memory is copied to the
        device named by one device copy; to or from a host memory kind it
        goes through the host."""
        return self._device_put(array, device, memory_kind, dtype)

    def device_get(self, array, out=None):
        """The DeviceArray's values as a NumPy array (into `out` when given:
        C-contiguous, writable, of its dtype and shape). Waits."""
        return self._device_get(array, out)


@atexit.register
def _close_at_exit():
    # Systems still open when the interpreter exits are closed in order
    # (operations not started are cancelled, started ones finish), and the
    # done callbacks that this makes runnable still run.
    with _lock:
        systems = list(_entered) + list(_open)
    for system in reversed(systems):
        system.close()
    _events.run_pending()


def _shape(shape, what):
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        if isinstance(shape, (str, bytes)):
            raise TypeError
        dims = [int(d) for d in shape]
    except (TypeError, ValueError):
        raise TypeError("%s: shape=%r: expected an int or a tuple of ints"
                        % (what, shape)) from None
    for d in dims:
        if d < 0:
            raise ValueError("%s: shape=%r has a negative dimension"
                             % (what, tuple(shape)))
    return dims


def _host_dtype(dtype, what):
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return np.dtype(np.uint16)
    try:
        dt = np.dtype(dtype)
    except TypeError as error:
        raise TypeError("%s: dtype=%r: %s" % (what, dtype, error)) from None
    if dt.hasobject:
        raise TypeError("%s: dtype=%r holds Python objects; it cannot live in "
                        "pinned memory" % (what, dtype))
    return dt


def current_system(system=None):
    """`system` if given; else the innermost System entered with `with` (on
    any thread); else the only open System; else RuntimeError."""
    if system is not None:
        if not isinstance(system, System):
            raise TypeError("system=%r: expected a tpushim.System" % (system,))
        return system
    with _lock:
        if _entered:
            return _entered[-1]
        open_systems = list(_open)
    if len(open_systems) == 1:
        return open_systems[0]
    if not open_systems:
        raise RuntimeError("no tpushim.System is open: create one, e.g. "
                           "`with tpushim.System() as system:`")
    raise RuntimeError("%d tpushim.Systems are open and none is entered with "
                       "`with`: pass system=" % len(open_systems))


def pinned_empty(shape, dtype=np.float32, *, system=None):
    return current_system(system).pinned_empty(shape, dtype)


def pinned_zeros(shape, dtype=np.float32, *, system=None):
    return current_system(system).pinned_zeros(shape, dtype)


def register(array, *, system=None):
    return current_system(system).register(array)


def device_put(array, device=0, memory_kind="device", *, dtype=None,
               system=None):
    return current_system(system).device_put(array, device, memory_kind,
                                             dtype=dtype)


def device_get(array, out=None, *, system=None):
    if system is not None:
        return current_system(system).device_get(array, out)
    if not isinstance(array, _tpushim.DeviceArray):
        raise TypeError("device_get: expected a tpushim.DeviceArray, got %s"
                        % type(array).__name__)
    return _tpushim._device_get(array, out)


for _f in (pinned_empty, pinned_zeros, register, device_put, device_get):
    _f.__doc__ = getattr(System, _f.__name__).__doc__ + (
        "\n\n        system=None: the current System (current_system()).")
