"""Events as Python expects them: wait/done with timeouts,
concurrent.futures' result()/exception(), done callbacks on the module's
dispatcher thread (errors reported, never lost), and await in asyncio."""

import asyncio
import sys
import threading

import numpy as np
import pytest

import tpushim


def test_wait_done_and_result_of_a_transfer(system):
    dev = tpushim.device_put(np.ones(1024, np.float32))
    assert dev.ready.wait(timeout=30) is True
    assert dev.ready.done()
    assert dev.ready.result() is None
    assert dev.ready.exception() is None
    assert dev.host_released.done()


def test_pending_event_times_out(system):
    caller = system.create_event()
    event = caller.event
    assert not event.done()
    assert event.wait(timeout=0) is False
    assert event.wait(timeout=0.05) is False
    with pytest.raises(TimeoutError):
        event.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        event.exception(timeout=0)
    caller.set()
    assert event.wait(timeout=0) is True


def test_negative_timeout_is_a_value_error(system):
    with pytest.raises(ValueError, match=r"timeout=-1\.0: must be >= 0"):
        system.create_event().event.wait(timeout=-1)


def test_failed_event_raises_its_error(system):
    caller = system.create_event()
    caller.set(tpushim.ResourceExhaustedError("out of staging"))
    event = caller.event
    with pytest.raises(tpushim.ResourceExhaustedError, match="out of staging"):
        event.wait()
    with pytest.raises(tpushim.ResourceExhaustedError):
        event.result()
    error = event.exception()
    assert isinstance(error, tpushim.ResourceExhaustedError)
    assert error.code == 8 and error.message == "out of staging"
    assert "failed" in repr(event)


def test_setting_twice_is_failed_precondition(system):
    caller = system.create_event()
    caller.set()
    with pytest.raises(tpushim.FailedPreconditionError, match="already set"):
        caller.set()


def test_dropped_caller_event_fails_with_cancelled(system):
    caller = system.create_event()
    event = caller.event
    del caller
    with pytest.raises(tpushim.CancelledError):
        event.result(timeout=5)


def test_callbacks_run_on_the_dispatcher_thread(system):
    caller = system.create_event()
    seen = []
    ran = threading.Event()

    def callback(event):
        seen.append((event, threading.current_thread().name, event.done()))
        ran.set()

    caller.event.add_done_callback(callback)
    assert not ran.wait(0.05)  # not before the event is done
    caller.set()
    assert ran.wait(10)
    event, thread, done = seen[0]
    assert thread == "tpushim-dispatcher" and done
    assert isinstance(event, tpushim.Event)


def test_callback_on_a_done_event_runs_soon(system):
    dev = tpushim.device_put(np.ones(8, np.int8))
    dev.block_until_ready()
    ran = threading.Event()
    dev.ready.add_done_callback(lambda event: ran.set())
    assert ran.wait(10)


def test_callbacks_run_in_order(system):
    caller = system.create_event()
    order = []
    done = threading.Event()
    for i in range(20):
        caller.event.add_done_callback(lambda event, i=i: order.append(i))
    caller.event.add_done_callback(lambda event: done.set())
    caller.set()
    assert done.wait(10)
    assert order == list(range(20))


def test_a_callback_that_raises_is_reported_not_lost(system, monkeypatch):
    reports = []
    reported = threading.Event()

    def hook(unraisable):
        reports.append(unraisable)
        reported.set()

    monkeypatch.setattr(sys, "unraisablehook", hook)
    caller = system.create_event()
    after = threading.Event()

    def bad(event):
        raise RuntimeError("callback failed on purpose")

    caller.event.add_done_callback(bad)
    caller.event.add_done_callback(lambda event: after.set())
    caller.set()
    assert reported.wait(10)
    assert after.wait(10)  # the callbacks after it still run
    assert isinstance(reports[0].exc_value, RuntimeError)
    assert "callback failed on purpose" in str(reports[0].exc_value)
    assert "done callback" in str(reports[0].object)
    # The runtime goes on.
    dev = tpushim.device_put(np.arange(4))
    np.testing.assert_array_equal(np.asarray(dev), np.arange(4))


def test_add_done_callback_needs_a_callable(system):
    with pytest.raises(TypeError, match="callable"):
        system.create_event().event.add_done_callback(42)


def test_await_in_asyncio(system):
    async def main():
        dev = tpushim.device_put(np.arange(1000, dtype=np.float32))
        await dev.ready
        caller = system.create_event()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, caller.set)
        await caller.event
        failing = system.create_event()
        loop.call_later(0.01, failing.set,
                        tpushim.UnavailableError("device gone"))
        with pytest.raises(tpushim.UnavailableError, match="device gone"):
            await failing.event
        return np.asarray(dev)

    out = asyncio.run(main())
    np.testing.assert_array_equal(out, np.arange(1000, dtype=np.float32))


def test_await_with_asyncio_timeout(system):
    async def main():
        caller = system.create_event()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(caller.event, timeout=0.05)
        caller.set()

    asyncio.run(main())


def test_waits_release_the_gil(system):
    # Another Python thread runs while the main thread waits.
    caller = system.create_event()
    counter = []

    def spin():
        for _ in range(50):
            counter.append(1)
        caller.set()

    thread = threading.Thread(target=spin)
    thread.start()
    assert caller.event.wait(timeout=30)
    thread.join()
    assert len(counter) == 50
