"""Benchmark training throughput on the shipped sample: packed against padded (and bucketed), alternated.

    python scripts/benchmark_training.py

Needs records at L=512 as `make run` builds them: unpacked/ and packed/ in --sample_dir (the
Wikipedia-like corpus's, runs/wikipedia_like; `make run JOB=sample` builds the long articles',
runs/sample).
For each model config, one process builds a trainer per input mode (padded, bucketed to
128/256/384/512, packed; --batch_size rows each) and times --updates updates of each in turn,
--rounds times, alternating the order (bert_packed.training.throughput). The speed-up of each
round is packed over padded sequences/s of that round; the median and range are reported, and
the median's ratio to the packing factor says how much of packing's promise is kept (exit
status 1 below --target, 0.95). `make run` runs it with --configs=tiny, --target=0 and
--output_json, and its comparison quotes the result.
"""

from __future__ import annotations

import json
import os
import tempfile

from bert_packed.console.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0, command=True)  # first: TensorFlow's start-up notices stay out of the tables

from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import InputFilesError, SettingsError
from bert_packed.features import PACK_MODES
from bert_packed.inputs.dataset_info import read_dataset_info
from bert_packed.model import BertConfig
from bert_packed.packing import DEFAULT_ALGORITHM, plan
from bert_packed.packing.stream import length_histogram
from bert_packed.reports.speedups import (
    TOKENS_PROMISE,
    TOKENS_PROMISE_WHY,
    describe_speedup,
    median_and_range,
    summary,
    token_speedup,
)
from bert_packed.storage import files
from bert_packed.storage.files import write_text_atomically
from bert_packed.training.process import set_up_process
from bert_packed.training.throughput import Measured, benchmark_run, measure_alternately

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # as laid out, not resolved
MODES = ("padded", "bucketed", "packed", "packed_online")  # the input modes whose packing factor is known here

FLAGS = flags.FlagValues()
flags.DEFINE_string("sample_dir", os.path.join(ROOT, "runs", "wikipedia_like"),
                    "Holds unpacked/ and packed/ at L=512, as `make run` builds them.", flag_values=FLAGS)
flags.DEFINE_list("configs", ["tiny", "mini"], "Comma-separated configs/bert_config_*.json names.", flag_values=FLAGS)
flags.DEFINE_string("bert_config_file", None, "A BERT config of your own, measured instead of --configs (one whose "
                                              "vocab_size holds your data's vocabulary).", flag_values=FLAGS)
flags.DEFINE_integer("batch_size", 8, "Rows per update in every mode.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_list("modes", ["padded", "bucketed", "packed"],
                  f"Input modes to measure ({', '.join(MODES)}); the first is the baseline of the speed-ups.", flag_values=FLAGS)
