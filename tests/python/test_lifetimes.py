"""Lifetimes that cannot crash: arrays and events outliving their System,
closing a System while transfers run, freeing a pinned array a transfer
reads, and fork() after import."""

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tpushim


def make_system(run_dir, **options):
    options.setdefault("premapped_buffer_size", "16M")
    options.setdefault("device", "sim://?devices=2")
    return tpushim.System(run_dir=run_dir, **options)


def test_close_is_idempotent_and_later_use_is_a_value_error(run_dir):
    system = make_system(run_dir)
    dev = system.device_put(np.arange(16))
    dev.block_until_ready()
    system.close()
    system.close()
    assert system.closed
    for call in (lambda: system.device_put(np.ones(3)),
                 lambda: system.pinned_empty(4),
                 lambda: system.stats(),
                 lambda: system.devices,
                 lambda: np.asarray(dev),
                 lambda: dev.block_until_ready(),
                 lambda: dev.write(np.ones(2))):
        with pytest.raises(ValueError, match="System it belongs to is closed"):
            call()
    assert dev.shape == (16,)  # its description stays
    dev.delete()  # nothing left to free: no error
    assert "closed" in repr(system)


def test_events_outlive_their_system(run_dir):
    system = make_system(run_dir)
    dev = system.device_put(np.ones(1 << 16, np.uint8))
    ready = dev.ready
    caller = system.create_event()
    pending = caller.event
    system.close()
    assert ready.wait(timeout=10) is True
    # The caller's event ends with the system: failed, never hanging.
    with pytest.raises(tpushim.CancelledError):
        pending.result(timeout=10)
    with pytest.raises(tpushim.FailedPreconditionError):
        caller.set()


def test_pinned_array_outlives_its_system(run_dir):
    system = make_system(run_dir)
    host = system.pinned_empty((256,), np.int64)
    host[:] = np.arange(256)
    system.close()
    # The array's memory stays valid: the runtime waits for it.
    assert host.sum() == 255 * 256 // 2
    host[:] = 7
    assert (host == 7).all()
    # Its chips are still held until the array goes.
    with pytest.raises(tpushim.UnavailableError, match="chip"):
        make_system(run_dir)
    del host
    gc.collect()
    make_system(run_dir).close()


def test_close_while_transfers_run(run_dir):
    # A slow link: the transfers are still running when close() is called.
    system = make_system(run_dir, device="sim://?link_gbps=0.5")
    devs = [system.device_put(np.full(1 << 20, i, np.uint8))
            for i in range(8)]
    system.close()  # cancels what has not started, lets the rest finish
    outcomes = set()
    for i, dev in enumerate(devs):
        error = dev.ready.exception(timeout=60)
        assert error is None or isinstance(error, tpushim.CancelledError)
        outcomes.add("ok" if error is None else "cancelled")
    assert outcomes  # every event resolved


def test_freeing_a_pinned_array_while_a_transfer_reads_it(system):
    # The transfer keeps the array (and its region buffer) alive.
    stats = system.stats()
    host = system.pinned_empty((4 << 20,), np.uint8)
    host[:] = 0xAB
    dev = system.device_put(host)
    del host
    gc.collect()
    dev.block_until_ready()
    assert (np.asarray(dev) == 0xAB).all()
    del dev
    gc.collect()
    # Once the transfer is done and the dispatcher dropped its reference,
    # the region's buffer goes back.
    for _ in range(1000):
        if system.stats()["region"]["live_allocations"] == \
                stats["region"]["live_allocations"]:
            break
        threading.Event().wait(0.01)
    assert system.stats()["region"]["live_allocations"] == \
        stats["region"]["live_allocations"]


def test_freeing_a_host_array_during_a_transfer_out(system):
    dev = system.device_put(np.arange(1 << 18, dtype=np.int32))
    out = np.empty(1 << 18, np.int32)
    done = dev.read(out)
    del out  # the transfer keeps it alive until it is done
    gc.collect()
    done.wait()


def test_device_array_dropped_with_transfers_in_flight(system):
    for _ in range(20):
        system.device_put(np.ones(1 << 16, np.float32))  # dropped at once
    gc.collect()
    dev = system.device_put(np.ones(4))
    np.testing.assert_array_equal(np.asarray(dev), np.ones(4))


def test_round_trips_drop_their_keep_alives_on_the_callers_thread(system):
    # A transfer keeps its host array alive; when the caller waits for it,
    # the caller's thread drops that reference: the dispatcher thread is
    # not woken (nor the GIL handed to it) for any transfer here.
    from tpushim import _tpushim
    small, back = np.arange(1024, dtype=np.float32), np.empty(1024, np.float32)
    before = _tpushim._posted_releases()
    for _ in range(50):
        dev = system.device_put(small)
        dev.ready.wait()
        system.device_get(dev, out=back)
        dev.write(small).wait()
        dev.read(back).wait()
        del dev
    np.testing.assert_array_equal(back, small)
    assert _tpushim._posted_releases() == before


