"""tpushim.torch: a PyTorch DataLoader pipeline into tpushim's pinned memory.

PyTorch's own input pipeline collates each batch in a worker process, hands
it to the main process through shared memory, and there a pin-memory thread
copies it once more into page-locked memory before the device copy. This
module removes both copies: batches are collated straight into host memory
every device DMAs from (zero copies on the host), and moved to the devices
with ``tpushim.device_put`` while the next batch is being made.

    import tpushim, tpushim.torch
    with tpushim.System(device="sim://?devices=2") as system, \\
         tpushim.torch.pipeline(dataset, batch_size=64, num_workers=2,
                                device=0) as batches:
        for batch in batches:   # the collated structure, leaves DeviceArrays
            train_step(batch)

The pieces, usable on their own:

* ``PinnedBatchPool``: a ring of batch-sized host buffers ("slabs") that the
  devices DMA from directly, and a ``collate`` that writes a batch into a
  free slab (``torch.stack(..., out=)`` over ``torch.from_numpy`` views: the
  stacking is the only write of the batch's bytes). Two kinds of slab:

  - ``shared=True`` (the default): shared-memory files (memfd) the parent
    registers with ``tpushim.register`` (DmaMap). Pinned memory is not
    inherited by ``fork()`` (MADV_DONTFORK): a forked worker sees the
    parent's registered mapping as a hole. So each worker maps the same
    files itself, writes the batch there, and sends the parent only the
    slab's number and the batch's layout; the parent transfers from its
    own, registered mapping of the same pages. With ``num_workers=0`` the
    collate writes through the parent's mapping.
  - ``shared=False``: ``tpushim.pinned_empty`` buffers of the premapped
    region. Only the process that made them can use them, so only a
    ``num_workers=0`` loader can (a worker that tries is told so by name).

  Which host copy the device transfer then makes is device_put's rule for
  arrays: a leaf whose device layout is its dense bytes (f32[B,8,128],
  f32[B,128] with B a multiple of 8, rank-1 arrays of whole 256-element
  tiles, ...) goes zero-copy from either kind of slab; any other leaf goes
  through the staging copy that lays it out in TPU's tiles
  (stats()["transfers"]["h2d"] counts which).

  A slab goes back to the ring when every transfer reading it has released
  the host buffer (the ``host_released`` events), never earlier.

* ``DeviceLoader``: iterates a DataLoader whose ``collate_fn`` is a pool's,
  ``device_put``s each batch and keeps ``prefetch`` batches in flight, so
  the copy of batch k+1 overlaps the step on batch k, as PyTorch's pin-memory
  thread overlaps its copies (``device_put`` is asynchronous: the runtime's
  copy engine does what that thread does, without holding the GIL).

Errors from the dataset or a worker propagate as PyTorch raises them (same
type and message, the worker's traceback included); the loader then closes:
transfers in flight finish, the slabs are unregistered and freed, nothing
stays pinned. So does Ctrl-C (KeyboardInterrupt) and leaving a ``with``.

Thread-safety: a pool's ``collate`` may run in any number of worker
processes at once; a DeviceLoader is used by one thread.
"""

import collections.abc
import gc
import mmap
import multiprocessing
import os
import queue
import threading

import numpy as np
import torch
import torch.utils.data

import tpushim

__all__ = ["PinnedBatchPool", "DeviceLoader", "pipeline", "batch_nbytes"]

# Leaves start at this alignment inside a slab (a cache line; the runtime's
# own pinned buffers use the same).
_ALIGN = 64
# How long a collate waits for a free slab before it says why it cannot
# get one (a stuck consumer, or a ring too small for the loader's depth).
_SLAB_WAIT_SECONDS = 60.0


def _align(n, a=_ALIGN):
    return (n + a - 1) // a * a


class _Leaf:
    """Where one collated tensor lives in a slab: picklable, a few bytes."""

    __slots__ = ("offset", "shape", "dtype")

    def __init__(self, offset, shape, dtype):
        self.offset = offset
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype).str

    def __getstate__(self):
        return (self.offset, self.shape, self.dtype)

    def __setstate__(self, state):
        self.offset, self.shape, self.dtype = state

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def view(self, slab):
        """This leaf as a NumPy array over `slab` (a uint8 array)."""
        n = self.nbytes
        return slab[self.offset : self.offset + n].view(self.dtype).reshape(self.shape)


