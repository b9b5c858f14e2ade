"""Benchmark training throughput on CPU: packed vs padded input, same data, same model, one run.

    python scripts/benchmark_training.py

Builds (or reuses) the shipped sample at L=512 (runs/sample, as `make run` does), then trains
the tiny and mini configs for --steps updates on padded rows, bucketed rows (trimmed to
128/256/384/512) and packed rows (train_batch_size rows each), and reports real tokens/s after
--warmup updates. The realized speed-up is packed /
padded real tokens/s; its ratio to the packing factor says how much of packing's promise is
kept (target >= 0.9).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile

from bert_packed.dataset_info import read_dataset_info
from bert_packed.features import Shapes
from bert_packed.model import BertConfig
from bert_packed.training.config import ModelConfig, OptimizerConfig, RunConfig, TrainConfig, TrainData
from bert_packed.training.trainer import Trainer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def sample_data() -> tuple[list[str], list[str], float]:
    """(packed files, unpacked files, packing factor) of the sample at L=512."""
    packed = sorted(glob.glob(os.path.join(ROOT, "runs", "sample", "packed", "packed-*.tfrecord")))
    unpacked = sorted(glob.glob(os.path.join(ROOT, "runs", "sample", "unpacked", "part-*.tfrecord")))
    if not packed or not unpacked:
        raise SystemExit("no sample data: run `make run` first (it builds runs/sample/)")
    return packed, unpacked, read_dataset_info(os.path.join(ROOT, "runs", "sample", "packed")).packing_factor


def tokens_per_second(name, files, mode, depth, batch_size, steps, warmup, output_dir, boundaries=()):
    bert = BertConfig.from_json_file(os.path.join(ROOT, "configs", f"bert_config_{name}.json"))
    config = TrainConfig(model=ModelConfig(bert),
                         train_data=TrainData(tuple(files), Shapes(512, 76, depth), mode, batch_size=batch_size,
                                              bucket_boundaries=boundaries),
                         optimizer=OptimizerConfig(learning_rate=1e-3, num_train_steps=steps),
                         run=RunConfig(output_dir, save_checkpoints_steps=10**9, log_every_steps=10**9))
    Trainer(config).train()
    with open(os.path.join(output_dir, "train_log.jsonl"), encoding="utf-8") as f:
        log = [json.loads(line) for line in f]
    timed = log[warmup:]
    seconds = timed[-1]["seconds"] - log[warmup - 1]["seconds"]
    return (sum(r["real_tokens"] for r in timed) / seconds, sum(r["num_sequences"] for r in timed) / seconds,
            sum(r["padding_efficiency"] for r in timed) / len(timed))


def main() -> int:
    """Returns the exit status: 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    packed, unpacked, packing_factor = sample_data()
    print(f"\nsample at L=512: packing factor {packing_factor:.3f}\n")
    print("| config | batch (rows) | input | real tokens/s | sequences/s | padding efficiency | speed-up | "
          "speed-up / packing factor |")
    print("|---|---|---|---|---|---|---|---|")
    met = True
    with tempfile.TemporaryDirectory() as work:
        for name, batch_size in (("tiny", 8), ("mini", 4)):
            padded = tokens_per_second(name, unpacked, "padded", 1, batch_size, args.steps, args.warmup,
                                       os.path.join(work, f"{name}-padded"))
            bucketed = tokens_per_second(name, unpacked, "bucketed", 1, batch_size, args.steps, args.warmup,
                                         os.path.join(work, f"{name}-bucketed"), (128, 256, 384))
            pack = tokens_per_second(name, packed, "packed", 3, batch_size, args.steps, args.warmup,
                                     os.path.join(work, f"{name}-packed"))
            speedup = pack[0] / padded[0]
            met &= speedup / packing_factor >= 0.9
            print(f"| {name} | {batch_size} | padded | {padded[0]:,.0f} | {padded[1]:.1f} | {padded[2]:.1%} | 1.00 | |")
            print(f"| {name} | {batch_size} | bucketed (128/256/384/512) | {bucketed[0]:,.0f} | {bucketed[1]:.1f} | "
                  f"{bucketed[2]:.1%} | {bucketed[0] / padded[0]:.2f} | |")
            print(f"| {name} | {batch_size} | packed | {pack[0]:,.0f} | {pack[1]:.1f} | {pack[2]:.1%} | "
                  f"{speedup:.2f} | {speedup / packing_factor:.2f} ({'PASS' if speedup / packing_factor >= 0.9 else 'FAIL'}) |",
                  flush=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
