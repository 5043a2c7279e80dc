"""tpushim.torch against Debian's PyTorch: the DataLoader pipeline into
pinned memory, with real worker processes (fork), every byte checked."""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.utils.data

import tpushim
import tpushim.torch as tt

# The batches of these tests are small (8 x 4 KiB images): the suite's
# budget is seconds, and the properties do not depend on the size.
BATCH = 8


@pytest.fixture
def system(run_dir):
    # A slow link (latency per descriptor) keeps device copies in flight
    # long enough that a slab handed back before its host_released event
    # would be overwritten while the device still reads it.
    with tpushim.System(
        premapped_buffer_size="64M", device="sim://?devices=2&latency_us=50", run_dir=run_dir
    ) as s:
        yield s


def sample(i):
    rng = np.random.default_rng(i)
    return rng.standard_normal((8, 128), dtype=np.float32)


class Images(torch.utils.data.Dataset):
    def __init__(self, n, fail_at=None, crash_at=None):
        self.n, self.fail_at, self.crash_at = n, fail_at, crash_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise ValueError("sample %d is unreadable" % i)
        if i == self.crash_at and torch.utils.data.get_worker_info() is not None:
            os._exit(7)  # a worker dies (as if OOM-killed)
        return torch.from_numpy(sample(i)), i


def producer_digest(first, count):
    h = hashlib.blake2b()
    for i in range(first, first + count):
        h.update(sample(i).tobytes())
    return h.hexdigest()


def pinned_now(system):
    """What the runtime holds pinned on the pipeline's behalf."""
    t = system.stats()["transfers"]
    region = system.stats()["region"]
    return {
        "registrations": t["registrations_live"],
        "registered_bytes": t["registered_bytes"],
        "region_allocations": region["live_allocations"],
    }


NOTHING_PINNED = {"registrations": 0, "registered_bytes": 0, "region_allocations": 0}


def check_batches(loader, count, devices=None):
    seen = 0
    for b, (images, labels) in enumerate(loader):
        shards = images if isinstance(images, list) else [images]
        got = hashlib.blake2b()
        for shard in shards:
            assert shard.dtype == np.float32
            got.update(np.asarray(shard).tobytes())
        assert got.hexdigest() == producer_digest(b * BATCH, BATCH), "batch %d" % b
        label_shards = labels if isinstance(labels, list) else [labels]
        got_labels = np.concatenate([np.asarray(s) for s in label_shards])
        np.testing.assert_array_equal(got_labels, np.arange(b * BATCH, (b + 1) * BATCH))
        seen += 1
    assert seen == count


def test_two_workers_thousand_batches_every_byte_checked(system):
    before = system.stats()["transfers"]["zero_copy_registered_transfers"][0]
    with tt.pipeline(Images(1000 * BATCH), batch_size=BATCH, num_workers=2, device=0) as loader:
        assert loader.pool.shared
        # 2 workers x prefetch_factor 2 + prefetch 2 + 1: a ring, reused.
        assert loader.pool.count == 7
        check_batches(loader, 1000)
    after = system.stats()["transfers"]["zero_copy_registered_transfers"][0]
    # The image blocks (f32[8,8,128], laid out on the device as they are on
    # the host) went straight from the registered slabs.
    assert after - before == 1000
    assert pinned_now(system) == NOTHING_PINNED


def test_a_slab_returns_to_the_ring_only_after_host_released(system, monkeypatch):
    # Every device_put of the pipeline, by the address of its host array.
    puts = []
    real_put = tpushim.device_put

    def recording_put(array, *args, **kwargs):
        dev = real_put(array, *args, **kwargs)
        puts.append((array.__array_interface__["data"][0], array.nbytes, dev))
        return dev

    monkeypatch.setattr(tpushim, "device_put", recording_put)
    early = []
    real_release = tt.PinnedBatchPool.release

    def checking_release(pool, batch):
        start = pool._slabs[batch.slab].__array_interface__["data"][0]
        for address, nbytes, dev in puts:
            if start <= address < start + pool.slab_bytes and not dev.host_released.done():
                early.append(batch.slab)
        real_release(pool, batch)

    monkeypatch.setattr(tt.PinnedBatchPool, "release", checking_release)
    for workers in (2, 0):
        puts.clear()
        with tt.pipeline(Images(50 * BATCH), batch_size=BATCH, num_workers=workers) as loader:
            check_batches(loader, 50)
        assert len(puts) == 100
    assert early == []


