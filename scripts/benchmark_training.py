"""Benchmark training throughput on the shipped sample: packed against padded (and bucketed), alternated.

    python scripts/benchmark_training.py

Needs the sample at L=512 that `make run` builds (runs/sample/unpacked and runs/sample/packed).
For each model config, one process builds a trainer per input mode (padded, bucketed to
128/256/384/512, packed; --batch_size rows each) and times --updates updates of each in turn,
--rounds times, alternating the order (bert_packed.training.throughput). The speed-up of each
round is packed over padded sequences/s of that round; the median and range are reported, and
the median's ratio to the packing factor says how much of packing's promise is kept (exit
status 1 below --target, 0.95). `make run` runs it with --configs=tiny, --target=0 and
--output_json, and its comparison quotes the result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from bert_packed.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0)  # first: TensorFlow's start-up notices stay out of the tables

from bert_packed import files
from bert_packed.curves import describe_speedup, median_and_range, summary
from bert_packed.dataset_info import read_dataset_info
from bert_packed.features import PACK_MODES
from bert_packed.files import write_text_atomically
from bert_packed.model import BertConfig
from bert_packed.packing import DEFAULT_ALGORITHM, plan
from bert_packed.packing.stream import length_histogram
from bert_packed.training.process import set_up_process
from bert_packed.training.throughput import Measured, benchmark_run, measure_alternately

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # as laid out, not resolved


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sample_dir", default=os.path.join(ROOT, "runs", "sample"),
                        help="Holds unpacked/ and packed/ at L=512, as `make run` builds them.")
    parser.add_argument("--configs", default="tiny,mini", help="Comma-separated configs/bert_config_*.json names.")
    parser.add_argument("--batch_size", type=int, default=8, help="Rows per update in every mode.")
    parser.add_argument("--modes", default="padded,bucketed,packed",
                        help="Input modes to measure (padded, bucketed, packed, packed_online); the first is the "
                             "baseline of the speed-ups.")
    parser.add_argument("--rounds", type=int, default=6, help="Measured rounds (after one warm-up round).")
    parser.add_argument("--updates", type=int, default=8, help="Updates of each mode in a round.")
    parser.add_argument("--output_json", help="Also write the measurements here.")
    parser.add_argument("--target", type=float, default=0.95,
                        help="Exit status 1 when packed's speed-up is below this share of the packing factor "
                             "(0: report only, as `make run` does).")
    return parser.parse_args()


def main() -> int:
    """Returns the exit status: 1 when the target is missed."""
    args = _parse_args()
    packed = files.glob(os.path.join(args.sample_dir, "packed", "packed-*.tfrecord"))  # `[` in a path is a name
    unpacked = files.glob(os.path.join(args.sample_dir, "unpacked", "part-*.tfrecord"))
    if not packed or not unpacked:
        print(f"{args.sample_dir}: no sample data at L=512; `make run` builds it", file=sys.stderr)
        return 2
    info = read_dataset_info(os.path.join(args.sample_dir, "packed"))
    factor, shapes = info.packing_factor, info.shapes
    modes = args.modes.split(",")
    print(f"\nsample at L={shapes.max_seq_length}: packing factor {factor:.3f}; {args.rounds} rounds of "
          f"{args.updates} updates of {args.batch_size} rows per mode, alternated\n")
    print("| config | input | sequences/s | real tokens/s | padding efficiency | speed-up (median, range) | "
          "speed-up / packing factor |")
    print("|---|---|---|---|---|---|---|")
    results, met, notes = {}, True, []
    online = plan(length_histogram(unpacked, shapes), shapes.max_seq_length, DEFAULT_ALGORITHM,
                  shapes.max_sequences_per_pack)
    factors = {"padded": 1.0, "bucketed": 1.0, "packed": factor, "packed_online": online.packing_factor}
    with tempfile.TemporaryDirectory() as work:
        for name in args.configs.split(","):
            bert = BertConfig.from_json_file(os.path.join(ROOT, "configs", f"bert_config_{name}.json"))
            runs = {mode: benchmark_run(
                bert, packed if mode == "packed" else unpacked,
                shapes if mode in PACK_MODES else shapes.unpacked(),
                mode, args.batch_size, os.path.join(work, f"{name}-{mode}"),
                bucket_boundaries=(128, 256, 384) if mode == "bucketed" else (),
                plan=online if mode == "packed_online" else None) for mode in modes}
            set_up_process(runs[modes[0]][0])
            trainers = {mode: Measured(*run) for mode, run in runs.items()}
            result = measure_alternately(trainers, args.rounds, args.updates)
            results[name] = {**result, "packing_factor": factor, "batch_size": args.batch_size,
                             "packing_factors": {mode: factors[mode] for mode in modes}}
            for mode in modes:
                figures = result["modes"][mode]
                speedup = summary(result["speedups"][mode])
                # The speed-up packing promises over the baseline: the ratio of their packing factors.
                promised = factors[mode] / factors[modes[0]]
                ratio = speedup["median"] / promised if mode != modes[0] and promised > 1.0 else None
                verdict = "" if ratio is None or not args.target else f" ({'PASS' if ratio >= args.target else 'FAIL'})"
                if ratio is not None and args.target:
                    met &= ratio >= args.target
                print(f"| {name} | {mode} | {summary(figures['sequences_per_second'])['median']:.1f} | "
                      f"{summary(figures['real_tokens_per_second'])['median']:,.0f} | "
                      f"{summary(figures['padding_efficiency'])['median']:.1%} | "
                      f"{median_and_range(result['speedups'][mode])} | "
                      + ("" if ratio is None else f"{ratio:.2f}{verdict}") + " |", flush=True)
            for mode in modes[1:]:
                notes.append(f"{name}: {mode} against {modes[0]}: "
                             f"{describe_speedup(result['speedups'][mode], factors[mode] / factors[modes[0]])}")
    print("\n" + "\n".join(notes))
    if args.output_json:
        write_text_atomically(args.output_json, json.dumps(results, indent=1) + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
