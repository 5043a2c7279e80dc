#!/usr/bin/python3
"""A PyTorch input pipeline that feeds tpushim's devices without host copies.

Worker processes collate each batch straight into shared-memory slabs the
main process registered for DMA (tpushim.torch.PinnedBatchPool); the main
process device_puts each batch from its own registered mapping of the same
pages, and keeps the next batch's copy in flight while the step runs on the
current one (tpushim.torch.DeviceLoader). Every batch that reaches a device
is read back and compared, byte for byte, with what the dataset produced.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/dataloader_pipeline.py
    ... --batches 2000 --batch-size 64 --workers 2 --devices 2

Samples are f32[8,128] "images" and an int64 label: a batch's image block,
f32[B,8,128], has TPU's tiled layout equal to its dense bytes, so the
device DMAs it straight out of the registered slab (counted as zero-copy
from registered memory); the labels, s64[B], are padded on the device to
a whole tile and go through the copy that lays them out.
"""

import argparse
import hashlib
import sys
import time

import numpy as np
import torch.utils.data

import tpushim
import tpushim.torch


class Images(torch.utils.data.Dataset):
    """Sample i: f32[8,128] drawn from a generator seeded with i, and i."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return torch.from_numpy(rng.standard_normal((8, 128), dtype=np.float32)), i


def expected_digest(dataset, first, count):
    """The producer's hash of the image block of samples [first, first+count)."""
    h = hashlib.blake2b()
    for i in range(first, first + count):
        h.update(dataset[i][0].numpy().tobytes())
    return h.hexdigest()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--devices", type=int, default=2, help="simulated devices; each batch is split across them"
    )
    p.add_argument("--region", default="256M", help="premapped_buffer_size")
    p.add_argument("--no-check", action="store_true", help="skip reading every batch back")
    args = p.parse_args()

    dataset = Images(args.batches * args.batch_size)
    devices = list(range(args.devices))
    with tpushim.System(
        premapped_buffer_size=args.region, device="sim://?devices=%d" % args.devices
    ) as system:
        before = system.stats()["transfers"]
        start = time.perf_counter()
        batches = 0
        with tpushim.torch.pipeline(
            dataset, batch_size=args.batch_size, num_workers=args.workers, device=devices
        ) as loader:
            print(
                "pool: %d slabs of %d bytes, %s"
                % (
                    loader.pool.count,
                    loader.pool.slab_bytes,
                    "shared memory, registered" if loader.pool.shared else "premapped region",
                )
            )
            for images, labels in loader:
                # images: one DeviceArray per device (a shard of the batch).
                if not args.no_check:
                    got = hashlib.blake2b()
                    for shard in images:
                        got.update(np.asarray(shard).tobytes())
                    first = batches * args.batch_size
                    if got.hexdigest() != expected_digest(dataset, first, args.batch_size):
                        print("batch %d: device bytes differ from the dataset's" % batches)
                        return 1
                    got_labels = np.concatenate([np.asarray(s) for s in labels])
                    if not np.array_equal(got_labels, np.arange(first, first + args.batch_size)):
                        print("batch %d: labels differ" % batches)
                        return 1
                batches += 1
        seconds = time.perf_counter() - start
        after = system.stats()["transfers"]
        zero_copy = (
            after["zero_copy_registered_transfers"][0] - before["zero_copy_registered_transfers"][0]
        )
        image_bytes = batches * args.batch_size * 8 * 128 * 4
        print(
            "batches             %d of %d samples, %d workers, %d devices"
            % (batches, args.batch_size, args.workers, args.devices)
        )
        print(
            "throughput          %.1f batches/s, %.1f MB/s of images"
            % (batches / seconds, image_bytes / seconds / 1e6)
        )
        print("zero-copy transfers %d from registered memory" % zero_copy)
        print("registered now      %d bytes" % after["registered_bytes"])
        print("data verified" if not args.no_check else "data not checked (--no-check)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
