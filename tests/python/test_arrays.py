"""Arrays without copies: pinned arrays over the region, registered
memory, device arrays with their events, device_get(out=), byte ranges,
memory kinds; the transfer paths the statistics count."""

import numpy as np
import pytest

import tpushim


def h2d(system, path):
    return system.stats()["transfers"]["h2d"][path]["transfers"]


def test_pinned_empty_is_exactly_nbytes_of_the_region(system):
    before = system.memory_stats("pinned_host")
    host = tpushim.pinned_empty((1000, 3), np.float64)
    assert host.shape == (1000, 3) and host.dtype == np.float64
    assert host.flags.c_contiguous and host.flags.writeable
    after = system.memory_stats("pinned_host")
    assert after["num_allocs"] == before["num_allocs"] + 1
    assert after["largest_alloc_size"] == 24000  # no rounding up
    # The base keeps the region's buffer alive; buffer protocol works.
    assert isinstance(host.base, tpushim.PinnedBuffer)
    assert host.base.nbytes == host.nbytes
    view = memoryview(host.base)
    assert view.nbytes == host.nbytes
    raw = np.frombuffer(host.base, np.uint8)
    assert np.shares_memory(raw, host)
    host[0, 0] = 1.5
    assert raw[:8].view(np.float64)[0] == 1.5
    assert host.base.address == host.__array_interface__["data"][0]


def test_pinned_zeros(system):
    z = tpushim.pinned_zeros((4, 4), np.int32)
    assert (z == 0).all()


def d2h(system, path):
    return system.stats()["transfers"]["d2h"][path]["transfers"]


@pytest.mark.parametrize("shape", [(1024, 128), (1 << 18,), (16, 128)])
def test_pinned_arrays_take_the_zero_copy_path(system, shape):
    # Shapes whose device image is the dense array itself (one tile
    # spanning the minor dimension, no padding) move without staging.
    host = tpushim.pinned_empty(shape, np.float32)
    host[...] = np.random.default_rng(1).standard_normal(shape)
    before = h2d(system, "zero_copy")
    dev = tpushim.device_put(host)
    dev.block_until_ready()
    assert h2d(system, "zero_copy") == before + 1
    out = tpushim.pinned_empty(shape, np.float32)
    before = d2h(system, "zero_copy")
    tpushim.device_get(dev, out)
    assert d2h(system, "zero_copy") == before + 1
    np.testing.assert_array_equal(out, host)


@pytest.mark.parametrize("shape,dtype", [
    ((64, 1024), np.float32), ((1024, 256), np.float32), ((4096,), np.uint8),
    ((1000,), np.float32), ((24, 128), np.float32), ((8, 128), np.int16)])
def test_pinned_arrays_whose_layout_differs_are_laid_out(system, shape, dtype):
    host = tpushim.pinned_empty(shape, dtype)
    host[...] = np.arange(host.size).reshape(shape).astype(dtype)
    dev = tpushim.device_put(host)
    np.testing.assert_array_equal(np.asarray(dev), host)


def test_pageable_arrays_are_staged(system):
    before = h2d(system, "staged")
    tpushim.device_put(np.ones(1 << 16, np.uint8)).block_until_ready()
    assert h2d(system, "staged") == before + 1


def test_region_exhaustion_is_libtpus_error(system):
    keep = tpushim.pinned_empty((40 << 20,), np.uint8)
    with pytest.raises(tpushim.ResourceExhaustedError) as info:
        tpushim.pinned_empty((40 << 20,), np.uint8)
    assert "Attempting to allocate 40.00M. That was not possible. There " \
        "are 24.00M free." in info.value.message
    assert info.value.code == 8 and info.value.code_name == "RESOURCE_EXHAUSTED"
    del keep


def test_register_makes_transfers_zero_copy(system):
    host = np.full(1 << 20, 5, np.uint8)
    with tpushim.register(host) as reg:
        assert reg.active and reg.nbytes == host.nbytes and reg.array is host
        assert system.stats()["transfers"]["registrations_live"] == 1
        dev = tpushim.device_put(host.view(np.float32).reshape(-1, 128))
        dev.block_until_ready()
        stats = system.stats()["transfers"]
        assert stats["zero_copy_registered_transfers"][0] == 1
    assert not reg.active
    assert system.stats()["transfers"]["registrations_live"] == 0
    reg.unregister()  # idempotent
    assert (np.asarray(dev).view(np.uint8) == 5).all()


def test_register_keeps_the_array_alive(system):
    import gc
    import weakref
    host = np.ones(1 << 12, np.uint8)
    ref = weakref.ref(host)
    reg = tpushim.register(host)
    del host
    gc.collect()
    assert ref() is not None
    reg.unregister()
    gc.collect()
    assert ref() is None


def test_register_bad_arrays(system):
    stats = system.stats()
    with pytest.raises(ValueError, match="not C-contiguous"):
        tpushim.register(np.ones((8, 8))[:, ::2])
    with pytest.raises(ValueError, match="empty"):
        tpushim.register(np.ones(0))
    with pytest.raises(TypeError, match="expected a NumPy array"):
        tpushim.register(b"bytes")
    host = np.ones(4096, np.uint8)
    with tpushim.register(host):
        with pytest.raises(tpushim.InvalidArgumentError, match="overlaps"):
            tpushim.register(host[10:])
    assert system.stats()["transfers"]["registrations_live"] == \
        stats["transfers"]["registrations_live"]


