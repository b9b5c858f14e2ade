"""The device check: everything a GPU must show before its figures are trusted, in one command.

    python scripts/device_check.py                   # on one GPU: BERT-Large, within about 8 minutes
    python scripts/device_check.py --output_json=device_check.json

On the first GPU (on a machine without one, the CPU, with the tiny config):
1. the install (bert_packed.training.doctor: TensorFlow's build, the GPU, XLA, bf16, a few packed
   updates of a tiny model);
2. packed == unpacked on the device: the same sequences packed three a row and one a row give the
   same per-sequence masked-LM logits, loss and gradients, in float32 (TensorFloat-32 off) and in
   bf16, each within its tolerance (TOLERANCES), under XLA. The config's layer widths, heads and
   L=512 with --check_layers of its layers: every layer runs the same code, and a 24-layer model
   would cost a compile of its own for each of these checks;
3. recompute: the gradients of --recompute=attention and layer equal those of none, float32 with
   dropout on, under XLA;
4. throughput: packed against padded training of the whole config at L=512, bf16 and XLA, on
   Wikipedia-like lengths (packing factor about 2), at the largest micro-batch the memory plan
   fits with both steps held (--batch_size overrides), alternated in one process: sequences/s,
   real tokens/s, model FLOP utilisation against the card's bf16 peak, the speed-up over the
   packing factor;
5. the peak memory of the packed step against the plan's estimate (GPU only);
6. determinism: the same updates twice with op determinism on give bit-equal weights.
It prints one table and writes every figure to --output_json. Exit status 1 when a check fails.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from bert_packed.console.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0, command=True)  # first: TensorFlow's start-up notices stay out of the tables

import dataclasses

import keras
import numpy as np
import tensorflow as tf
from _wikipedia_like_data import write_data
from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.in_process import QuietRetracing
from bert_packed.features import Shapes
from bert_packed.model import BertConfig, BertPretrainingModel
from bert_packed.reports.speedups import TOKENS_PROMISE, describe_speedup, summary, token_speedup
from bert_packed.storage import files
from bert_packed.storage.files import write_text_atomically
from bert_packed.training import loss_from_sums, pretraining_sums
from bert_packed.training.config import PRECISIONS, make_config
from bert_packed.training.data import TrainData
from bert_packed.training.doctor import checks, first_device, same_sequences_packed_or_not
from bert_packed.training.memory import GIB, largest_rows, step_bytes, step_line
from bert_packed.training.process import set_up_process
from bert_packed.training.step import CompiledStep
from bert_packed.training.throughput import Measured, benchmark_run, device_and_peak, measure_alternately

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FLAGS = flags.FlagValues()
flags.DEFINE_string("bert_config", None, "tiny, mini, base or large (configs/bert_config_*.json), or a bert_config.json "
                                         "path (default: large on a GPU, tiny on a CPU).", flag_values=FLAGS)
flags.DEFINE_integer("check_layers", 2, "Layers of the config in the packed == unpacked and recompute checks.",
                     lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("batch_size", None, "Rows a micro-batch in the throughput (default: the largest the plan fits "
                                         "on a GPU, 4 on a CPU).", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("sequences", None, "Wikipedia-like sequences written for the throughput (default: enough for "
                                        "the rounds).", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("rounds", 4, "Measured rounds of the throughput, alternated.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("updates", 5, "Updates of each input mode a round.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_float("peak_tflops", None, "The device's bf16 peak for MFU (default: known cards').",
                   lower_bound=0.001, flag_values=FLAGS)
flags.DEFINE_string("output_json", None, "Also write every figure here.", flag_values=FLAGS)

PROGRAM = "device_check"
L, P, S = 512, 76, 3
# (loss, logits, gradients): the largest difference allowed, relative to the largest value of each.
TOLERANCES = {"fp32": (1e-5, 1e-4, 1e-4), "bf16": (2e-2, 5e-2, 1e-1)}
RECOMPUTE_TOLERANCE = 1e-6  # float32, relative to the largest gradient


@dataclasses.dataclass
class Row:
    """One line of the table."""

    check: str
    result: str
    passed: bool | None  # None: a figure, not a check


def bert_config(on_gpu: bool) -> BertConfig:
    name = FLAGS.bert_config or ("large" if on_gpu else "tiny")
    shipped = os.path.join(ROOT, "configs", f"bert_config_{name}.json")
    return BertConfig.from_json_file(shipped if os.sep not in name and os.path.exists(shipped) else name)


def relative(a, b) -> float:
    """The largest difference of a and b, relative to the largest |a|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))