def test_waiting_drops_the_kept_host_array(system):
    import weakref
    host = np.ones(1 << 18, np.float32)
    ref = weakref.ref(host)
    dev = system.device_put(host)
    released = dev.host_released  # shares the reference the put keeps
    del dev, host
    released.wait()
    assert ref() is None  # dropped by the wait, on this thread


def test_host_array_of_a_dropped_device_array_is_released(system):
    # Nobody waits: the reference goes to the dispatcher thread once the
    # transfer lets go of the array, and the array is freed (no leak).
    import time
    import weakref
    refs = []
    for _ in range(10):
        host = np.ones(1 << 16, np.float32)
        refs.append(weakref.ref(host))
        system.device_put(host)  # dropped at once
        del host
    deadline = time.monotonic() + 30
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.001)
    assert all(r() is None for r in refs)


def test_deleted_device_array(system):
    dev = system.device_put(np.ones(1024, np.float32))
    before = system.stats()["transfers"]["device_buffers_live"]
    dev.delete()
    dev.delete()  # idempotent
    assert dev.deleted
    with pytest.raises(ValueError, match="was deleted"):
        np.asarray(dev)
    assert system.stats()["transfers"]["device_buffers_live"] == before - 1


def test_registration_outlives_its_system(run_dir):
    system = make_system(run_dir)
    host = np.ones(1 << 16, np.uint8)
    reg = system.register(host)
    system.close()
    reg.unregister()  # nothing left to do: no error
    assert not reg.active




@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_fork_child_gets_named_errors_and_can_start_its_own(run_dir, tmp_path):
    system = make_system(run_dir)
    dev = system.device_put(np.arange(8))
    dev.block_until_ready()
    done = system.create_event()
    ran = threading.Event()
    done.event.add_done_callback(lambda e: ran.set())  # the parent's thread
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return
        code = 1
        try:
            os.close(read)
            lines = []
            try:
                system.device_put(np.ones(4))
            except tpushim.FailedPreconditionError as e:
                lines.append("put: FailedPreconditionError " + str(e))
            try:
                np.asarray(dev)
            except tpushim.FailedPreconditionError as e:
                lines.append("get: FailedPreconditionError")
            # A System of its own works (other chips: another run dir),
            # callbacks included (a new dispatcher thread).
            child_run = str(tmp_path / "child-run")
            os.mkdir(child_run)
            with make_system(child_run) as own:
                cb = threading.Event()
                d = own.device_put(np.arange(5))
                d.ready.add_done_callback(lambda e: cb.set())
                ok = (np.asarray(d) == np.arange(5)).all() and cb.wait(10)
                lines.append("own: %s" % ok)
            system.close()  # frees nothing of the parent's
            lines.append("closed")
            os.write(write, "\n".join(lines).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, report
    lines = report.splitlines()
    assert lines[0].startswith("put: FailedPreconditionError")
    assert "fork" in lines[0] or "process" in lines[0], lines[0]
    assert lines[1:] == ["get: FailedPreconditionError", "own: True",
                         "closed"]
    # The parent is untouched.
    np.testing.assert_array_equal(np.asarray(dev), np.arange(8))
    done.set()
    assert ran.wait(10)
    system.close()


EXIT_CHILD = r"""
import sys
import threading
import numpy as np
import tpushim

system = tpushim.System(premapped_buffer_size="16M",
                        device="sim://?link_gbps=1")
if sys.argv[1] == "pinned":
    pinned = system.pinned_empty(1 << 20, np.uint8)
devs = [system.device_put(np.ones(1 << 20, np.uint8)) for _ in range(4)]
caller = system.create_event()
caller.event.add_done_callback(
    lambda e: print("callback:", type(e.exception()).__name__, flush=True))
# A daemon thread blocked in a wait when the interpreter exits.
threading.Thread(target=caller.event.wait, daemon=True).start()
threading.Thread(target=devs[-1].block_until_ready, daemon=True).start()
print("exiting", flush=True)
"""


@pytest.mark.parametrize("variant", ["plain", "pinned"])
def test_exit_with_open_system_and_waiting_threads(subprocess_env, tmp_path,
                                                   variant):
    # Neither closed nor waited for: the interpreter's exit closes the
    # System, runs the callbacks that makes runnable, and ends the waiting
    # daemon threads without std::terminate. A pinned array alive at exit
    # keeps the runtime (and the pending event) until the interpreter's
    # last clean-up, when no callback can run any more.
    run = tmp_path / "exit-run"
    run.mkdir()
    env = dict(subprocess_env, TPUSHIM_RUN_DIR=str(run))
    done = subprocess.run([sys.executable, "-c", EXIT_CHILD, variant],
                          env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    expected = ["exiting"]
    if variant == "plain":
        expected.append("callback: CancelledError")
    assert done.stdout.splitlines() == expected
    assert "terminate" not in done.stderr
