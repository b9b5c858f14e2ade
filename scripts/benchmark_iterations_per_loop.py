"""What --iterations_per_loop saves: host dispatches of the training step, on CPU, tiny config.

    python scripts/benchmark_iterations_per_loop.py

Writes 2,000 synthetic unpacked records at L=32 (bert_packed.features layout, random tokens),
then trains the tiny config with the same data and seed for --updates updates at each
--iterations_per_loop, in alternating rounds so that the shared machine's noise hits every
setting alike. Reports updates per second after the first (compiling) loop, per round and as the
median, and the ratio to one update per call. A compiled loop runs the same updates (exactly:
tests/test_trainer.py), so only the dispatch and host reads between updates differ.
"""

from __future__ import annotations

import os
import statistics
import tempfile

from bert_packed.console.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0, command=True)  # first: TensorFlow's start-up notices stay out of the tables

import numpy as np
from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.records import TFRecordWriter
from bert_packed.storage.run_directory import TRAIN_LOG, RunDirectory
from bert_packed.training.assemble import PretrainingSettings, assemble
from bert_packed.training.loop import train_and_evaluate
from bert_packed.training.process import set_up_process
from bert_packed.training.step import CompiledStep

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # as laid out, not resolved
SHAPES = Shapes(32, 5)  # small steps: what a call costs besides its compute shows

FLAGS = flags.FlagValues()
flags.DEFINE_list("loops", ["1", "10", "50"], "Comma-separated --iterations_per_loop values to compare.", flag_values=FLAGS)
flags.DEFINE_integer("updates", 150, "Timed updates per run (after the first loop).", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("rounds", 3, "Alternating rounds of every setting.", lower_bound=1, flag_values=FLAGS)

PROGRAM = "benchmark_iterations_per_loop"


def write_records(path: str, count: int, seed: int = 0) -> None:
    """Unpacked records of random lengths 20..128 with MLPerf-shaped predictions."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, SHAPES.max_seq_length + 1, count)
    features = {name: np.zeros((count, length), np.int64) for name, length in SHAPES.unpacked_lengths().items()}
    features["masked_lm_weights"] = np.zeros((count, SHAPES.max_predictions_per_seq), np.float32)
    for row, length in enumerate(lengths):
        features["input_ids"][row, :length] = rng.integers(1000, 30000, length)
        features["input_mask"][row, :length] = 1
        features["segment_ids"][row, length // 2:length] = 1
        predictions = min(SHAPES.max_predictions_per_seq, round(0.15 * length))
        positions = np.sort(rng.choice(np.arange(1, length - 1), predictions, replace=False))
        features["masked_lm_positions"][row, :predictions] = positions
        features["masked_lm_ids"][row, :predictions] = rng.integers(1000, 30000, predictions)
        features["masked_lm_weights"][row, :predictions] = 1.0
    features["next_sentence_labels"][:, 0] = rng.integers(0, 2, count)
    with TFRecordWriter(path) as writer:
        writer.write_examples(features)


def updates_per_second(files: list[str], loop: int, updates: int, output_dir: str) -> float:
    # The run as run_pretraining assembles it from these flags.
    config, data, evaluation = assemble(PretrainingSettings.of(
        input_files=",".join(files), bert_config_file=os.path.join(ROOT, "configs", "bert_config_tiny.json"),
        max_seq_length=SHAPES.max_seq_length, max_predictions_per_seq=SHAPES.max_predictions_per_seq,
        input_mode="padded", train_batch_size=4, learning_rate=1e-3, num_train_steps=updates + loop,
        output_dir=output_dir, save_checkpoints_steps=10**9, iterations_per_loop=loop, log_every_steps=10**9))
    set_up_process(config)
    train_and_evaluate(config, data, evaluation, CompiledStep(config, data))
    log = RunDirectory(output_dir).read_log(TRAIN_LOG)
    # The first loop compiles; time the `updates` after it.
    return updates / (log[-1]["seconds"] - log[loop - 1]["seconds"])


def main(argv) -> None:
    del argv
    try:
        loops = [int(value) for value in FLAGS.loops]
    except ValueError:
        loops = []
    if not loops or min(loops) < 1:
        raise SettingsError(f"--loops={','.join(FLAGS.loops)}: expected comma-separated integers >= 1")
    rates = {loop: [] for loop in loops}
    with tempfile.TemporaryDirectory() as work:
        files = [os.path.join(work, "records.tfrecord")]
        write_records(files[0], 2000)
        for round_index in range(FLAGS.rounds):
            for loop in loops:
                rates[loop].append(updates_per_second(files, loop, FLAGS.updates,
                                                      os.path.join(work, f"run-{round_index}-{loop}")))
    base = statistics.median(rates[loops[0]])
    print(f"\ntiny config, L=32, batch 4, {FLAGS.updates} timed updates, {FLAGS.rounds} alternating rounds\n")
    print("| iterations_per_loop | updates/s per round | median | vs one update a call |")
    print("|---|---|---|---|")
    for loop in loops:
        median = statistics.median(rates[loop])
        print(f"| {loop} | {', '.join(f'{rate:.1f}' for rate in rates[loop])} | {median:.1f} | {median / base:.2f}x |")


if __name__ == "__main__":
    run(main, PROGRAM, (), "Nothing is kept", flag_values=FLAGS)
