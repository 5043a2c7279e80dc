#!/usr/bin/python3
"""The Python package against the C++ API and against PyTorch's own path,
interleaved in one run (memory bandwidth on a shared VM drifts by tens of
percent within seconds: each ratio is taken within a round, and a figure is
the median of the rounds' values, with their spread, min..max).

  put      device_put + ready.wait() of a --size (256 MiB) float32 array
           from a pinned_empty array, against the same transfer made by the
           C++ API (bench/python_peer: AllocateInMemory +
           TransferArrayToDeviceWithEvents from a PinnedHostBuffer, awaited).
           Goal: Python throughput >= 0.9x C++.
  rt4k     a 4 KiB round trip: device_put + ready.wait() + device_get(out=)
           from pageable NumPy memory, p50 over --rt-count trips, against
           the C++ API's same calls. Goal: Python p50 <= C++ p50 + 10 us.
  loader   a DataLoader of f32[64,128] samples, batches of 64, 2 workers:
           tpushim.torch's pipeline (workers collate into registered
           shared slabs, zero-copy device_put) against the same loop
           handing PyTorch's own (pageable, shared-memory) batches to
           device_put, both with two batches in flight. Batches per second.

  PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py [--build build]
      [--rounds 9] [--size 256M] [--rt-count 300] [--loader-batches 200]
      [--only put,rt4k,loader] [--short]

--short (ctest python_bench_ci) runs everything at small sizes to show the
script works; its figures mean nothing.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.utils.data

import tpushim
import tpushim.torch as tt


def parse_size(text):
    text = text.strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def spread(values, fmt):
    return "%s (%s..%s)" % (fmt % statistics.median(values), fmt % min(values), fmt % max(values))


class Peer:
    """bench/python_peer, the C++ side, in a process of its own."""

    def __init__(self, path, region, run_dir):
        env = dict(os.environ, TPUSHIM_RUN_DIR=run_dir, TPU_LOG_DIR="disabled")
        self.proc = subprocess.Popen(
            [path, "--region=%d" % region],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError("python_peer did not start: %r" % line)

    def times(self, command, shape, rounds):
        self.proc.stdin.write("%s %s %d\n" % (command, shape, rounds))
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if line.startswith("error") or not line:
            raise RuntimeError("python_peer: %s" % line)
        return [int(x) / 1e9 for x in line.split()]

    def close(self):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def py_put(array):
    start = time.perf_counter()
    d = tpushim.device_put(array)
    d.ready.wait()
    seconds = time.perf_counter() - start
    del d
    return seconds


def py_round_trips(array, out, count):
    times = []
    for _ in range(count):
        start = time.perf_counter()
        d = tpushim.device_put(array)
        d.ready.wait()
        tpushim.device_get(d, out=out)
        times.append(time.perf_counter() - start)
        del d
    return times


class Samples(torch.utils.data.Dataset):
    """f32[64,128] samples (32 KiB) that cost nothing to make: the loader is
    measured, not the dataset."""

    def __init__(self, n):
        self.n = n
        self.base = [torch.full((64, 128), float(i)) for i in range(8)]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.base[i % 8], i


def pageable_loop(loader, prefetch=2):
    """What a framework without a pinned pool does: device_put PyTorch's
    batches as they come (pageable memory: staged or pinned per call)."""
    pending = []
    for images, labels in loader:
        pending.append((tpushim.device_put(images.numpy()), tpushim.device_put(labels.numpy())))
        if len(pending) >= prefetch:
            for d in pending.pop(0):
                d.ready.wait()
            yield
    for batch in pending:
        for d in batch:
            d.ready.wait()
        yield


def loader_rate(kind, batches, batch_size, workers):
    dataset = Samples(batches * batch_size)
    start = time.perf_counter()
    n = 0
    if kind == "tpushim":
        with tt.pipeline(dataset, batch_size=batch_size, num_workers=workers) as loader:
            for _ in loader:
                n += 1
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers)
        for _ in pageable_loop(loader):
            n += 1
    assert n == batches
    return batches / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--size", default="256M")
    p.add_argument("--rt-count", type=int, default=300)
    p.add_argument("--loader-batches", type=int, default=200)
    p.add_argument("--only", default="put,rt4k,loader")
    p.add_argument("--short", action="store_true")
    args = p.parse_args()
    if args.short:
        args.rounds, args.size, args.rt_count, args.loader_batches = 2, "4M", 20, 10
    size = parse_size(args.size)
    only = set(args.only.split(","))
    rows = (size // 4) // 1024
    put_shape = "f32[%d,1024]" % rows
    region = 2 * size + (64 << 20)
    peer_path = os.path.join(args.build, "bench", "python_peer")

    print(
        "python_bench: %d rounds, %s put, %d-trip 4 KiB round trips, %d-batch loaders; %d CPUs, load %.2f"
        % (
            args.rounds,
            args.size,
            args.rt_count,
            args.loader_batches,
            os.cpu_count(),
            os.getloadavg()[0],
        )
    )
    with tempfile.TemporaryDirectory(prefix="python_bench.") as tmp:
        os.environ["TPUSHIM_RUN_DIR"] = os.path.join(tmp, "py")
        os.makedirs(os.environ["TPUSHIM_RUN_DIR"])
        os.makedirs(os.path.join(tmp, "cpp"))
        peer = Peer(peer_path, region, os.path.join(tmp, "cpp")) if only & {"put", "rt4k"} else None
        with tpushim.System(premapped_buffer_size=region, log_dir="disabled"):
            ratios, py_gbps, cpp_gbps = [], [], []
            rt_py, rt_cpp, rt_diff = [], [], []
            loader_ratio, ours, theirs = [], [], []
            pinned = tpushim.pinned_empty((rows, 1024), np.float32)
            pinned.fill(1.0)
            small, back = np.ones(1024, np.float32), np.empty(1024, np.float32)
            # Warm up both sides: first touches of device memory and staging.
            if "put" in only:
                py_put(pinned)
                peer.times("put", put_shape, 1)
            if "rt4k" in only:
                py_round_trips(small, back, 50)
                peer.times("rt", "f32[1024]", 50)
            for r in range(args.rounds):
                python_first = r % 2 == 0
                if "put" in only:
                    if python_first:
                        py_s = py_put(pinned)
                        cpp_s = peer.times("put", put_shape, 1)[0]
                    else:
                        cpp_s = peer.times("put", put_shape, 1)[0]
                        py_s = py_put(pinned)
                    ratios.append(cpp_s / py_s)
                    py_gbps.append(size / py_s / 1e9)
                    cpp_gbps.append(size / cpp_s / 1e9)
                if "rt4k" in only:
                    if python_first:
                        py_t = py_round_trips(small, back, args.rt_count)
                        cpp_t = peer.times("rt", "f32[1024]", args.rt_count)
                    else:
                        cpp_t = peer.times("rt", "f32[1024]", args.rt_count)
                        py_t = py_round_trips(small, back, args.rt_count)
                    rt_py.append(statistics.median(py_t) * 1e6)
                    rt_cpp.append(statistics.median(cpp_t) * 1e6)
                    rt_diff.append(rt_py[-1] - rt_cpp[-1])
                if "loader" in only:
                    if python_first:
                        a = loader_rate("tpushim", args.loader_batches, 64, 2)
                        b = loader_rate("pageable", args.loader_batches, 64, 2)
                    else:
                        b = loader_rate("pageable", args.loader_batches, 64, 2)
                        a = loader_rate("tpushim", args.loader_batches, 64, 2)
                    ours.append(a)
                    theirs.append(b)
                    loader_ratio.append(a / b)
            del pinned
        if peer is not None:
            peer.close()

    failed = False
    if ratios:
        med = statistics.median(ratios)
        print(
            "put %-10s Python %s GB/s, C++ %s GB/s, Python/C++ %s  goal >= 0.90: %s"
            % (
                args.size,
                spread(py_gbps, "%.2f"),
                spread(cpp_gbps, "%.2f"),
                spread(ratios, "%.3f"),
                "met" if med >= 0.9 else "MISSED",
            )
        )
        failed |= med < 0.9
    if rt_diff:
        med = statistics.median(rt_diff)
        print(
            "rt4k p50       Python %s us, C++ %s us, Python - C++ %s us  goal <= +10 us: %s"
            % (
                spread(rt_py, "%.1f"),
                spread(rt_cpp, "%.1f"),
                spread(rt_diff, "%+.1f"),
                "met" if med <= 10 else "MISSED",
            )
        )
        failed |= med > 10
    if loader_ratio:
        print(
            "loader         tpushim.torch %s batches/s, pageable batches %s batches/s, ratio %s"
            % (spread(ours, "%.1f"), spread(theirs, "%.1f"), spread(loader_ratio, "%.2f"))
        )
    return 0 if args.short or not failed else 1


if __name__ == "__main__":
    sys.exit(main())
