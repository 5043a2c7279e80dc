"""The Python side of events: the dispatcher thread, concurrent.futures'
result()/exception(), and ``await event`` for asyncio.

Callbacks never run on the runtime's threads: the runtime's callback
thread only posts to the extension's completion queue, and one daemon
thread of this module (the dispatcher) runs them with the GIL, in the
order they became runnable. An exception a callback raises goes to
sys.unraisablehook (never lost, never fatal). The dispatcher also drops
the references that kept host arrays alive for transfers whose holders
(DeviceArray, events) went before the transfer finished; otherwise the
thread that sees the transfer done drops them itself.

fork(): os.register_at_fork gives the child a fresh queue and, on first
use, its own dispatcher thread.
"""

import asyncio
import os
import threading

from . import _tpushim

_lock = threading.Lock()
_thread = None


def _run():
    while True:
        for fn, arg in _tpushim._next_completions(None):
            try:
                fn(arg)
            except BaseException as error:  # noqa: B036 - reported, not lost
                _tpushim._write_unraisable(
                    error, "tpushim Event done callback %r" % (fn,))
            del fn, arg


def ensure_dispatcher():
    """Starts the dispatcher thread once per process."""
    global _thread
    if _thread is not None:
        return
    with _lock:
        if _thread is None:
            thread = threading.Thread(target=_run, name="tpushim-dispatcher",
                                      daemon=True)
            thread.start()
            _thread = thread


def run_pending():
    """Runs the callbacks queued now on the calling thread (at exit, when
    the dispatcher thread may no longer get to them)."""
    while True:
        batch = _tpushim._next_completions(0)
        if not batch:
            return
        for fn, arg in batch:
            try:
                fn(arg)
            except BaseException as error:  # noqa: B036 - reported
                _tpushim._write_unraisable(
                    error, "tpushim Event done callback %r" % (fn,))
        del batch


def _after_fork_in_child():
    global _lock, _thread
    _tpushim._after_fork_in_child()
    _lock = threading.Lock()
    _thread = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _result(self, timeout=None):
    """Waits (like concurrent.futures.Future.result); returns None when the
    operation succeeded, raises its tpushim.Error when it failed and
    TimeoutError when `timeout` seconds pass first."""
    done, error = self._wait_status(timeout)
    if not done:
        raise TimeoutError("tpushim.Event not done after %s s" % timeout)
    if error is not None:
        raise error
    return None


def _exception(self, timeout=None):
    """The operation's tpushim.Error, or None when it succeeded; waits as
    result() does (TimeoutError)."""
    done, error = self._wait_status(timeout)
    if not done:
        raise TimeoutError("tpushim.Event not done after %s s" % timeout)
    return error


def _add_done_callback(self, fn):
    ensure_dispatcher()
    _tpushim.Event._add_done_callback_native(self, fn)


def _await(self):
    if self.done():
        return self.result()
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(event):
        # On the dispatcher thread: hand over to the loop's thread.
        def set_result():
            if future.cancelled():
                return
            done, error = event._wait_status(0)
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(None)
        try:
            loop.call_soon_threadsafe(set_result)
        except RuntimeError:
            pass  # the loop is closed: nobody awaits any more

    self.add_done_callback(settle)
    return (yield from future.__await__())


_tpushim.Event._add_done_callback_native = _tpushim.Event.add_done_callback
_tpushim.Event.add_done_callback = _add_done_callback
_tpushim.Event.result = _result
_tpushim.Event.exception = _exception
_tpushim.Event.__await__ = _await
