"""Benchmark pack_pretraining_data: sequences/s at L=512 on all cores, and peak memory.

    python scripts/benchmark_pack_pretraining_data.py [--copies 16] [--runs 3]

Makes unpacked data from the shipped sample (copied --copies times, dupe_factor 10, L=512,
P=76; 16 copies give ~340k sequences, 870 MB) in a subprocess, then packs it at depth 3 with the
`lp` planner into 8 shards on every core, --runs times, and reports for each run the seconds of
each pass, the sequences per second (all of the job: reading, planning, assigning, writing,
checking) and the peak resident memory of this process (the packer's). The first run also pays
for loading the compiled loops (numba's cache; compiling them the very first time on a machine
takes ~15 s more). Then, side by side on the same records: our compiled parser (framing and
checksums included) against TensorFlow's tf.io.parse_example (records already in memory), and
our encoder writing the packed records of one shard.
"""

from __future__ import annotations

import glob
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from _sample_corpus import copy_sample
from absl import flags

from bert_packed.cli.common import run
from bert_packed.console.tensorflow_loading import import_tensorflow
from bert_packed.features import Shapes, float_features, tf_feature_spec
from bert_packed.inputs.dataset import Dataset
from bert_packed.packing.pack_dataset import PackSettings, pack_pretraining_dataset
from bert_packed.packing.verify import verify_packed_dataset
from bert_packed.records import TFRecordWriter, read_batches, read_packed, read_records

SCRIPTS = os.path.dirname(os.path.abspath(__file__))

FLAGS = flags.FlagValues()
flags.DEFINE_integer("copies", 16, "Copies of the sample in the unpacked data.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("runs", 3, "Packing runs on the same data.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("num_workers", 0, "Threads (0: one per core).", lower_bound=0, flag_values=FLAGS)

PROGRAM = "benchmark_pack_pretraining_data"


def main(argv) -> int:
    """Returns the exit status: 1 when a target is missed."""
    del argv
    work = tempfile.mkdtemp(prefix="bench_pack_")
    try:
        unpacked = os.path.join(work, "unpacked")
        corpus = copy_sample(os.path.join(work, "corpus"), FLAGS.copies)
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "create_pretraining_data.py"),
                        f"--input_file={','.join(corpus)}", f"--output_dir={unpacked}", "--max_seq_length=512",
                        "--max_predictions_per_seq=76", "--dupe_factor=10"], check=True, stdout=subprocess.DEVNULL)
        files = sorted(glob.glob(os.path.join(unpacked, "*.tfrecord")))
        input_mb = sum(os.path.getsize(path) for path in files) / 2**20
        rates = []
        for run_index in range(FLAGS.runs):  # not `run`: the command runner's name
            output = os.path.join(work, "packed")
            shutil.rmtree(output, ignore_errors=True)
            start = time.perf_counter()
            metadata = pack_pretraining_dataset(Dataset.open(files, "--input_files"), output,
                                                PackSettings(Shapes(512, 76, 3), "lp", num_shards=8), FLAGS.num_workers)
            seconds = time.perf_counter() - start
            verify_start = time.perf_counter()
            verify_packed_dataset(output)
            verify_seconds = time.perf_counter() - verify_start
            rates.append(metadata["num_sequences"] / seconds)
            passes = ", ".join(f"{name} {value:.1f} s" for name, value in metadata["seconds"].items())
            print(f"run {run_index + 1}: packed {metadata['num_sequences']:,} sequences (L=512, {input_mb:,.0f} MB) into "
                  f"{metadata['num_packs']:,} packs (packing factor {metadata['packing_factor']:.3f}, efficiency "
                  f"{metadata['efficiency']:.2%}) in {seconds:.1f} s on {FLAGS.num_workers or os.cpu_count()} cores "
                  f"({passes}): {rates[-1]:,.0f} sequences/s; --verify {verify_seconds:.1f} s", flush=True)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        best, median = max(rates), sorted(rates)[len(rates) // 2]
        met = median >= 20000 and peak_mb < 2048
        print(f"\nmedian {median:,.0f} sequences/s, best {best:,.0f} (target >= 20,000), peak memory "
              f"{peak_mb:,.0f} MB (target < 2,048): {'PASS' if met else 'FAIL'}")
        codec_figures(files[:40], os.path.join(work, "packed"), work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if met else 1


def codec_figures(unpacked_files: list[str], packed_dir: str, work: str) -> None:
    """Microseconds a record: parsing unpacked records, ours and TensorFlow's; encoding packs."""
    tf = import_tensorflow(verbosity=0, command=True)  # its start-up notices stay out of the figures

    lengths = Shapes(512, 76).unpacked_lengths()
    start = time.perf_counter()
    count = sum(len(batch["input_ids"]) for path in unpacked_files
                for _, batch in read_batches(path, lengths, float_features(False)))
    ours = (time.perf_counter() - start) / count * 1e6
    spec = tf_feature_spec(lengths, float_features(False))
    records = [record for path in unpacked_files for record in read_records(path)]
    start = time.perf_counter()
    for first in range(0, len(records), 1024):
        {name: value.numpy() for name, value in tf.io.parse_example(records[first:first + 1024], spec).items()}
    theirs = (time.perf_counter() - start) / len(records) * 1e6
    shard = min(name for name in os.listdir(packed_dir) if name.endswith(".tfrecord"))
    packs = [batch for _, batch in read_packed(os.path.join(packed_dir, shard), Shapes(512, 76, 3), batch_size=512)]
    with TFRecordWriter(os.path.join(work, "encoded.tfrecord")) as writer:
        start = time.perf_counter()
        for batch in packs:
            writer.write_examples(batch)
        encode = (time.perf_counter() - start) / writer.num_records * 1e6
    print(f"parsing {count:,} unpacked records: ours {ours:.1f} us a record (framing and checksums included), "
          f"tf.io.parse_example {theirs:.1f} us ({theirs / ours:.1f}x ours); encoding and framing "
          f"{writer.num_records:,} packed records: {encode:.1f} us a record")


if __name__ == "__main__":
    run(main, PROGRAM, (), "Nothing is kept", flag_values=FLAGS)