def test_device_get_into_out(system):
    dev = tpushim.device_put(np.arange(24, dtype=np.int16).reshape(4, 6))
    out = np.empty((4, 6), np.int16)
    assert tpushim.device_get(dev, out=out) is out
    np.testing.assert_array_equal(out, np.arange(24).reshape(4, 6))
    pinned_out = tpushim.pinned_empty((4, 6), np.int16)
    tpushim.device_get(dev, pinned_out)
    np.testing.assert_array_equal(pinned_out, out)


@pytest.mark.parametrize("out,error,match", [
    (np.empty((4, 6), np.int32), ValueError, "dtype int32"),
    (np.empty((6, 4), np.int16), ValueError, r"shape \[6,4\]"),
    (np.empty((4, 12), np.int16)[:, ::2], ValueError, "C-contiguous"),
    ([0] * 24, TypeError, "must be a NumPy array"),
])
def test_device_get_rejects_a_bad_out(system, out, error, match):
    dev = tpushim.device_put(np.arange(24, dtype=np.int16).reshape(4, 6))
    with pytest.raises(error, match=match):
        tpushim.device_get(dev, out=out)


def test_device_get_rejects_read_only_out(system):
    dev = tpushim.device_put(np.arange(4))
    out = np.empty(4, np.int64)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        tpushim.device_get(dev, out=out)


def test_byte_range_write_and_read(system):
    # f32[64,128] with T(8,128): its device bytes are the dense array's.
    dev = tpushim.device_put(np.zeros((64, 128), np.float32))
    assert dev.xla_shape == "f32[64,128]{1,0:T(8,128)}"
    write = dev.write(np.full(100, 7, np.uint8), offset=1000)
    assert isinstance(write, tpushim.Event)
    write.wait()
    out = np.empty(200, np.uint8)
    dev.read(out, offset=950).wait()
    assert (out[:50] == 0).all() and (out[50:150] == 7).all()
    assert (out[150:] == 0).all()
    # The array's ready event covers the write: np.asarray sees it.
    back = np.asarray(dev).view(np.uint8).reshape(-1)
    assert (back[1000:1100] == 7).all() and back.sum() == 700


def test_byte_range_past_the_end_changes_nothing(system):
    dev = tpushim.device_put(np.zeros(1024, np.uint8))
    dev.block_until_ready()
    stats = system.stats()["transfers"]["h2d"]
    with pytest.raises(tpushim.InvalidArgumentError):
        dev.write(np.ones(100, np.uint8), offset=1000)
    with pytest.raises(tpushim.InvalidArgumentError):
        dev.read(np.empty(100, np.uint8), offset=1000)
    assert system.stats()["transfers"]["h2d"] == stats
    host_dev = tpushim.device_put(np.zeros(8), memory_kind="pinned_host")
    with pytest.raises(ValueError, match="memory_kind='device'"):
        host_dev.write(np.ones(1))


def test_memory_kinds_and_devices(system):
    pinned = tpushim.device_put(np.arange(6), device=1,
                                memory_kind="pinned_host")
    assert pinned.memory_kind == "pinned_host" and pinned.device == 1
    assert system.memory_stats("pinned_host")["buffers_live"] >= 1
    unpinned = tpushim.device_put(np.arange(6), memory_kind="unpinned_host")
    assert system.memory_stats("unpinned_host")["buffers_live"] == 1
    on1 = tpushim.device_put(np.arange(6), device=system.devices[1])
    assert on1.device == 1
    assert system.stats()["devices"][1]["buffers_live"] == 1
    for dev in (pinned, unpinned, on1):
        np.testing.assert_array_equal(np.asarray(dev), np.arange(6))
    # A DeviceArray goes to another memory through the host.
    moved = tpushim.device_put(on1, device=0, memory_kind="unpinned_host")
    np.testing.assert_array_equal(np.asarray(moved), np.arange(6))


def test_device_array_attributes(system):
    dev = tpushim.device_put(np.ones((2, 3), np.float32))
    assert dev.size == 6 and dev.ndim == 2 and len(dev) == 2
    assert "f32[2,3]" in repr(dev)
    assert isinstance(dev.ready, tpushim.Event)
    assert isinstance(dev.host_released, tpushim.Event)
    with pytest.raises(TypeError, match="0-d"):
        len(tpushim.device_put(np.float32(1)))


def test_system_methods_equal_module_functions(system):
    host = system.pinned_empty(8, np.int32)
    host[:] = 3
    dev = system.device_put(host)
    np.testing.assert_array_equal(system.device_get(dev), host)
    with system.register(np.ones(4096, np.uint8)):
        pass


def test_device_put_of_a_device_array_copies_device_to_device(system):
    src = tpushim.device_put(np.arange(3 * 10, dtype=np.int32).reshape(3, 10))
    before = system.stats()["transfers"]["d2d"]["transfers"]
    copy = tpushim.device_put(src, device=1)
    assert copy.device == 1 and copy.memory_kind == "device"
    assert copy.xla_shape == src.xla_shape
    assert copy.on_device_size == src.on_device_size
    copy.block_until_ready()
    assert system.stats()["transfers"]["d2d"]["transfers"] == before + 1
    np.testing.assert_array_equal(np.asarray(copy), np.asarray(src))
    src.delete()  # the copy is its own buffer
    np.testing.assert_array_equal(np.asarray(copy),
                                  np.arange(30).reshape(3, 10))
    empty = tpushim.device_put(tpushim.device_put(np.empty((0, 2))), device=1)
    assert empty.shape == (0, 2) and empty.ready.done()
    with pytest.raises(ValueError, match="was deleted"):
        tpushim.device_put(src, device=1)