class SlabBatch:
    """What a pool's collate returns: a slab number and the batch's layout.

    ``tree`` has the structure ``default_collate`` would give, with a
    ``_Leaf`` where a tensor would be. ``PinnedBatchPool.tensors`` turns it
    into tensors over the slab; ``DeviceLoader`` into device arrays.
    """

    __slots__ = ("pool_token", "slab", "tree")

    def __init__(self, pool_token, slab, tree):
        self.pool_token = pool_token
        self.slab = slab
        self.tree = tree

    def __getstate__(self):
        return (self.pool_token, self.slab, self.tree)

    def __setstate__(self, state):
        self.pool_token, self.slab, self.tree = state


class _Raw(list):
    """Values default_collate leaves as a list (strings, None)."""


def _leaf_dtype(x):
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            return np.dtype(np.uint16)  # NumPy has no bfloat16: its bits
        return torch.empty((), dtype=x.dtype).numpy().dtype
    return x.dtype


def _plan(samples, offset):
    """The layout default_collate's result would have, placed from `offset`.

    Returns (tree, end offset). Leaves for tensors, arrays and numbers; other
    values (strings, None) stay as default_collate leaves them.
    """
    first = samples[0]
    if isinstance(first, (torch.Tensor, np.ndarray)) and not (
        isinstance(first, np.ndarray) and first.dtype.kind in "OUSV"
    ):
        shape = (len(samples),) + tuple(first.shape)
        offset = _align(offset)
        leaf = _Leaf(offset, shape, _leaf_dtype(first))
        return leaf, offset + leaf.nbytes
    if isinstance(first, bool):
        dtype = np.bool_
    elif isinstance(first, int):
        dtype = np.int64
    elif isinstance(first, float):
        dtype = np.float64
    elif isinstance(first, (np.bool_, np.number)):
        dtype = first.dtype
    else:
        dtype = None
    if dtype is not None:
        offset = _align(offset)
        leaf = _Leaf(offset, (len(samples),), dtype)
        return leaf, offset + leaf.nbytes
    if isinstance(first, (str, bytes)) or first is None:
        return _Raw(samples), offset
    if isinstance(first, collections.abc.Mapping):
        tree = {}
        for key in first:
            tree[key], offset = _plan([s[key] for s in samples], offset)
        return tree, offset
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
        fields = []
        for i in range(len(first)):
            sub, offset = _plan([s[i] for s in samples], offset)
            fields.append(sub)
        return type(first)(*fields), offset
    if isinstance(first, collections.abc.Sequence):
        if any(len(s) != len(first) for s in samples):
            raise RuntimeError("each element in list of batch should be of equal size")
        out = []
        for i in range(len(first)):
            sub, offset = _plan([s[i] for s in samples], offset)
            out.append(sub)
        return (tuple(out) if isinstance(first, tuple) else out), offset
    raise TypeError(
        "tpushim.torch: cannot collate samples of type %s into pinned memory "
        "(tensors, NumPy arrays, numbers, str, and dicts/tuples/lists of them "
        "are supported)" % type(first).__name__
    )


def _fill(tree, samples, slab):
    """Writes `samples` into `slab` where `tree` (from _plan) says."""
    if isinstance(tree, _Leaf):
        out = tree.view(slab)
        first = samples[0]
        if isinstance(first, torch.Tensor):
            # The one write of the batch's bytes: stack straight into the slab.
            target = torch.from_numpy(out.view(np.int16) if first.dtype == torch.bfloat16 else out)
            if first.dtype == torch.bfloat16:
                target = target.view(torch.bfloat16)
            if tuple(first.shape) != tree.shape[1:] or any(
                tuple(s.shape) != tree.shape[1:] for s in samples
            ):
                raise RuntimeError(
                    "stack expects each tensor to be equal size, but got %s and others"
                    % (list(first.shape),)
                )
            torch.stack(samples, out=target)
        elif isinstance(first, np.ndarray):
            np.stack(samples, out=out)
        else:
            out[...] = samples
        return
    if isinstance(tree, _Raw):
        return  # strings etc.: already in the tree
    if isinstance(tree, collections.abc.Mapping):
        for key, sub in tree.items():
            _fill(sub, [s[key] for s in samples], slab)
        return
    for i, sub in enumerate(tree):
        _fill(sub, [s[i] for s in samples], slab)


