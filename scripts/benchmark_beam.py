"""Benchmark the Beam pipelines against the single-machine commands on the same input.

    python scripts/benchmark_beam.py [--copies 4] [--dupe_factor 2]

Text: the shipped sample cut into Wikipedia's mix of document lengths --copies times, each with
its own seed (scripts/make_wikipedia_like_corpus.py: 3 files a copy, each a pipeline's unit of
work), made into records at L=512 (P=76), then packed (lp, depth 3, 8 shards). Each command runs in its own
process, one after another on the same input: the single-machine command on 1 and 2 workers,
then `python -m bert_packed.beam` on Beam's local FnApiRunner with 1 worker (in_memory) and 2
worker processes (multi_processing). Reported: sequences per second (all of the command, start-
up included), the ratio to the single-machine command on as many workers, and the peak resident
memory of the command's process and of its largest worker process (VmHWM, read from /proc while
it runs). Every output is checked to be the single-machine output, byte for byte.

Then, on paper for MLPerf's Wikipedia (156.7M sequences, data/histograms/wikipedia_512.json):
the plan's solve time on its histogram, and what one global plan saves against a plan per input
file (--files files, the histogram dealt among them at random).
"""

from __future__ import annotations

import filecmp
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from absl import flags

from bert_packed.cli.common import run
from bert_packed.inputs.dataset_info import METADATA_FILE, read_dataset_info
from bert_packed.inputs.histogram_file import load_histogram
from bert_packed.packing import plan

FLAGS = flags.FlagValues()
flags.DEFINE_integer("copies", 4, "Cuts of the sample, each with its own seed (input files: 3 a cut).", lower_bound=1,
                     flag_values=FLAGS)
flags.DEFINE_integer("dupe_factor", 2, "Passes over the text.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("files", 20, "Input files of the per-file plans' simulation (MLPerf's Wikipedia: 500; each "
                                   "file's plan takes about 0.3 s).",
                     lower_bound=1, flag_values=FLAGS)

PROGRAM = "benchmark_beam"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLPERF_SEQUENCES = 156_725_653
RUNS = [("single machine", 1, []), ("single machine", 2, []),
        ("Beam, FnApiRunner", 1, ["--direct_num_workers=1"]),
        ("Beam, FnApiRunner", 2, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])]


def peak_memory(pid: int, stop: threading.Event, peaks: dict) -> None:
    """Polls the high-water mark of resident memory (VmHWM) of `pid` and its descendants."""
    while not stop.is_set():
        pids, children = [pid], []
        for each in pids:
            try:
                children = [int(child) for task in os.listdir(f"/proc/{each}/task")  # any thread's children
                            for child in open(f"/proc/{each}/task/{task}/children").read().split()]
                with open(f"/proc/{each}/status") as f:
                    peaks[each] = max(peaks.get(each, 0), next(int(line.split()[1]) for line in f
                                                               if line.startswith("VmHWM")) >> 10)
            except (OSError, StopIteration):
                continue
            pids.extend(children)
        time.sleep(0.05)


def timed(command: list[str]) -> tuple[float, int, int]:
    """Runs a command; returns (seconds, its process's peak MB, its largest descendant's peak MB)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    stop, peaks = threading.Event(), {}
    watcher = threading.Thread(target=peak_memory, args=(process.pid, stop, peaks), daemon=True)
    watcher.start()
    _, stderr = process.communicate()
    seconds = time.perf_counter() - start
    stop.set()
    watcher.join()
    if process.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {stderr.decode()[-2000:]}")
    own = peaks.pop(process.pid, 0)
    return seconds, own, max(peaks.values(), default=0)


def compare(job: str, inputs: list[str], work: str) -> list[tuple]:
    """Runs `job` (create or pack) every way; returns (way, workers, seconds, MB, worker MB)."""
    single = {"create": "bert_packed.cli.create_pretraining_data", "pack": "bert_packed.cli.pack_pretraining_data"}
    rows, first = [], None
    for way, workers, options in RUNS:
        output = os.path.join(work, f"{job}-{len(rows)}")
        command = ([sys.executable, "-m", single[job], f"--num_workers={workers}"] if not options
                   else [sys.executable, "-m", "bert_packed.beam", job, *options])
        command += [*inputs, f"--output_dir={output}"]
        rows.append((way, workers, *timed(command)))
        first = first or output
        names = [n for n in os.listdir(first) if not n.startswith(".") and n != METADATA_FILE]
        assert all(filecmp.cmp(os.path.join(first, n), os.path.join(output, n), shallow=False) for n in names), output
    return rows


def report(job: str, rows: list[tuple], sequences: int) -> None:
    single = {workers: seconds for way, workers, seconds, *_ in rows if way == "single machine"}
    for way, workers, seconds, own, worker in rows:
        print(f"| {job} | {way} | {workers} | {sequences / seconds:,.0f} | {single[workers] / seconds:.2f} | "
              f"{own:,} | {worker:,} |" if worker else f"| {job} | {way} | {workers} | {sequences / seconds:,.0f} | "
              f"{single[workers] / seconds:.2f} | {own:,} | (in it) |")


def on_paper(num_files: int) -> None:
    """MLPerf's Wikipedia: the plan's solve time, and one global plan against a plan per file."""
    real = load_histogram(os.path.join(REPO, "data", "histograms", "wikipedia_512.json"), 512)
    histogram = np.round(real / real.sum() * MLPERF_SEQUENCES).astype(np.int64)
    whole = plan(histogram, 512, "lp", 3)
    print(f"\nMLPerf Wikipedia on paper: {histogram.sum():,} sequences; one lp plan at depth 3: {whole.num_packs:,} "
          f"packs (efficiency {whole.efficiency:.4%}), solved in {whole.seconds:.2f} s")
    rng = np.random.default_rng(0)
    per_file = np.stack([rng.multinomial(count, np.full(num_files, 1 / num_files)) for count in histogram], axis=1)
    start = time.perf_counter()
    packs = sum(plan(h, 512, "lp", 3).num_packs for h in per_file)
    print(f"a plan per input file ({num_files} files): {packs:,} packs, {packs - whole.num_packs:,} more "
          f"({packs / whole.num_packs - 1:.4%}), {time.perf_counter() - start:.1f} s of solving in all")


def main(argv) -> None:
    del argv
    work = tempfile.mkdtemp(prefix="benchmark_beam_")
    try:
        for seed in range(1, FLAGS.copies + 1):
            subprocess.run([sys.executable, os.path.join(REPO, "scripts", "make_wikipedia_like_corpus.py"),
                            f"--output_dir={os.path.join(work, 'text', str(seed))}", f"--seed={seed}"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        text = sorted(glob.glob(os.path.join(work, "text", "*", "*.txt")))
        shapes = ["--max_seq_length=512", "--max_predictions_per_seq=76"]
        print("| job | runs on | workers | sequences/s | vs single machine | peak MB (command) | peak MB (a worker) |")
        print("|---|---|---|---|---|---|---|")
        create = compare("create", [f"--input_file={','.join(text)}", "--input_format=sentences",
                                    f"--dupe_factor={FLAGS.dupe_factor}", *shapes], work)
        sequences = read_dataset_info(os.path.join(work, "create-0")).num_sequences
        report("create", create, sequences)
        records = os.path.join(work, "create-0", "part-*.tfrecord")
        report("pack", compare("pack", [f"--input_files={records}", "--num_shards=8", *shapes], work), sequences)
        print(f"({sequences:,} sequences from {len(text)} files)")
        on_paper(FLAGS.files)
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    run(main, PROGRAM, (), "Nothing is kept", flag_values=FLAGS)
