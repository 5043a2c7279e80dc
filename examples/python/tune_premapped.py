#!/usr/bin/python3
"""Sweeps the premapped buffer size from Python: one tpushim.System per point.

For each size it brings a System up with that region (the keyword
premapped_buffer_size, or with --env the variable TPU_PREMAPPED_BUFFER_SIZE
as a job script would set it), device_puts --transfers arrays of --size
bytes from ordinary (pageable) NumPy memory, as a framework's input
pipeline does, waits for each, and prints start-up time, device_put
throughput and the paths the transfers took.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/tune_premapped.py
    ... --sizes 0,64M,256M,1G --size 32M --transfers 64

A region smaller than a transfer (or off, 0) makes the runtime pin the
caller's pages for each transfer; one that holds it stages the copy
through the region instead. Which is faster depends on the machine: that is
what the sweep is for.
"""

import argparse
import os
import sys
import time

import numpy as np

import tpushim


def run_point(size, args):
    options = {"device": args.device}
    if args.env:
        os.environ["TPU_PREMAPPED_BUFFER_SIZE"] = str(size)
    else:
        options["premapped_buffer_size"] = size
    start = time.perf_counter()
    try:
        system = tpushim.System(**options)
    except tpushim.Error as e:
        return {"size": size, "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0])}
    with system:
        startup = time.perf_counter() - start
        elements = args.size // 4
        arrays = [np.full(elements, i, dtype=np.float32) for i in range(2)]
        tpushim.device_put(arrays[0]).ready.wait()  # warm up: first touch of HBM
        before = system.stats()["transfers"]["h2d"]
        t0 = time.perf_counter()
        for i in range(args.transfers):
            dev = tpushim.device_put(arrays[i % 2])
            dev.ready.wait()
            del dev
        seconds = time.perf_counter() - t0
        after = system.stats()["transfers"]["h2d"]
        paths = {
            p: after[p]["transfers"] - before[p]["transfers"]
            for p in ("zero_copy", "staged", "pinned")
        }
    return {
        "size": size,
        "startup_s": startup,
        "gbps": args.transfers * args.size / seconds / 1e9,
        "paths": paths,
    }


def parse_size(text):
    """Bytes from "4096", "64M" or "1G" (1024-based)."""
    text = text.strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def human(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n and n % scale == 0:
            return "%d%s" % (n // scale, unit)
    return str(n)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", default="0,64M,256M,1G", help="comma list of region sizes (bytes or 64M, 1G)"
    )
    p.add_argument("--size", default="32M", help="bytes of each device_put")
    p.add_argument("--transfers", type=int, default=64)
    p.add_argument("--device", default="sim://")
    p.add_argument(
        "--env", action="store_true", help="set TPU_PREMAPPED_BUFFER_SIZE instead of the keyword"
    )
    args = p.parse_args()
    args.size = parse_size(args.size)
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    print(
        "device_put of %s float32 arrays from pageable memory, %d per point, %s"
        % (human(args.size), args.transfers, args.device)
    )
    print(
        "%-8s %10s %12s  %s"
        % ("region", "start-up", "device_put", "paths (zero_copy/staged/pinned)")
    )
    failed = 0
    for size in sizes:
        r = run_point(size, args)
        if "error" in r:
            print("%-8s %s" % (human(size), r["error"]))
            failed += 1
            continue
        print(
            "%-8s %8.3f s %7.2f GB/s  %d/%d/%d"
            % (
                human(size),
                r["startup_s"],
                r["gbps"],
                r["paths"]["zero_copy"],
                r["paths"]["staged"],
                r["paths"]["pinned"],
            )
        )
    # The table is whole either way; a point that could not run fails the
    # sweep (exit 1) for scripts.
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