def test_no_workers_collates_through_the_parents_registered_mapping(system):
    before = system.stats()["transfers"]["zero_copy_registered_transfers"][0]
    with tt.pipeline(Images(200 * BATCH), batch_size=BATCH, num_workers=0, device=1) as loader:
        assert loader.pool.shared
        check_batches(loader, 200)
    assert system.stats()["transfers"]["zero_copy_registered_transfers"][0] - before == 200
    assert pinned_now(system) == NOTHING_PINNED


def test_no_workers_collates_into_the_premapped_region(system):
    before = system.stats()["transfers"]["h2d"]["zero_copy"]["transfers"]
    with tt.pipeline(
        Images(200 * BATCH), batch_size=BATCH, num_workers=0, device=1, shared=False
    ) as loader:
        assert not loader.pool.shared
        assert pinned_now(system)["region_allocations"] == loader.pool.count
        check_batches(loader, 200)
    # The image blocks straight from the region's slabs.
    assert system.stats()["transfers"]["h2d"]["zero_copy"]["transfers"] - before == 200
    assert pinned_now(system) == NOTHING_PINNED


def test_spawned_workers_open_the_slabs_through_proc(system):
    # A spawned worker inherits no descriptor: it opens the parent's memfd
    # through /proc/<pid>/fd, and the free-slab queue is the spawn
    # context's (a fork context's queue crashes a spawned process).
    loader = tt.pipeline(
        Images(5 * BATCH),
        batch_size=BATCH,
        num_workers=1,
        multiprocessing_context="spawn",
    )
    with loader:
        check_batches(loader, 5)
    assert pinned_now(system) == NOTHING_PINNED


def test_batches_split_across_devices(system):
    with tt.pipeline(Images(20 * BATCH), batch_size=BATCH, num_workers=2, device=[0, 1]) as loader:
        for images, labels in loader:
            assert [x.device for x in images] == [0, 1]
            assert [x.shape for x in images] == [(BATCH // 2, 8, 128)] * 2
        assert loader.pool.count == 7
    with tt.pipeline(Images(4 * BATCH), batch_size=BATCH, device=[0, 1, 0]) as loader:
        with pytest.raises(
            ValueError, match="batch dimension of 8 does not split evenly over 3 devices"
        ):
            next(iter(loader))
    assert pinned_now(system) == NOTHING_PINNED


def test_worker_exception_propagates_as_pytorchs(system):
    with pytest.raises(ValueError) as raised:
        with tt.pipeline(
            Images(100 * BATCH, fail_at=37), batch_size=BATCH, num_workers=2
        ) as loader:
            for _ in loader:
                pass
    # PyTorch's own wording: the worker's exception, re-raised in the main
    # process with the worker's traceback.
    assert "Caught ValueError in DataLoader worker process" in str(raised.value)
    assert "sample 37 is unreadable" in str(raised.value)
    assert pinned_now(system) == NOTHING_PINNED


def test_exception_closes_the_loader_even_outside_with(system):
    loader = tt.pipeline(Images(100 * BATCH, fail_at=5), batch_size=BATCH, num_workers=0)
    with pytest.raises(ValueError, match="sample 5 is unreadable"):
        for _ in loader:
            pass
    assert pinned_now(system) == NOTHING_PINNED
    with pytest.raises(StopIteration):
        next(loader)


def test_worker_crash_propagates_and_frees_everything(system):
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid\(s\) .*\) exited unexpectedly"
    ):
        with tt.pipeline(
            Images(100 * BATCH, crash_at=45), batch_size=BATCH, num_workers=2
        ) as loader:
            for _ in loader:
                pass
    assert pinned_now(system) == NOTHING_PINNED


def test_region_pool_is_refused_for_worker_processes(system):
    pool = tt.PinnedBatchPool(64 * 1024, 8, shared=False)
    try:
        loader = torch.utils.data.DataLoader(
            Images(64), batch_size=BATCH, num_workers=2, collate_fn=pool.collate
        )
        with pytest.raises(
            ValueError, match=r"num_workers=2 needs a PinnedBatchPool\(shared=True\)"
        ):
            tt.DeviceLoader(loader, pool)
        # Used directly, the forked worker is told why it cannot.
        with pytest.raises(RuntimeError, match="does not inherit"):
            next(iter(loader))
    finally:
        pool.close()
    assert pinned_now(system) == NOTHING_PINNED


