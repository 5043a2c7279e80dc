"""The order of one array's operations from Python, and shutdown in the
middle of a transfer on a slow modelled link: several threads writing one
DeviceArray never hang it; closing a System (or Ctrl-C, then the process's
exit) never waits out the model's link time."""

import signal
import subprocess
import sys
import threading
import time

import numpy as np

import tpushim


def test_threads_writing_one_array_never_hang_it(system):
    d = system.device_put(np.zeros(4096, np.uint8))
    d.block_until_ready()
    errors = []

    def writer(value):
        try:
            for _ in range(200):
                d.write(np.full(4096, value, np.uint8))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(v,)) for v in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    assert not errors
    assert d.ready.wait(timeout=30), "the array's ready event never resolved"
    back = np.asarray(d)
    # One whole write won: the writes of one array never interleave.
    assert back[0] in (1, 2, 3)
    assert (back == back[0]).all()


def test_a_read_right_after_a_write_returns_the_write(system):
    d = system.device_put(np.zeros(1 << 16, np.uint8))
    for value in range(1, 40):
        d.write(np.full(1 << 16, value, np.uint8))
        assert (np.asarray(d) == value).all()


def test_close_in_the_middle_of_a_slow_transfer_waits_out_no_link_time(
        run_dir):
    # 0.001 Gbit/s: 8 MiB would hold the modelled link for over a minute.
    s = tpushim.System(premapped_buffer_size="64M",
                       device="sim://?link_gbps=0.001", run_dir=run_dir)
    d = s.device_put(np.ones(8 << 20, np.uint8))
    time.sleep(0.05)
    start = time.monotonic()
    s.close()
    elapsed = time.monotonic() - start
    assert d.ready.done()
    assert elapsed < 5, f"close took {elapsed:.1f} s"


CHILD = r"""
import sys, time
import numpy as np
import tpushim

with tpushim.System(premapped_buffer_size="64M",
                    device="sim://?link_gbps=0.001") as system:
    d = system.device_put(np.ones(8 << 20, np.uint8))
    print("waiting", flush=True)
    try:
        d.block_until_ready()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
print("closed", flush=True)
"""


def test_ctrl_c_in_a_slow_transfer_then_exit_takes_no_link_time(
        subprocess_env, run_dir):
    env = dict(subprocess_env, TPUSHIM_RUN_DIR=run_dir)
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = child.communicate(timeout=60)
        elapsed = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert "interrupted" in out and "closed" in out
    assert elapsed < 10, f"the process took {elapsed:.1f} s to exit"
