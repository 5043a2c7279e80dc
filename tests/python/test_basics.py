"""The package imports from a build tree, a System starts and closes, and
an array goes to a device and back."""

import numpy as np

import tpushim


def test_system_lists_devices_and_memories(system):
    assert [d.id for d in system.devices] == [0, 1]
    assert [d.host_chip for d in system.devices] == [0, 1]
    kinds = [m.kind for m in system.memories]
    assert kinds == ["device", "device", "pinned_host", "unpinned_host"]
    assert system.memories[2].devices == (0, 1)
    assert system.premapped_buffer_size == 64 << 20


def test_device_put_and_back(system):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    dev = tpushim.device_put(host)
    assert dev.ready.wait() is True
    np.testing.assert_array_equal(np.asarray(dev), host)


def test_pinned_empty_round_trip(system):
    host = tpushim.pinned_empty((8, 128), np.float32)
    host[:] = 3.5
    dev = tpushim.device_put(host, device=1)
    dev.block_until_ready()
    np.testing.assert_array_equal(tpushim.device_get(dev), host)