def test_pool_too_small_for_the_loader_is_named(system):
    with tt.PinnedBatchPool(64 * 1024, 4) as pool:
        loader = torch.utils.data.DataLoader(
            Images(64), batch_size=BATCH, num_workers=2, collate_fn=pool.collate
        )
        with pytest.raises(ValueError, match=r"4 slabs is too small .* = 7 batches"):
            tt.DeviceLoader(loader, pool)
    with pytest.raises(ValueError, match="batch_bytes must be >= 1"):
        tt.PinnedBatchPool(0, 4)
    with pytest.raises(ValueError, match="does not fit the pool's batch_bytes=4096"):
        with tt.PinnedBatchPool(4096, 1, shared=False) as pool:
            pool.collate([(torch.zeros(8, 128), 0)] * BATCH)
    assert pinned_now(system) == NOTHING_PINNED


def test_collate_writes_in_place_and_tensors_share_the_slab(system):
    with tt.PinnedBatchPool(tt.batch_nbytes([Images(1)[0]] * BATCH), 2, shared=True) as pool:
        batch = pool.collate([Images(BATCH)[i] for i in range(BATCH)])
        images, labels = pool.tensors(batch)
        # torch.from_numpy over the registered slab: no copy anywhere.
        assert np.shares_memory(images.numpy(), pool._slabs[batch.slab])
        assert images.shape == (BATCH, 8, 128) and labels.dtype == torch.int64
        assert np.array_equal(images.numpy(), np.stack([sample(i) for i in range(BATCH)]))
        del images, labels
        pool.release(batch)
        assert pinned_now(system)["registrations"] == 2
    assert pinned_now(system) == NOTHING_PINNED


def test_collate_matches_default_collate_structure(system):
    samples = [
        {
            "x": torch.arange(4, dtype=torch.int32) + i,
            "name": "s%d" % i,
            "w": 0.5 * i,
            "pair": (i, np.float16(i)),
        }
        for i in range(4)
    ]
    with tt.PinnedBatchPool(tt.batch_nbytes(samples), 1, shared=False) as pool:
        batch = pool.collate(samples)
        ours = pool.tensors(batch)
        theirs = torch.utils.data.default_collate(samples)
        assert ours.keys() == theirs.keys()
        assert ours["name"] == theirs["name"]
        for key in ("x", "w"):
            assert ours[key].dtype == theirs[key].dtype
            assert torch.equal(ours[key], theirs[key])
        assert torch.equal(ours["pair"][0], theirs["pair"][0])
        assert torch.equal(ours["pair"][1], theirs["pair"][1])
        del ours
        pool.release(batch)


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, torch, tpushim, tpushim.torch as tt
    class Slow(torch.utils.data.Dataset):
        def __len__(self): return 10**6
        def __getitem__(self, i): return torch.full((8, 128), float(i % 7)), i
    with tpushim.System(premapped_buffer_size="64M") as system:
        try:
            with tt.pipeline(Slow(), batch_size=8, num_workers=2) as loader:
                for n, _ in enumerate(loader):
                    if n == 20:
                        print("running", flush=True)
        except KeyboardInterrupt:
            t = system.stats()["transfers"]
            print("interrupted registrations=%d bytes=%d" % (t["registrations_live"], t["registered_bytes"]), flush=True)
            # The runtime is still usable after the interrupt.
            d = tpushim.device_put(np.arange(1024, dtype=np.float32))
            assert np.array_equal(np.asarray(d), np.arange(1024, dtype=np.float32))
            print("usable", flush=True)
    """
)


def test_ctrl_c_stops_the_pipeline_and_frees_everything(subprocess_env):
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=subprocess_env,
    )
    try:
        assert proc.stdout.readline().strip() == "running"
        # As a terminal does: SIGINT to the whole process group (workers too).
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "interrupted registrations=0 bytes=0" in out, err
    assert "usable" in out, err
    assert proc.returncode == 0, err
