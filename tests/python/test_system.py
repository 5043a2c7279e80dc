"""tpushim.System: options as keywords (sizes as strings), the
environment, the current System, devices/memories, statistics and
start-up progress as plain data."""

import os
import threading

import numpy as np
import pytest

import tpushim


def test_options_as_keywords_and_size_strings(run_dir):
    with tpushim.System(premapped_buffer_size="32M",
                        premapped_buffer_transfer_threshold_bytes=1 << 20,
                        device="sim://?devices=3&hbm=64M", run_dir=run_dir,
                        min_log_level=0, stderr_log_level=3,
                        hugepages="off", mlock="on", prefault_threads=2,
                        dump_on_oom=False, numa_node="auto") as system:
        assert system.premapped_buffer_size == 32 << 20
        assert system.premapped_buffer_transfer_threshold_bytes == 1 << 20
        assert len(system.devices) == 3
        assert system.devices[2].hbm_bytes == 64 << 20
        assert system.init_time_s > 0
        assert system.log_directory == ""  # TPU_LOG_DIR=disabled (conftest)


@pytest.mark.parametrize("text,value", [
    ("4G", 4 << 30), ("64M", 64 << 20), ("512k", 512 << 10), ("4096", 4096),
    ("2GiB", 2 << 30), (" 1 T ", 1 << 40), (0, 0), (12288, 12288)])
def test_parse_size(text, value):
    assert tpushim.parse_size(text) == value


def test_the_environment_is_read_as_the_cpp_api_reads_it(run_dir,
                                                          monkeypatch):
    # conftest sets TPU_PREMAPPED_BUFFER_SIZE=64M and a 2-device sim://.
    with tpushim.System(run_dir=run_dir) as system:
        assert system.premapped_buffer_size == 64 << 20
        assert len(system.devices) == 2
    monkeypatch.setenv("LIBTPU_INIT_ARGS",
                       "--tpu_premapped_buffer_size=%d" % (8 << 20))
    with tpushim.System(run_dir=run_dir) as system:
        assert system.premapped_buffer_size == 8 << 20  # flags over env
    with tpushim.System(run_dir=run_dir,
                        premapped_buffer_size="16M") as system:
        assert system.premapped_buffer_size == 16 << 20  # keywords win


def test_malformed_environment_is_invalid_argument(run_dir, monkeypatch):
    monkeypatch.setenv("TPU_PREMAPPED_BUFFER_SIZE", "4G")
    with pytest.raises(tpushim.InvalidArgumentError,
                       match="TPU_PREMAPPED_BUFFER_SIZE"):
        tpushim.System(run_dir=run_dir)


def test_unknown_keyword_is_a_type_error(run_dir):
    with pytest.raises(TypeError, match="unexpected keyword argument "
                                        "'premapped_size'"):
        tpushim.System(premapped_size="4G", run_dir=run_dir)


@pytest.mark.parametrize("options,error,match", [
    ({"premapped_buffer_size": 4097}, tpushim.InvalidArgumentError,
     "premapped_buffer_size.*4097.*4096 and 8192"),
    ({"premapped_buffer_size": -4096}, ValueError, "cannot be negative"),
    ({"premapped_buffer_size": "4 gigs"}, ValueError, "not a size"),
    ({"premapped_buffer_size": 1.5}, TypeError, "a size is an int"),
    ({"premapped_buffer_size": True}, TypeError, "a size is an int"),
    ({"premap": "later"}, ValueError, "'foreground', 'background'"),
    ({"mlock": "maybe"}, ValueError, "'on', 'required', 'off'"),
    ({"min_log_level": "0"}, TypeError, "expected an int"),
    ({"min_log_level": 7}, tpushim.InvalidArgumentError, "min_log_level"),
    ({"device": "gpu://"}, tpushim.InvalidArgumentError, "gpu://"),
    ({"visible_chips": [0, 5]}, tpushim.Error, "5"),
    ({"visible_chips": "0,x"}, ValueError, "comma-separated integers"),
])
def test_bad_option_values(run_dir, options, error, match):
    with pytest.raises(error, match=match):
        tpushim.System(run_dir=run_dir, **options)


def test_invalid_argument_is_also_a_value_error():
    assert issubclass(tpushim.InvalidArgumentError, ValueError)
    assert issubclass(tpushim.InvalidArgumentError, tpushim.Error)
    assert issubclass(tpushim.DeadlineExceededError, TimeoutError)
    # Not the builtins' names: no shadowing.
    assert tpushim.CancelledError is not getattr(__builtins__, "CancelledError",
                                                 None)


def test_one_exception_class_per_code():
    names = {}
    for name in tpushim._errors.__all__:
        cls = getattr(tpushim, name)
        assert issubclass(cls, tpushim.Error)
        if cls is not tpushim.Error:
            names[cls.code] = cls.code_name
    assert sorted(names) == list(range(1, 17))
    assert names[8] == "RESOURCE_EXHAUSTED" and names[14] == "UNAVAILABLE"
    error = tpushim.NotFoundError("no such thing")
    assert str(error) == "NOT_FOUND: no such thing"
    assert error.message == "no such thing" and error.report is None


def test_a_held_chip_is_unavailable_naming_the_holder(run_dir):
    with tpushim.System(run_dir=run_dir, visible_chips=[1]):
        with pytest.raises(tpushim.UnavailableError) as info:
            tpushim.System(run_dir=run_dir, visible_chips="1")
        assert "chip 1" in info.value.message
        assert str(os.getpid()) in info.value.message
        with tpushim.System(run_dir=run_dir, visible_chips=[0]) as other:
            assert other.devices[0].host_chip == 0