flags.DEFINE_integer("rounds", 6, "Measured rounds (after one warm-up round).", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("updates", 8, "Updates of each mode in a round.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string("output_json", None, "Also write the measurements here.", flag_values=FLAGS)
flags.DEFINE_float("target", 0.95, "Exit status 1 when packed's speed-up is below this share of the packing factor "
                                   "(0: report only, as `make run` does).", flag_values=FLAGS)

PROGRAM = "benchmark_training"


def own_model_name(path: str) -> str:
    """A BERT config of one's own named by what it is (its file's name says nothing: bert_config.json)."""
    bert = BertConfig.from_json_file(path)
    layers = f"{bert.num_hidden_layers} layer{'s' if bert.num_hidden_layers != 1 else ''}"
    return f"BERT {layers} x {bert.hidden_size}, vocabulary {bert.vocab_size:,}"


def print_row(name: str, mode: str, result: dict, modes: list[str], factors: dict[str, float]) -> bool:
    """Prints `mode`'s row of the table; returns whether it meets --target (rows not judged do)."""
    figures = result["modes"][mode]
    # Quoted in real tokens/s, held to the ratio of the real tokens a row each timed: the modes'
    # rounds read other sequences (device_check's padded side read longer ones).
    speedups, promised = token_speedup(result, mode)
    judged = mode != modes[0] and factors[mode] > factors[modes[0]]  # packing against less of it
    ratio = summary(speedups)["median"] / promised if judged else None
    verdict = "" if ratio is None or not FLAGS.target else f" ({'PASS' if ratio >= FLAGS.target else 'FAIL'})"
    print(f"| {name} | {mode} | {summary(figures['sequences_per_second'])['median']:.1f} | "
          f"{summary(figures['real_tokens_per_second'])['median']:,.0f} | "
          f"{summary(figures['padding_efficiency'])['median']:.1%} | {median_and_range(speedups)} | "
          + ("" if ratio is None else f"{ratio:.2f}{verdict}") + " |", flush=True)
    return ratio is None or not FLAGS.target or ratio >= FLAGS.target


def main(argv) -> int:
    """Returns the exit status: 1 when the target is missed."""
    del argv
    modes = FLAGS.modes
    if not modes or any(mode not in MODES for mode in modes):
        raise SettingsError(f"--modes={','.join(modes)}: expected comma-separated input modes of {', '.join(MODES)}")
    packed = files.glob(os.path.join(FLAGS.sample_dir, "packed", "packed-*.tfrecord"))  # `[` in a path is a name
    unpacked = files.glob(os.path.join(FLAGS.sample_dir, "unpacked", "part-*.tfrecord"))
    if not packed or not unpacked:
        raise InputFilesError(f"{FLAGS.sample_dir}: no sample data at L=512; `make run` builds it")
    info = read_dataset_info(os.path.join(FLAGS.sample_dir, "packed"))
    factor, shapes = info.packing_factor, info.shapes
    rounds = f"{FLAGS.rounds} round{'s' if FLAGS.rounds != 1 else ''}"
    print(f"\n{FLAGS.sample_dir} at L={shapes.max_seq_length}: packing factor {factor:.3f}; {rounds} of "
          f"{FLAGS.updates} updates of {FLAGS.batch_size} rows per mode, alternated\n")
    print("| config | input | sequences/s | real tokens/s | padding efficiency | speed-up in real tokens/s (median, "
          "range) | of the real-token ratio |")
    print("|---|---|---|---|---|---|---|")
    results, met, notes = {}, True, []
    online = plan(length_histogram(unpacked, shapes), shapes.max_seq_length, DEFAULT_ALGORITHM,
                  shapes.max_sequences_per_pack)
    factors = {"padded": 1.0, "bucketed": 1.0, "packed": factor, "packed_online": online.packing_factor}
    with tempfile.TemporaryDirectory() as work:
        configs = ({own_model_name(FLAGS.bert_config_file): FLAGS.bert_config_file} if FLAGS.bert_config_file
                   else {name: os.path.join(ROOT, "configs", f"bert_config_{name}.json") for name in FLAGS.configs})
        for name, path in configs.items():
            bert = BertConfig.from_json_file(path)
            runs = {mode: benchmark_run(
                bert, packed if mode == "packed" else unpacked,
                shapes if mode in PACK_MODES else shapes.unpacked(),
                mode, FLAGS.batch_size, os.path.join(work, f"{name}-{mode}"),
                bucket_boundaries=(128, 256, 384) if mode == "bucketed" else (),
                plan=online if mode == "packed_online" else None) for mode in modes}
            set_up_process(runs[modes[0]][0])
            trainers = {mode: Measured(*run) for mode, run in runs.items()}
            result = measure_alternately(trainers, FLAGS.rounds, FLAGS.updates)
            results[name] = {**result, "packing_factor": factor, "batch_size": FLAGS.batch_size,
                             "packing_factors": {mode: factors[mode] for mode in modes}}
            for mode in modes:
                met &= print_row(name, mode, result, modes, factors)
            for mode in modes[1:]:
                notes.append(f"{name}: {mode} against {modes[0]}, real tokens/s: "
                             f"{describe_speedup(*token_speedup(result, mode), TOKENS_PROMISE)} (sequences/s "
                             f"{summary(result['speedups'][mode])['median']:.2f}x at packing factor "
                             f"{factors[mode] / factors[modes[0]]:.3f})")
    print("\n" + "\n".join([TOKENS_PROMISE_WHY, *notes]))
    if FLAGS.output_json:
        write_text_atomically(FLAGS.output_json, json.dumps(results, indent=1) + "\n")
    return 0 if met else 1


def entry_point():
    run(main, PROGRAM, "output_json", "Nothing is kept (--output_json is written at the end)", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