def per_sequence_logits(outputs, features) -> list[np.ndarray]:
    """Each sequence's masked-LM logits, in the order the sequences were laid out."""
    mlm, owner = outputs["mlm_logits"].numpy(), features["prediction_sequence_ids"].numpy()
    return [mlm[row][owner[row] == k] for row in range(len(owner)) for k in range(1, S + 1) if (owner[row] == k).any()]


def packed_equals_unpacked(bert: BertConfig, device: str) -> tuple[list[Row], dict]:
    """Part 2, in float32 and bf16."""
    rows, figures = [], {}
    small = dataclasses.replace(bert, num_hidden_layers=FLAGS.check_layers, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0)
    packed, one_a_row = same_sequences_packed_or_not(Shapes(L, P, S), 6 * S, bert.vocab_size, min_length=32)
    for precision in ("fp32", "bf16"):
        keras.mixed_precision.set_global_policy(PRECISIONS[precision])
        with tf.device(device):
            model = BertPretrainingModel(small)
            model.build()

            @tf.function(jit_compile=True, autograph=False)
            def forward_backward(features, model=model):
                with tf.GradientTape() as tape:
                    outputs = model(features)
                    loss = loss_from_sums(pretraining_sums(outputs, features))
                return outputs, loss, tape.gradient(loss, model.trainable_variables)

            a_outputs, a_loss, a_gradients = forward_backward(one_a_row)
            b_outputs, b_loss, b_gradients = forward_backward(packed)
        loss = relative(a_loss.numpy(), b_loss.numpy())
        logits = max(relative(x, y) for x, y in zip(per_sequence_logits(a_outputs, one_a_row),
                                                    per_sequence_logits(b_outputs, packed)))
        gradients = max(relative(tf.convert_to_tensor(x).numpy(), tf.convert_to_tensor(y).numpy())
                        for x, y in zip(a_gradients, b_gradients))
        bounds = TOLERANCES[precision]
        figures[precision] = {"loss": loss, "logits": logits, "gradients": gradients, "tolerances": bounds}
        rows.append(Row(f"packed == unpacked, {precision}",
                        f"loss {loss:.1e}, per-sequence logits {logits:.1e}, gradients {gradients:.1e} (at most "
                        f"{bounds[0]:g}, {bounds[1]:g}, {bounds[2]:g}; {S * 6} sequences, {FLAGS.check_layers} layers)",
                        loss <= bounds[0] and logits <= bounds[1] and gradients <= bounds[2]))
    keras.mixed_precision.set_global_policy("float32")
    return rows, figures


def recompute_equal(bert: BertConfig, device: str) -> tuple[list[Row], dict]:
    """Part 3."""
    small = dataclasses.replace(bert, num_hidden_layers=FLAGS.check_layers)
    packed, _ = same_sequences_packed_or_not(Shapes(L, P, S), 2 * S, bert.vocab_size, min_length=32)
    gradients, start = {}, None
    with tf.device(device):
        for mode in ("none", "attention", "layer"):
            model = BertPretrainingModel(small, recompute=mode)
            model.build()
            if start is None:
                start = [w.numpy() for w in model.weights]
            else:  # the same weights as none's
                for weight, value in zip(model.weights, start):
                    weight.assign(value)

            @tf.function(jit_compile=True, autograph=False)
            def backward(features, model=model):
                with tf.GradientTape() as tape:
                    outputs = model(features, training=True, dropout_seed=tf.constant([5, 6]))
                    loss = loss_from_sums(pretraining_sums(outputs, features))
                return tape.gradient(loss, model.trainable_variables)

            gradients[mode] = [tf.convert_to_tensor(g).numpy() for g in backward(packed)]
    scale = max(np.abs(g).max() for g in gradients["none"])
    figures = {mode: max(float(np.abs(a - b).max()) for a, b in zip(gradients["none"], gradients[mode])) / scale
               for mode in ("attention", "layer")}
    passed = all(value <= RECOMPUTE_TOLERANCE for value in figures.values())
    return [Row("recompute == none, fp32, dropout on", f"attention {figures['attention']:.1e}, layer "
                f"{figures['layer']:.1e} of the largest gradient (at most {RECOMPUTE_TOLERANCE:g})", passed)], figures