def batch_nbytes(samples):
    """Bytes of slab a batch of `samples` takes (its leaves, aligned)."""
    _, end = _plan(list(samples), 0)
    return end


# Per-process maps of shared slabs, by pool token: a worker maps a pool's
# files the first time it collates for it.
_worker_maps = {}
_worker_maps_lock = threading.Lock()


class _Collate:
    """A pool's collate_fn: takes a free slab, writes the batch there."""

    def _slab_wait(self):
        try:
            return self.free.get(timeout=_SLAB_WAIT_SECONDS)
        except queue.Empty:
            raise RuntimeError(
                "tpushim.torch: no free batch slab for %.0f s: the consumer holds "
                "them all (are batches released? is the pool smaller than the "
                "loader's prefetch_factor * num_workers + the pipeline's prefetch + 1?)"
                % _SLAB_WAIT_SECONDS
            ) from None

    def __call__(self, samples):
        samples = list(samples)
        if not samples:
            raise ValueError("tpushim.torch: cannot collate an empty batch")
        tree, end = _plan(samples, 0)
        if end > self.slab_bytes:
            raise ValueError(
                "tpushim.torch: a batch of %d bytes does not fit the pool's "
                "batch_bytes=%d; make the pool with batch_bytes >= %d" % (end, self.slab_bytes, end)
            )
        slab_id = self._slab_wait()
        try:
            _fill(tree, samples, self._slab(slab_id))
        except BaseException:
            self.free.put(slab_id)
            raise
        return SlabBatch(self.token, slab_id, tree)


class _SharedCollate(_Collate):
    """The collate_fn of a shared pool: picklable (spawn), maps lazily."""

    def __init__(self, token, owner_pid, fds, inodes, slab_bytes, free, inner):
        self.token = token
        self.owner_pid = owner_pid
        self.fds = fds
        self.inodes = inodes
        self.slab_bytes = slab_bytes
        self.free = free
        self.inner = inner  # the owning process's slabs (not pickled)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["inner"] = None
        return state

    def _slab(self, i):
        if os.getpid() == self.owner_pid and self.inner is not None:
            return self.inner[i]
        with _worker_maps_lock:
            maps = _worker_maps.get(self.token)
            if maps is None or maps[0] != os.getpid():
                maps = (os.getpid(), {})
                _worker_maps[self.token] = maps
            slab = maps[1].get(i)
            if slab is None:
                # Our own mapping of the parent's file: the parent's mapping
                # of it is registered for DMA, hence not inherited (a hole).
                fd = self._open(i)
                try:
                    m = mmap.mmap(
                        fd, self.slab_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
                    )
                finally:
                    os.close(fd)
                slab = np.frombuffer(m, dtype=np.uint8)
                maps[1][i] = slab
            return slab

    def _open(self, i):
        # A forked worker inherited the file (not the mapping); a spawned
        # one opens it through the owner's descriptor table.
        try:
            if os.fstat(self.fds[i]).st_ino == self.inodes[i]:
                return os.dup(self.fds[i])
        except OSError:
            pass
        return os.open("/proc/%d/fd/%d" % (self.owner_pid, self.fds[i]), os.O_RDWR)


class _RegionCollate(_Collate):
    """The collate_fn of a region pool: the owning process only."""

    def __init__(self, token, owner_pid, slab_bytes, free, inner):
        self.token = token
        self.owner_pid = owner_pid
        self.slab_bytes = slab_bytes
        self.free = free
        self.inner = inner

    def __getstate__(self):
        raise TypeError(
            "a PinnedBatchPool(shared=False) lives in the premapped region of "
            "this process; DataLoader workers cannot use it (pinned memory is "
            "not inherited by worker processes): use shared=True, the default"
        )

    def _slab(self, i):
        if os.getpid() != self.owner_pid:
            raise RuntimeError(
                "a PinnedBatchPool(shared=False) lives in the premapped region "
                "of process %d, which a forked DataLoader worker (pid %d) does "
                "not inherit (pinned memory is MADV_DONTFORK): use shared=True "
                "(the default) with num_workers > 0" % (self.owner_pid, os.getpid())
            )
        return self.inner[i]


_tokens = iter(range(1, 1 << 62))