def test_device_memory_exhaustion_carries_xlas_report(run_dir):
    with tpushim.System(run_dir=run_dir, device="sim://?hbm=1M") as system:
        keep = system.device_put(np.zeros((256, 256), np.float32))  # 256K
        before = system.stats()
        with pytest.raises(tpushim.ResourceExhaustedError) as info:
            system.device_put(np.zeros((1024, 1024), np.float32))
        error = info.value
        assert error.message.startswith(
            "Error allocating device buffer: Attempting to allocate 4.00M. "
            "That was not possible. There are 768.0K free.; (0x0x0_HBM0)")
        assert error.report.startswith("Ran out of memory in memory space hbm.")
        assert "Shape: f32[1024,1024]{1,0:T(8,128)}" in error.report
        assert error.report in error.message
        assert system.stats()["devices"] == before["devices"]
        del keep


def test_bad_arguments_change_nothing(system):
    warm = system.device_put(np.ones(4)).block_until_ready()  # kept: a
    # dropped DeviceArray is freed behind the caller
    before = system.stats()
    mem_before = system.memory_stats()
    for call, error, match in [
        (lambda: system.device_put(np.ones(4), device=2), ValueError,
         r"device=2: this System has devices 0..1"),
        (lambda: system.device_put(np.ones(4), device=-1), ValueError,
         "device=-1"),
        (lambda: system.device_put(np.ones(4), device="0"), TypeError,
         "device must be an int"),
        (lambda: system.device_put(np.ones(4), memory_kind="hbm"), ValueError,
         "accepted kinds are 'device', 'pinned_host', 'unpinned_host'"),
        (lambda: system.device_put(np.array(["x"])), TypeError,
         "no XLA element type"),
        (lambda: system.pinned_empty((-1, 4)), ValueError,
         "negative dimension"),
        (lambda: system.pinned_empty(4, object), TypeError, "Python objects"),
        (lambda: system.pinned_empty("x"), TypeError, "shape"),
        (lambda: system.register(np.ones((4, 4))[::2]), ValueError,
         "not C-contiguous"),
    ]:
        with pytest.raises(error, match=match):
            call()
    assert system.stats() == before
    assert system.memory_stats() == mem_before
    del warm


def test_arrays_of_another_system_are_value_errors(system, tmp_path):
    other_run = tmp_path / "other"
    other_run.mkdir()
    with tpushim.System(run_dir=str(other_run)) as other:
        dev = other.device_put(np.arange(3))
        with pytest.raises(ValueError, match="another tpushim.System"):
            system.device_get(dev)
        with pytest.raises(ValueError, match="another tpushim.System"):
            system.device_put(dev)
        np.testing.assert_array_equal(tpushim.device_get(dev), np.arange(3))


def test_current_system(run_dir, tmp_path):
    with pytest.raises(RuntimeError, match="no tpushim.System is open"):
        tpushim.device_put(np.ones(2))
    first = tpushim.System(run_dir=run_dir, visible_chips=[0])
    assert tpushim.current_system() is first  # the only open one
    second = tpushim.System(run_dir=run_dir, visible_chips=[1])
    with pytest.raises(RuntimeError, match="2 tpushim.Systems are open"):
        tpushim.pinned_empty(4)
    with first:
        assert tpushim.current_system() is first
        with second:
            assert tpushim.current_system() is second
            seen = []
            t = threading.Thread(
                target=lambda: seen.append(tpushim.current_system()))
            t.start()
            t.join()
            assert seen == [second]  # entered on any thread
            assert tpushim.device_put(np.ones(2), system=first).device == 0
        assert tpushim.current_system() is first
    assert first.closed and second.closed
    with pytest.raises(TypeError, match="expected a tpushim.System"):
        tpushim.device_put(np.ones(2), system="first")


def test_stats_are_plain_dicts(system):
    tpushim.device_put(np.ones(1 << 16, np.uint8)).block_until_ready()
    stats = system.stats()
    assert set(stats) == {"region", "transfers", "devices"}
    assert {"enabled", "capacity_bytes", "threshold_bytes", "bytes_in_use",
            "free_bytes", "largest_free_block", "allocations", "failures",
            "page_kind", "locked", "premapped"} <= set(stats["region"])
    transfers = stats["transfers"]
    assert set(transfers["h2d"]) == {"zero_copy", "staged", "pinned"}
    assert set(transfers["d2h"]) == {"zero_copy", "staged", "pinned"}
    assert transfers["h2d"]["staged"]["bytes"] == 1 << 16
    assert {"transfers", "bytes", "failed", "busy_ns", "active_ns"} == \
        set(transfers["d2d"])
    assert {"device", "direction", "submitted", "completed"} <= \
        set(transfers["queues"][0])
    assert [d["id"] for d in stats["devices"]] == [0, 1]
    memories = system.memory_stats()
    assert [m["kind"] for m in memories] == \
        ["device", "device", "pinned_host", "unpinned_host"]
    assert memories[3]["bytes_limit"] is None
    assert system.memory_stats(2) == system.memory_stats("pinned_host") == \
        system.memory_stats(system.memories[2])
    with pytest.raises(tpushim.InvalidArgumentError):
        system.memory_stats(17)
    with pytest.raises(TypeError):
        system.memory_stats(1.0)


def test_startup_progress_with_background_premapping(run_dir):
    with tpushim.System(run_dir=run_dir, premap="background",
                        premapped_buffer_size="32M") as system:
        progress = system.startup_progress()
        assert progress["total_bytes"] == 32 << 20
        assert progress["phase"] in ("premapping", "done")
        system.await_premapped()
        progress = system.startup_progress()
        assert progress["phase"] == "done" and progress["complete"]
        assert progress["done_bytes"] == 32 << 20
        assert system.stats()["region"]["background"] is True
