"""Benchmark the packed model: packing's own cost per training step, and where the FLOPs go.

    python scripts/benchmark_model.py

1. Step time (forward + backward, float32, tf.function) of the same model and batch shape on
   - packed rows (up to 3 sequences a row: block-diagonal mask, per-sequence positions, three
     [CLS] gathers),
   - one-sequence rows (the unpacked baseline through the same code),
   - plain BERT (a variant without packing machinery: padding mask [B, 1, 1, L], positions
     0..L-1, [CLS] at offset 0).
   Packing's own overhead = packed / plain - 1 (target <= 3%): one step of each in turn for
   --rounds rounds, the median of the per-round ratios, so machine noise hits all three alike.
2. FLOPs per token of forward + backward (3x the forward multiply-adds x 2) for base and large
   at L=128 and 512, split between attention scores/context (the L x L part, computed in full
   for a packed row since TensorFlow has no variable-length attention) and everything else.
3. The query, key and value projections as the model computes them, one [H, 3H] product,
   against three [H, H] products, forward and backward at BERT-Large's H=1024 on rows of 512,
   with and without XLA, one step of each in turn: the fused projection's speed ratio. XLA merges
   three products of one input only while each output is under 32 MB (so 2 rows: merged anyway;
   16 rows in float32, or MLPerf's 56 in bf16: not).
"""

from __future__ import annotations

import statistics
import time

from bert_packed.console.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0, command=True)  # first: TensorFlow's start-up notices stay out of the tables

import numpy as np
import tensorflow as tf
from absl import flags

from bert_packed.cli.common import run
from bert_packed.features import Shapes, model_features
from bert_packed.model import BertConfig, BertEncoder, BertPretrainingModel
from bert_packed.model.modeling import attention_bias_from_mask, fold_seed
from bert_packed.packing import packer
from bert_packed.training import loss_from_sums, pretraining_sums

FLAGS = flags.FlagValues()
flags.DEFINE_integer("rounds", 40, "Rounds of one timed step of each model in turn.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string("export_hlo", None, "Only write the projections' HLO (part 3) here, for a GPU without TensorFlow.",
                    flag_values=FLAGS)

PROGRAM = "benchmark_model"
SEED = tf.constant([1, 2])  # every step draws the same dropout masks: the variants differ in nothing else


class PlainEncoder(BertEncoder):
    """BERT's encoder without the packing machinery, for timing only: one sequence a row assumed."""

    def call(self, features, training=False, dropout_seed=None):
        seed = (lambda index: fold_seed(dropout_seed, index)) if training else (lambda index: None)
        length = tf.shape(features["input_ids"])[1]
        positions = tf.broadcast_to(tf.range(length)[None, :], tf.shape(features["input_ids"]))
        hidden = self.embeddings(features["input_ids"], features["segment_ids"], positions, seed(0))
        bias = attention_bias_from_mask(features["sequence_ids"][:, None, :] > 0)  # [B, 1, 1, L]
        for i, layer in enumerate(self.encoder_layers):
            hidden = layer(hidden, bias, seed(i + 1))
        return hidden


