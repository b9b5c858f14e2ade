"""The optimizer's step over a whole model: each weight's step fused into one XLA program (what
--xla gives) against one operation at a time.

    python scripts/benchmark_optimizer.py [--bert_config_file=configs/bert_config_large.json]

An update ends with LAMB (pre-training) or AdamW (fine-tuning) over every trainable weight: its
two moments, the update and LAMB's trust ratio, a pass over memory for each operation unless
each weight's step is one XLA program (bert_packed.training.optimizers, `fused`). The step costs
the same whatever an update holds, so on short rows it is a large part of an update
(docs/finetuning.md). This times the whole step, inside one compiled function, on the model's
own weights and random gradients: one step of each variant in turn for --rounds rounds, the
median of each, and the ratio; and the operations the unfused step's graph holds, what a step's
build traces (docs/training.md). Both variants compute the same step (tests/test_optimizers.py
holds both to an independent NumPy implementation of the reference).
"""

from __future__ import annotations

import os
import statistics
import time

from bert_packed.console.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0, command=True)  # first: TensorFlow's start-up notices stay out of the tables

import numpy as np
import tensorflow as tf
from absl import flags

from bert_packed.cli.common import run
from bert_packed.model import BertConfig, BertPretrainingModel
from bert_packed.training.optimizers import AdamWeightDecay, Lamb

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

FLAGS = flags.FlagValues()
flags.DEFINE_string("bert_config_file", os.path.join(ROOT, "configs", "bert_config_base.json"),
                    "The model whose weights are stepped.", flag_values=FLAGS)
flags.DEFINE_integer("rounds", 10, "Rounds of one timed step of each variant in turn.", lower_bound=1, flag_values=FLAGS)

PROGRAM = "benchmark_optimizer"


def step_of(kind: type, fused: bool, variables: list, gradients: list):
    """A compiled function that applies `gradients` to `variables` with a new `kind` optimizer."""
    optimizer = kind(1e-4, fused=fused)
    optimizer.build(variables)
    return tf.function(lambda: optimizer.apply_gradients(zip(gradients, variables)))


def operations(step) -> int:
    """The operations of a compiled function's graph and of the functions it calls."""
    graph = step.get_concrete_function().graph
    return len(graph.get_operations()) + sum(len(f.definition.node_def) for f in graph._functions.values())


def main(argv) -> None:
    del argv
    model = BertPretrainingModel(BertConfig.from_json_file(FLAGS.bert_config_file))
    model.build()
    variables = model.trainable_variables
    rng = np.random.default_rng(0)
    gradients = [tf.constant(rng.normal(scale=1e-3, size=v.shape).astype(np.float32)) for v in variables]
    weights = sum(int(np.prod(v.shape)) for v in variables)
    print(f"\n{FLAGS.bert_config_file}: {weights / 1e6:.1f}M trainable weights in {len(variables)} variables, "
          f"{FLAGS.rounds} alternating rounds\n")
    print("| optimizer | step, one operation at a time (ms) | fused, each weight's step one XLA program (ms) | "
          "speed-up | operations traced |")
    print("|---|---|---|---|---|")
    for kind in (Lamb, AdamWeightDecay):
        steps = {fused: step_of(kind, fused, variables, gradients) for fused in (False, True)}
        for step in steps.values():
            step()  # compiles
        seconds = {fused: [] for fused in steps}
        for _ in range(FLAGS.rounds):
            for fused, step in steps.items():
                start = time.perf_counter()
                step()
                seconds[fused].append(time.perf_counter() - start)
        plain, fused = (1000 * statistics.median(seconds[key]) for key in (False, True))
        print(f"| {kind.__name__} | {plain:.0f} | {fused:.0f} | {plain / fused:.2f}x | {operations(steps[False]):,} |")


if __name__ == "__main__":
    run(main, PROGRAM, (), "Nothing is kept", flag_values=FLAGS)
