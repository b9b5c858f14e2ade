"""Benchmark create_pretraining_data: throughput, and output statistics against the reference.

    python scripts/benchmark_create_pretraining_data.py

1. Statistics: the shipped 3 MB Wikipedia sample at L=512, P=76, dupe_factor 1, seed 12345,
   beside the figures of the pure-Python MLPerf reference script on the same text (from the
   issue: 2,397 instances, ~30% padding, 57% exactly 512 long, 53 predictions each, ~50% NSP
   random next; ~480 instances/s of work on one core).
2. Throughput: instances/s on all cores (tokenization, masking, encoding and writing included),
   on the sample copied --copies times (so process start-up is amortised as on real data).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from _sample_corpus import SAMPLE, VOCAB, copy_sample
from absl import flags

from bert_packed.cli.common import run
from bert_packed.pretraining_data.create_dataset import DatasetSettings, create_pretraining_dataset
from bert_packed.pretraining_data.instances import MaskingConfig

REFERENCE = {"num_instances": 2397, "padding_fraction": 0.30, "full_length_fraction": 0.57,
             "predictions_per_instance": 53.0, "random_next_fraction": 0.50}
REFERENCE_RATE = 480.0

FLAGS = flags.FlagValues()
flags.DEFINE_integer("copies", 4, "Copies of the sample for the throughput run.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("dupe_factor", 10, "Passes over the text, each masked anew (the MLPerf recipe uses 10).",
                     lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("num_workers", 0, "Worker processes (0: one per core).", lower_bound=0, flag_values=FLAGS)

PROGRAM = "benchmark_create_pretraining_data"


def main(argv) -> int:
    """Returns the exit status: 1 when a target is missed."""
    del argv
    work = tempfile.mkdtemp(prefix="bench_create_")
    try:
        settings = DatasetSettings(VOCAB, True, MaskingConfig(512, 76), 1, 12345)
        stats = create_pretraining_dataset(SAMPLE, os.path.join(work, "stats"), settings, FLAGS.num_workers)
        print("\n| statistic (sample, L=512, dupe_factor 1) | reference | bert-packed |")
        print("|---|---|---|")
        print(f"| instances | {REFERENCE['num_instances']:,} | {stats['num_instances']:,} |")
        print(f"| instances per document | {REFERENCE['num_instances'] / 121:.1f} | "
              f"{stats['num_instances'] / stats['num_documents']:.1f} |")
        for key, label in [("padding_fraction", "padding"), ("full_length_fraction", "exactly 512 long"),
                           ("random_next_fraction", "NSP random next")]:
            print(f"| {label} | {REFERENCE[key]:.0%} | {stats[key]:.1%} |")
        print(f"| predictions per instance | {REFERENCE['predictions_per_instance']:.0f} | "
              f"{stats['predictions_per_instance']:.1f} |")

        files = copy_sample(os.path.join(work, "corpus"), FLAGS.copies)
        settings = DatasetSettings(VOCAB, True, MaskingConfig(512, 76), FLAGS.dupe_factor, 12345)
        start = time.perf_counter()
        result = create_pretraining_dataset(files, os.path.join(work, "throughput"), settings, FLAGS.num_workers)
        seconds = time.perf_counter() - start
        rate = result["num_instances"] / seconds
        print(f"\nthroughput: {result['num_instances']:,} instances from {len(files)} files "
              f"({FLAGS.copies} x the sample, dupe_factor {FLAGS.dupe_factor}) in {seconds:.1f} s on "
              f"{FLAGS.num_workers or os.cpu_count()} workers: {rate:,.0f} instances/s = "
              f"{rate / REFERENCE_RATE:.1f}x the reference's ~{REFERENCE_RATE:.0f}/s "
              f"(target >= 5,000/s: {'PASS' if rate >= 5000 else 'FAIL'})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if rate >= 5000 else 1


if __name__ == "__main__":
    run(main, PROGRAM, (), "Nothing is kept", flag_values=FLAGS)