class PlainBert(BertPretrainingModel):
    """BertPretrainingModel on PlainEncoder, its next-sentence head on each row's first token."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        del self.encoder  # Keras forgets the packed encoder's weights
        self.encoder = PlainEncoder(config, name="encoder")

    def call(self, features, training=False, dropout_seed=None):
        cls = tf.zeros_like(features["next_sentence_positions"])
        return super().call({**features, "next_sentence_positions": cls}, training, dropout_seed)


def batches(batch_size: int, length: int, predictions: int, depth: int, seed: int = 0):
    """(packed batch, one-sequence batch), model feature dicts of identical shapes [B, L], [B, P + S], [B, S]."""
    rng = np.random.default_rng(seed)
    shapes = Shapes(length, predictions, depth)
    rows = np.zeros(batch_size * depth, dtype=packer.row_dtype(Shapes(length, predictions)))
    lengths = np.full(len(rows), length // depth)
    rows["length"] = lengths
    rows["num_predictions"] = np.minimum(predictions, np.round(lengths * 0.15)).astype(int)
    rows["input_ids"] = np.where(np.arange(length) < lengths[:, None], rng.integers(1000, 30000, (len(rows), length)), 0)
    for i, row in enumerate(rows):
        count = int(row["num_predictions"])
        rows["masked_lm_positions"][i, :count] = np.sort(rng.choice(np.arange(1, row["length"]), count, replace=False))
        rows["masked_lm_ids"][i, :count] = rng.integers(1000, 30000, count)
    packed = packer.assemble_packs(rows, np.repeat(np.arange(batch_size), depth), np.tile(np.arange(depth), batch_size),
                                   batch_size, shapes)
    single_rows = rows[:batch_size].copy()
    single_rows["length"] = length
    single_rows["input_ids"] = rng.integers(1000, 30000, (batch_size, length))
    single = packer.assemble_packs(single_rows, np.arange(batch_size), np.zeros(batch_size, int), batch_size, shapes)
    as_tensors = lambda packs: {k: tf.constant(v) for k, v in model_features(packs).items()}
    return as_tensors(packed), as_tensors(single)


def step_function(model):
    @tf.function
    def step(features):
        with tf.GradientTape() as tape:
            loss = loss_from_sums(pretraining_sums(model(features, training=True, dropout_seed=SEED), features))
        return tape.gradient(loss, model.trainable_variables)
    return step


def time_steps(config: BertConfig, length: int, batch_size: int, rounds: int) -> dict[str, float]:
    """Median seconds per step of each variant, and the median per-round ratio packed / plain."""
    packed, single = batches(batch_size, length, round(length * 0.15), 3)
    model, plain = BertPretrainingModel(config), PlainBert(config)
    model.build()
    plain.build()
    runs = {"packed": (step_function(model), packed), "one-sequence rows": (step_function(model), single),
            "plain BERT": (step_function(plain), single)}
    for step, features in runs.values():
        step(features)  # trace and warm up
    times = {name: [] for name in runs}
    for _ in range(rounds):  # one step of each in turn: load on the machine hits all alike
        for name, (step, features) in runs.items():
            start = time.perf_counter()
            step(features)[0].numpy()
            times[name].append(time.perf_counter() - start)
    result = {name: statistics.median(values) for name, values in times.items()}
    result["overhead"] = statistics.median(a / b for a, b in zip(times["packed"], times["plain BERT"])) - 1
    return result


def flops_per_token(config: BertConfig, length: int) -> tuple[float, float]:
    """(attention FLOPs, other FLOPs) per token for forward + backward, encoder only."""
    hidden, intermediate = config.hidden_size, config.intermediate_size
    dense = 8 * hidden * hidden + 4 * hidden * intermediate   # Q, K, V, output; two FFN matmuls (x2 for FLOPs)
    attention = 4 * length * hidden                           # scores and context
    return 3 * attention * config.num_hidden_layers, 3 * dense * config.num_hidden_layers


def projection_steps(rows: int, xla: bool, dtype=tf.float32, hidden: int = 1024, length: int = 512):
    """(input, {"fused": step, "three": step}): forward and backward of the query, key and value
    projections of `rows` rows, as one [H, 3H] product and as three [H, H] ones."""
    x = tf.cast(tf.random.normal([rows, length, hidden]), dtype)
    fused = tf.Variable(tf.cast(tf.random.normal([hidden, 3 * hidden], stddev=0.02), dtype))
    three = [tf.Variable(w) for w in tf.split(fused, 3, axis=1)]

    def step(weights, project):
        @tf.function(jit_compile=xla)
        def forward_backward(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                query, key, value = project(x)
                loss = tf.reduce_sum(query * key) + tf.reduce_sum(value)
            return tape.gradient(loss, [x, *weights])
        return forward_backward

    return x, {"fused": step([fused], lambda x: tf.split(x @ fused, 3, axis=-1)),
               "three": step(three, lambda x: [x @ w for w in three])}


def time_projections(rows: int, xla: bool, rounds: int) -> float:
    """The median per-round ratio of three [H, H] projections' step time to one [H, 3H]'s."""
    x, steps = projection_steps(rows, xla)
    for function in steps.values():
        function(x)
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, function in steps.items():
            start = time.perf_counter()
            function(x)[0].numpy()
            times[name].append(time.perf_counter() - start)
    return statistics.median(t / f for t, f in zip(times["three"], times["fused"]))


def export_projections(directory: str, rows: int = 56) -> None:
    """The projections' HLO at MLPerf's 56 rows of 512 a GPU in bf16, for scripts/measure_hlo_memory.py
    --time (a GPU where TensorFlow is not installed), added to the manifest there."""
    import json
    import lzma
    import os

    os.makedirs(directory, exist_ok=True)
    manifest_path = os.path.join(directory, "manifest.json")
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    x, steps = projection_steps(rows, True, tf.bfloat16)
    for name, function in steps.items():
        key = f"projections_{name}_rows{rows}_bf16"
        with lzma.open(os.path.join(directory, f"{key}.hlo.pb.xz"), "wb") as f:
            f.write(function.experimental_get_compiler_ir(x)(stage="hlo_serialized"))
        manifest[key] = f"{key}.hlo.pb.xz"
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"projections' HLO in {directory}: python scripts/measure_hlo_memory.py --hlo_dir={directory} "
          f"--time=projections_fused_rows{rows}_bf16,projections_three_rows{rows}_bf16 on the GPU machine")


def main(argv) -> None:
    del argv
    if FLAGS.export_hlo:
        export_projections(FLAGS.export_hlo)
        return
    print("| config | L | batch | packed (s/step) | one-sequence rows | plain BERT | packing overhead vs plain |")
    print("|---|---|---|---|---|---|---|")
    for name, length, batch_size in [("tiny", 128, 32), ("tiny", 512, 8), ("mini", 128, 16), ("mini", 512, 4)]:
        config = BertConfig.from_json_file(f"configs/bert_config_{name}.json")
        times = time_steps(config, length, batch_size, FLAGS.rounds)
        overhead = times["overhead"]
        print(f"| {name} | {length} | {batch_size} | {times['packed']:.4f} | {times['one-sequence rows']:.4f} | "
              f"{times['plain BERT']:.4f} | {overhead:+.1%} |", flush=True)
    print("\n| config | L | attention GFLOP/token | other GFLOP/token | attention share |")
    print("|---|---|---|---|---|")
    for name in ("base", "large"):
        config = BertConfig.from_json_file(f"configs/bert_config_{name}.json")
        for length in (128, 512):
            attention, other = flops_per_token(config, length)
            print(f"| {name} | {length} | {attention / 1e9:.3f} | {other / 1e9:.3f} | "
                  f"{attention / (attention + other):.1%} |")
    print("\n| rows of 512 | XLA | three [H, H] projections' time / one [H, 3H]'s (median of rounds) |")
    print("|---|---|---|")
    for rows in (2, 16):
        for xla in (False, True):
            print(f"| {rows} | {'yes' if xla else 'no'} | {time_projections(rows, xla, max(3, FLAGS.rounds // 8)):.2f} |",
                  flush=True)


if __name__ == "__main__":
    run(main, PROGRAM, (), "Nothing was written", flag_values=FLAGS)