def micro_batch(bert: BertConfig, on_gpu: bool) -> int:
    """Rows a micro-batch of the throughput: what the plan fits beside a second step's weights."""
    if FLAGS.batch_size:
        return FLAGS.batch_size
    if not on_gpu:
        return 4
    from bert_packed.training.memory import device_memory

    memory, _ = device_memory(tf.distribute.get_strategy())
    fixed, _ = step_line(bert, L, "bf16", "none")
    rows = largest_rows(bert, L, "bf16", "none", memory - fixed) if fixed is not None else None
    return max(1, rows or 8)


def throughput(bert: BertConfig, on_gpu: bool, work: str, peak: float | None) -> tuple[list[Row], dict]:
    """Parts 4 and 5."""
    rows_a_batch = micro_batch(bert, on_gpu)
    precision = "bf16" if on_gpu else "fp32"
    sequences = FLAGS.sequences or max(2000, 3 * rows_a_batch * FLAGS.updates * (FLAGS.rounds + 1) * 2)
    unpacked, packed, factor = write_data(work, sequences, bert.vocab_size)
    runs = {mode: benchmark_run(bert, packed if mode == "packed" else unpacked, Shapes(L, P, S if mode == "packed" else 1),
                                mode, rows_a_batch, os.path.join(work, mode), precision, True)
            for mode in ("padded", "packed")}
    set_up_process(runs["padded"][0])
    trainers = {mode: Measured(*run) for mode, run in runs.items()}
    if on_gpu:
        tf.config.experimental.reset_memory_stats("GPU:0")
    result = measure_alternately(trainers, FLAGS.rounds, FLAGS.updates)
    figures = {"rows_a_micro_batch": rows_a_batch, "packing_factor": factor, "precision": precision}
    table = []
    for mode in ("padded", "packed"):
        modes = result["modes"][mode]
        rate, tokens = summary(modes["sequences_per_second"])["median"], summary(modes["real_tokens_per_second"])["median"]
        flops = summary(modes["flops_per_second"])["median"]
        mfu = f", MFU {flops / 1e12 / peak:.1%}" if peak else ""
        figures[mode] = {"sequences_per_second": rate, "real_tokens_per_second": tokens, "flops_per_second": flops,
                         "mfu": flops / 1e12 / peak if peak else None}
        table.append(Row(f"{mode}, {rows_a_batch} rows of {L}, {precision}, XLA",
                         f"{rate:,.1f} sequences/s, {tokens:,.0f} real tokens/s{mfu}", None))
    # Quoted in real tokens/s: the modes' rounds read other sequences (the padded side's were longer
    # in one CPU run: 1.71x in real tokens/s where sequences/s said 2.21x).
    speedups, promised = token_speedup(result)
    figures["speedup"] = summary(speedups)["median"]
    figures["sequences_speedup"] = summary(result["speedups"]["packed"])["median"]
    figures["promised_speedup"] = promised
    table.append(Row("packed speed-up, real tokens/s", describe_speedup(speedups, promised, TOKENS_PROMISE)
                     + f" (sequences/s {figures['sequences_speedup']:.2f}x at packing factor {factor:.3f})", None))
    if on_gpu:
        peak_bytes = tf.config.experimental.get_memory_info("GPU:0")["peak"]
        planned = step_bytes(bert, L, precision, "none", rows_a_batch)
        fixed, _ = step_line(bert, L, precision, "none")
        both = planned + fixed if planned is not None else None  # two steps held: a second one's weights and state
        figures["peak_bytes"], figures["planned_bytes"] = peak_bytes, both
        table.append(Row("peak memory against the plan",
                         f"{peak_bytes / GIB:.1f} GiB measured, {both / GIB:.1f} GiB planned" if both else
                         f"{peak_bytes / GIB:.1f} GiB measured, no plan for this config",
                         None if both is None else peak_bytes <= both))
    del trainers
    return table, figures