class PinnedBatchPool:
    """A ring of `slabs` host buffers of `batch_bytes` each that devices DMA
    from directly, and the ``collate`` that fills them.

    shared=True: memfd files registered with ``tpushim.register`` (DmaMap),
    for DataLoader workers; shared=False: ``pinned_empty`` buffers of the
    premapped region, for num_workers=0. Errors, with nothing left
    allocated: ValueError for batch_bytes or slabs < 1; the runtime's
    (tpushim.Error subclasses) when the region or the pin cannot serve it.
    multiprocessing_context: the DataLoader's (None: the default, fork on
    Linux; "spawn" and "forkserver" workers need their own context's
    queue, and open the slabs through /proc/<this pid>/fd).

    A context manager; ``close()`` (idempotent) waits for nothing: call it
    once no transfer reads a slab (DeviceLoader does), it unregisters and
    frees every slab.
    """

    def __init__(
        self, batch_bytes, slabs, *, shared=True, system=None, multiprocessing_context=None
    ):
        if int(batch_bytes) < 1:
            raise ValueError("tpushim.torch: batch_bytes must be >= 1, got %r" % (batch_bytes,))
        if int(slabs) < 1:
            raise ValueError("tpushim.torch: slabs must be >= 1, got %r" % (slabs,))
        self.shared = bool(shared)
        self.system = system
        self.token = (os.getpid(), next(_tokens))
        self._closed = False
        self._registrations = []
        self._mmaps = []
        self._fds = []
        self._slabs = []
        page = mmap.PAGESIZE
        self.slab_bytes = _align(int(batch_bytes), page if self.shared else _ALIGN)
        self.count = int(slabs)
        # Free slab numbers; the collate (any process) takes one, the
        # consumer puts it back when its transfers let go of it.
        if self.shared:
            context = multiprocessing_context
            if context is None or isinstance(context, str):
                context = multiprocessing.get_context(context)
            self._free = context.Queue()
        else:
            self._free = queue.Queue()
        try:
            for i in range(self.count):
                if self.shared:
                    fd = os.memfd_create("tpushim-batch-%d" % i, 0)
                    self._fds.append(fd)
                    os.ftruncate(fd, self.slab_bytes)
                    m = mmap.mmap(
                        fd, self.slab_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
                    )
                    self._mmaps.append(m)
                    slab = np.frombuffer(m, dtype=np.uint8)
                    self._registrations.append(tpushim.register(slab, system=system))
                else:
                    slab = tpushim.pinned_empty((self.slab_bytes,), np.uint8, system=system)
                self._slabs.append(slab)
        except BaseException:
            self._release_all()
            raise
        for i in range(self.count):
            self._free.put(i)
        if self.shared:
            inodes = [os.fstat(fd).st_ino for fd in self._fds]
            self.collate = _SharedCollate(
                self.token,
                os.getpid(),
                list(self._fds),
                inodes,
                self.slab_bytes,
                self._free,
                self._slabs,
            )
        else:
            self.collate = _RegionCollate(
                self.token, os.getpid(), self.slab_bytes, self._free, self._slabs
            )

    @property
    def nbytes(self):
        """Bytes of host memory the pool pins (slabs x slab size)."""
        return self.count * self.slab_bytes

    def _check(self, batch):
        if self._closed:
            raise ValueError("tpushim.torch: the PinnedBatchPool is closed")
        if not isinstance(batch, SlabBatch) or batch.pool_token != self.token:
            raise ValueError(
                "tpushim.torch: expected a batch made by this pool's collate, got %s"
                % type(batch).__name__
            )

    def _slab_of(self, batch):
        self._check(batch)
        return self._slabs[batch.slab]

    def arrays(self, batch):
        """The batch's structure with NumPy arrays over this process's
        (registered or region) slab: no copy."""
        slab = self._slab_of(batch)
        return _map_tree(batch.tree, lambda leaf: leaf.view(slab))

    def tensors(self, batch):
        """The pin_memory hook: the batch as tensors over the pinned slab
        (``torch.from_numpy``, no copy). Valid until ``release(batch)``."""
        slab = self._slab_of(batch)
        return _map_tree(batch.tree, lambda leaf: torch.from_numpy(leaf.view(slab)))

    def release(self, batch):
        """Puts the batch's slab back in the ring. REQUIRES: nothing reads it
        any more (every transfer from it has released the host buffer)."""
        self._check(batch)
        self._free.put(batch.slab)

    def _release_all(self):
        for r in self._registrations:
            r.unregister()
        self._registrations = []
        self._slabs = []
        if getattr(self, "collate", None) is not None:
            self.collate.inner = None
        for m in self._mmaps:
            try:
                m.close()
            except BufferError:
                # Views of it still live, e.g. in the frames of a traceback
                # (cycles): collect them; failing that, the mapping goes
                # with its last view (it is unregistered, so not pinned).
                gc.collect()
                try:
                    m.close()
                except BufferError:
                    pass
        self._mmaps = []
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def close(self):
        """Unregisters and frees every slab. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._release_all()
        if self.shared:
            self._free.close()
            self._free.join_thread()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _map_tree(tree, fn):
    if isinstance(tree, _Leaf):
        return fn(tree)
    if isinstance(tree, collections.abc.Mapping):
        return {k: _map_tree(v, fn) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*[_map_tree(v, fn) for v in tree])
    if isinstance(tree, _Raw):
        return list(tree)
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map_tree(v, fn) for v in tree)
    return tree


class DeviceLoader:
    """Moves the batches of `loader` (whose collate_fn is `pool.collate`) to
    the devices, `prefetch` batches ahead.

    device: an int (every leaf goes whole to that device) or a list of ints
    (each leaf is split along its first dimension into len(device) equal
    parts, part i to device[i], as a global batch is split across cores;
    the first dimension must divide evenly). Each batch yielded has the
    collated structure with ``tpushim.DeviceArray`` leaves (a list of them
    per leaf for a device list), ready on the device (``wait_ready=True``)
    or with their transfers in flight (``wait_ready=False``).

    One iteration at a time. Closing it (``close()``, leaving ``with``, the
    end of the data, an exception from the loader, KeyboardInterrupt) shuts
    the loader's workers down, waits for the transfers still reading the
    slabs, then closes the pool if this DeviceLoader owns it. Batches
    already yielded stay valid (device memory).
    """

    def __init__(
        self,
        loader,
        pool,
        device=0,
        *,
        memory_kind="device",
        prefetch=2,
        wait_ready=True,
        own_pool=False,
        system=None
    ):
        if int(prefetch) < 1:
            raise ValueError("tpushim.torch: prefetch must be >= 1, got %r" % (prefetch,))
        if getattr(loader, "collate_fn", None) is not pool.collate:
            raise ValueError("tpushim.torch: the DataLoader's collate_fn must be pool.collate")
        if loader.num_workers > 0 and not pool.shared:
            raise ValueError(
                "tpushim.torch: num_workers=%d needs a PinnedBatchPool(shared=True): "
                "the premapped region (shared=False) is not inherited by worker "
                "processes" % loader.num_workers
            )
        needed = prefetch + 1 + (loader.num_workers * (loader.prefetch_factor or 0))
        if pool.count < needed:
            raise ValueError(
                "tpushim.torch: a pool of %d slabs is too small for this loader: "
                "num_workers (%d) x prefetch_factor (%d) + prefetch (%d) + 1 = %d "
                "batches can be held at once"
                % (pool.count, loader.num_workers, loader.prefetch_factor or 0, prefetch, needed)
            )
        self.loader = loader
        self.pool = pool
        self.devices = list(device) if isinstance(device, (list, tuple)) else int(device)
        self.memory_kind = memory_kind
        self.prefetch = int(prefetch)
        self.wait_ready = bool(wait_ready)
        self.own_pool = own_pool
        self.system = system
        self._it = None
        self._pending = collections.deque()
        self._closed = False
        self._exhausted = False
        self._lock = threading.Lock()
        self._outstanding = 0  # slabs put to the devices, not yet released
        self._released = threading.Condition(self._lock)

    def _put(self, batch):
        """Starts the device copies of one SlabBatch; the slab goes back to
        the ring once every copy has released it."""
        slab = self.pool._slab_of(batch)
        parts = []

        def place(a):
            if isinstance(self.devices, list):
                n = len(self.devices)
                if a.shape[0] % n:
                    raise ValueError(
                        "tpushim.torch: a batch dimension of %d does not split "
                        "evenly over %d devices" % (a.shape[0], n)
                    )
                out = []
                for d, shard in zip(self.devices, np.split(a, n)):
                    x = tpushim.device_put(
                        shard, d, memory_kind=self.memory_kind, system=self.system
                    )
                    parts.append(x)
                    out.append(x)
                return out
            x = tpushim.device_put(
                a, self.devices, memory_kind=self.memory_kind, system=self.system
            )
            parts.append(x)
            return x

        try:
            result = _map_tree(batch.tree, lambda leaf: place(leaf.view(slab)))
        except BaseException:
            # The copies already started read the slab: let them finish
            # before the caller's close() can free it.
            for x in parts:
                try:
                    x.host_released.wait()
                except Exception:
                    pass
            raise
        remaining = [len(parts)]
        with self._lock:
            self._outstanding += 1

        def on_released(_event):
            # On the module's callback thread. The slab goes back before
            # close() can see the count drop, so never into a closed pool.
            with self._lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
                if not self.pool._closed:
                    self.pool.release(batch)
                self._outstanding -= 1
                self._released.notify_all()

        if not parts:  # nothing to transfer: the slab is free at once
            remaining[0] = 1
            on_released(None)
        for x in parts:
            x.host_released.add_done_callback(on_released)
        return result, parts

    def __iter__(self):
        if self._closed:
            raise ValueError("tpushim.torch: the DeviceLoader is closed")
        if self._it is not None:
            raise RuntimeError("tpushim.torch: a DeviceLoader runs one iteration at a time")
        self._it = iter(self.loader)
        return self

    def __next__(self):
        if self._closed:
            raise StopIteration
        if self._it is None:
            iter(self)
        try:
            while not self._exhausted and len(self._pending) < self.prefetch:
                try:
                    batch = next(self._it)
                except StopIteration:
                    self._exhausted = True
                    break
                self._pending.append(self._put(batch))
            if not self._pending:
                self.close()
                raise StopIteration
            result, parts = self._pending.popleft()
            if self.wait_ready:
                for x in parts:
                    x.ready.wait()
            return result
        except StopIteration:
            raise
        except BaseException:
            # As PyTorch's iterator, the error reaches the caller as raised;
            # nothing of the pipeline stays pinned behind it.
            self.close()
            raise

    def close(self):
        """Shuts the workers down, waits for the transfers that read the
        slabs, and closes an owned pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        del it
        # Batches put but not yielded: their copies finish (ready, after
        # host_released: a staged copy holds region staging until then),
        # then their device memory goes with them.
        for _, parts in self._pending:
            for x in parts:
                for event in (x.host_released, x.ready):
                    try:
                        event.wait()
                    except Exception:
                        pass  # a failed copy has let go of the slab too
        self._pending.clear()
        with self._lock:
            while self._outstanding:
                self._released.wait(timeout=0.05)
        if self.own_pool:
            self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def pipeline(
    dataset,
    batch_size=1,
    *,
    num_workers=0,
    device=0,
    memory_kind="device",
    prefetch=2,
    wait_ready=True,
    batch_bytes=None,
    shared=True,
    system=None,
    **loader_kwargs
):
    """A DataLoader over `dataset` collating into a new PinnedBatchPool,
    wrapped in a DeviceLoader that owns the pool (closing it frees it).

    batch_bytes: a slab's size; default: what a batch of `batch_size`
    copies of ``dataset[0]`` takes. shared: see PinnedBatchPool. The
    other keywords go to ``torch.utils.data.DataLoader``.
    """
    if batch_bytes is None:
        batch_bytes = batch_nbytes([dataset[0]] * batch_size)
    prefetch_factor = loader_kwargs.get("prefetch_factor", 2) if num_workers > 0 else 0
    slabs = num_workers * prefetch_factor + prefetch + 1
    pool = PinnedBatchPool(
        batch_bytes,
        slabs,
        shared=shared,
        system=system,
        multiprocessing_context=loader_kwargs.get("multiprocessing_context"),
    )
    try:
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            collate_fn=pool.collate,
            **loader_kwargs
        )
        return DeviceLoader(
            loader,
            pool,
            device,
            memory_kind=memory_kind,
            prefetch=prefetch,
            wait_ready=wait_ready,
            own_pool=True,
            system=system,
        )
    except BaseException:
        pool.close()
        raise
