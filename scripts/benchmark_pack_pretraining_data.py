"""Benchmark pack_pretraining_data: sequences/s at L=512 on all cores, and peak memory.

    python scripts/benchmark_pack_pretraining_data.py [--copies 4]

Makes unpacked data from the shipped sample (copied --copies times, dupe_factor 10, L=512,
P=76), then packs it at depth 3 into 8 shards with every core, and reports the seconds of each
pass, the sequences per second and the peak resident memory. TensorFlow is imported before the
clock starts: its ~5 s import is a fixed cost of the job, not a per-sequence one.
"""

from __future__ import annotations

import argparse
import glob
import os
import resource
import shutil
import tempfile
import time

from bert_packed.data.create_dataset import DatasetSettings, create_pretraining_dataset
from bert_packed.data.pack_dataset import PackSettings, pack_pretraining_dataset, verify_packed_dataset
from bert_packed.data.pretraining import MaskingConfig
from bert_packed.data.schema import Shapes
from sample_corpus import VOCAB, copy_sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=4, help="copies of the sample in the unpacked data")
    parser.add_argument("--num_workers", type=int, default=0)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench_pack_")
    try:
        unpacked = os.path.join(work, "unpacked")
        settings = DatasetSettings(VOCAB, True, MaskingConfig(512, 76), 10, 12345)
        create_pretraining_dataset(copy_sample(os.path.join(work, "corpus"), args.copies), unpacked, settings,
                                   args.num_workers)
        start = time.perf_counter()
        import tensorflow  # noqa: F401  (fixed start-up cost, outside the clock)
        import_seconds = time.perf_counter() - start

        files = sorted(glob.glob(os.path.join(unpacked, "*.tfrecord")))
        start = time.perf_counter()
        metadata = pack_pretraining_dataset(files, os.path.join(work, "packed"),
                                            PackSettings(Shapes(512, 76, 3), "lp", num_shards=8), args.num_workers)
        seconds = time.perf_counter() - start
        verify_start = time.perf_counter()
        verify_packed_dataset(os.path.join(work, "packed"))
        verify_seconds = time.perf_counter() - verify_start
        peak_mb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
        rate = metadata["num_sequences"] / seconds
        passes = ", ".join(f"{name} {value:.1f} s" for name, value in metadata["seconds"].items())
        print(f"\npacked {metadata['num_sequences']:,} sequences (L=512) into {metadata['num_packs']:,} packs "
              f"(packing factor {metadata['packing_factor']:.3f}, efficiency {metadata['efficiency']:.2%}) "
              f"in {seconds:.1f} s on {args.num_workers or os.cpu_count()} cores ({passes}): {rate:,.0f} sequences/s "
              f"(target >= 20,000: {'PASS' if rate >= 20000 else 'FAIL'}); TensorFlow import {import_seconds:.1f} s "
              f"before; --verify {verify_seconds:.1f} s; peak memory {peak_mb:,.0f} MB (target < 2,048)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