def deterministic(bert: BertConfig, device: str, work: str) -> tuple[list[Row], dict]:
    """Part 6: the same updates twice from the same state, op determinism on: bit-equal weights."""
    small = dataclasses.replace(bert, num_hidden_layers=FLAGS.check_layers)
    config = make_config(bert=small, input_mode="packed", train_batch_size=2 * S, num_train_steps=3, deterministic=True,
                         xla=True, output_dir=work, learning_rate=1e-3)
    set_up_process(config)
    packed, _ = same_sequences_packed_or_not(Shapes(L, P, S), 2 * S * S, bert.vocab_size, min_length=32)
    data = TrainData(shapes=Shapes(L, P, S), input_mode="packed", packing_factor=3.0)
    weights = []
    with tf.device(device):
        step = CompiledStep(config, data)
        initial = step.initial_state()
        for _ in range(2):  # a kernel that is not deterministic (atomics, a scatter) differs between runs
            step.reset(initial)
            step.run_updates(iter(tf.data.Dataset.from_tensor_slices(packed).batch(2 * S).repeat()), 3)
            weights.append([w.numpy() for w in step.model.weights])
    equal = all(np.array_equal(a, b) for a, b in zip(*weights))
    differ = sum(not np.array_equal(a, b) for a, b in zip(*weights))
    return [Row("two --deterministic runs", "bit-equal weights after 3 updates" if equal else
                f"{differ} of {len(weights[0])} weights differ", equal)], {"bit_equal": equal}


def main(argv, steps=None) -> int:
    del argv
    if FLAGS.output_json:  # its directory made now, not after the checks
        files.makedirs(os.path.dirname(files.absolute(FLAGS.output_json)))
    started = time.perf_counter()
    name, peak = device_and_peak()
    peak = FLAGS.peak_tflops or peak
    on_gpu = name != "CPU"
    device = first_device()
    bert = bert_config(on_gpu)
    table = [Row(f"doctor: {f.check}", f.found + (f" -- fix: {f.fix}" if f.fix else ""), f.fix is None) for f in checks(steps)]
    figures = {"device": name, "peak_tflops": peak, "bert_config": bert.to_dict()}
    with tempfile.TemporaryDirectory() as work:
        for part, function in (("packed_equals_unpacked", lambda: packed_equals_unpacked(bert, device)),
                               ("recompute", lambda: recompute_equal(bert, device)),
                               ("throughput", lambda: throughput(bert, on_gpu, work, peak)),
                               ("deterministic", lambda: deterministic(bert, device, os.path.join(work, "det")))):
            start = time.perf_counter()
            rows, figures[part] = function()
            figures.setdefault("seconds_by_part", {})[part] = time.perf_counter() - start
            table += rows
    figures["seconds"] = time.perf_counter() - started
    layers = f"{bert.num_hidden_layers} layer{'s' if bert.num_hidden_layers != 1 else ''}"
    print(f"\ndevice check on {name} ({device}), BERT {layers} x {bert.hidden_size}, "
          f"{figures['seconds']:.0f} s\n")
    print("| check | result | passed |")
    print("|---|---|---|")
    for row in table:
        print(f"| {row.check} | {row.result} | {'-' if row.passed is None else 'yes' if row.passed else 'NO'} |")
    failed = [row.check for row in table if row.passed is False]
    figures["failed"] = failed
    if FLAGS.output_json:
        write_text_atomically(FLAGS.output_json, json.dumps(figures, indent=1, default=float) + "\n")
    print(f"\n{PROGRAM}: " + (f"{len(failed)} check(s) failed: {', '.join(failed)}" if failed else "every check passed"))
    return 1 if failed else 0


def entry_point(steps=None):
    """The command; `steps`: a StepPool its caller keeps (bert_packed.training.step_pool), for the
    doctor's checks."""
    quiet = QuietRetracing()  # each check builds steps of its own
    tf.get_logger().addFilter(quiet)
    try:
        run(lambda argv: main(argv, steps), PROGRAM, "output_json", "Nothing is kept (--output_json is written at the end)",
            flag_values=FLAGS)
    finally:
        tf.get_logger().removeFilter(quiet)  # run in a process of other commands (run_script), it leaves none


if __name__ == "__main__":
    entry_point()
