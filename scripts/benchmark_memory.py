"""The memory of the compiled training step, measured and planned; what recompute saves and costs.

    python scripts/benchmark_memory.py                       # measure here (XLA on this machine's device)
    python scripts/benchmark_memory.py --export_hlo=DIR      # write the steps' HLO for another machine
    python scripts/benchmark_memory.py --measurements=M.json --write_plan   # plan from that machine's figures

1. Memory. For each configuration (BERT-Large, base and tiny; L=512 and 128; bf16 and fp32;
   recompute none, attention and layer; packed rows at depth 3), the training step's compiled
   program (update.Update._gradients under --xla, the program a run trains with) is compiled at
   1, 2 and 4 rows a replica and its bytes read from XLA's buffer assignment (weights read,
   gradients written, temporaries): compiled, not run. The three fit bytes = fixed + rows x
   per_row (least squares; the worst residual is printed). With --write_plan the fits become
   bert_packed/resources/memory_plan.json, the plan a run checks its micro-batch against
   (bert_packed.training.memory, which adds the optimizer's state).
   XLA on a CPU keeps bf16 steps in float32 (its dots run in float32, and both copies live), so
   bf16 is measured faithfully only where the GPU's XLA compiles: --export_hlo writes each step's
   HLO (compressed) and scripts/measure_hlo_memory.py compiles them with a GPU's XLA (through
   JAX, on a machine where TensorFlow is not installed) into the --measurements file.
2. The plan for a cluster: the largest micro-batch a replica holds on cards of 16 to 141 GB for
   BERT-Large at L=512 and 128, per recompute mode, and the --steps_per_update that keeps MLPerf's
   batch (448 rows of 512 on 8 replicas; docs/launch.md#memory).
3. Recompute's cost (--time): forward and backward of one micro-batch for each recompute mode,
   taking turns in one process (--rounds rounds), on this machine.
"""

from __future__ import annotations

import atexit
import gc
import glob
import json
import lzma
import os
import re
import shutil
import statistics
import tempfile
import time

from bert_packed.console.tensorflow_loading import import_tensorflow

DUMP = tempfile.mkdtemp(prefix="bert_packed_xla_dump_")
atexit.register(shutil.rmtree, DUMP, ignore_errors=True)  # XLA's dump of every program compiled: scratch
# XLA reads its flags once, when TensorFlow first compiles: set before TensorFlow loads. The dump
# holds each compiled program's buffer assignment.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={DUMP} --xla_dump_hlo_as_text".strip()
import_tensorflow(verbosity=0, command=True)  # first: TensorFlow's start-up notices stay out of the tables

import numpy as np
import tensorflow as tf
from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.model import BertConfig
from bert_packed.model.config import RECOMPUTE
from bert_packed.storage.files import write_text_atomically
from bert_packed.training.config import make_config
from bert_packed.training.data import TrainData
from bert_packed.training.memory import GIB, PLAN_FILE, Measured, largest_rows, model_sizes, read_plan, step_line
from bert_packed.training.process import set_up_process
from bert_packed.training.step import CompiledStep

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FLAGS = flags.FlagValues()
flags.DEFINE_list("bert_configs", ["large", "base", "tiny"], "tiny, mini, base or large (configs/bert_config_*.json).",
                  flag_values=FLAGS)
flags.DEFINE_list("lengths", ["512", "128"], "max_seq_length of the packed rows (P: 76 at 512, 20 at 128; S: 3).",
                  flag_values=FLAGS)
flags.DEFINE_list("precisions", ["bf16", "fp32"], "Compute precisions.", flag_values=FLAGS)
flags.DEFINE_list("recompute", list(RECOMPUTE), "Recompute modes.", flag_values=FLAGS)
flags.DEFINE_list("rows", ["1", "2", "4"], "Rows a replica, fitted to fixed + rows x per_row.", flag_values=FLAGS)
flags.DEFINE_string("export_hlo", None, "Write each step's HLO here (with manifest.json) instead of measuring.",
                    flag_values=FLAGS)
flags.DEFINE_list("measurements", [], "Fit the figures of these files (--output_json of this script, or of "
                                     "scripts/measure_hlo_memory.py) instead of compiling here; a configuration is "
                                     "taken from the first file that measured it.", flag_values=FLAGS)
flags.DEFINE_bool("write_plan", False, f"Write the fits to {os.path.relpath(PLAN_FILE, ROOT)}.", flag_values=FLAGS)
flags.DEFINE_bool("time", False, "Also time forward and backward of each recompute mode (part 3).", flag_values=FLAGS)
flags.DEFINE_string("time_config", "base", "The BERT config timed by --time.", flag_values=FLAGS)
flags.DEFINE_integer("time_rows", 2, "Rows of L=512 timed by --time.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("rounds", 5, "Rounds of --time (one step of each mode a round).", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string("output_json", None, "Also write every measurement here.", flag_values=FLAGS)

PROGRAM = "benchmark_memory"
# Cards a cluster user plans for (GB as sold) and MLPerf's batch: 448 rows of 512 on 8 replicas.
CARDS_GB = (16, 24, 40, 80, 94, 141)
MLPERF_ROWS, MLPERF_REPLICAS = 448, 8
GPU_COUNTS = (8, 16, 32, 64)


def configuration_name(bert_name: str, length: int, precision: str, recompute: str, rows: int) -> str:
    return f"{bert_name}_L{length}_{precision}_{recompute}_rows{rows}"


def compiled_step(bert: BertConfig, length: int, precision: str, recompute: str, work: str) -> CompiledStep:
    config = make_config(bert=bert, precision=precision, xla=True, recompute=recompute, input_mode="packed",
                         train_batch_size=1, output_dir=work)
    set_up_process(config)
    data = TrainData(shapes=packed_shapes(length), input_mode="packed",
                     packing_factor=2.0)
    return CompiledStep(config, data)


def batch(shapes: Shapes, rows: int, vocab_size: int) -> dict:
    """A micro-batch of `rows` packs of three sequences, as the input pipeline yields it."""
    length, depth = shapes.max_seq_length, shapes.max_sequences_per_pack
    third = length // depth
    sequence_ids = np.minimum(np.arange(length) // third + 1, depth)
    features = {}
    for name, size in shapes.model_lengths().items():
        features[name] = np.zeros([rows, size], np.int32)
    features["input_ids"][:] = np.arange(length) % vocab_size
    features["sequence_ids"][:] = sequence_ids
    features["positions"][:] = np.arange(length) - (sequence_ids - 1) * third
    features["next_sentence_positions"][:] = np.arange(depth) * third
    features["next_sentence_weights"][:] = 1
    features["masked_lm_positions"][:] = np.arange(shapes.max_predictions_per_pack) * 3 % length
    features["prediction_sequence_ids"][:] = sequence_ids[features["masked_lm_positions"][0]]
    return {name: tf.constant(value) for name, value in features.items()}


def packed_shapes(length: int) -> Shapes:
    """Packs of at most three sequences at L with MLPerf's predictions (76 at 512, 20 at 128)."""
    return Shapes(length, 76 if length >= 512 else 20, 3)


def gradient_inputs(step: CompiledStep, length: int, rows: int) -> tuple:
    """The arguments of the compiled gradients (update.Update._gradients: one micro-batch; an
    update of several calls it once for each, in turn) for a micro-batch of `rows` rows."""
    return batch(packed_shapes(length), rows, step.config.model.bert.vocab_size), None, tf.constant([1, 2], tf.int32)


def xla_bytes_here(step: CompiledStep, length: int, rows: int) -> int:
    """The compiled program's bytes as this machine's XLA assigns them (its dump's total)."""
    for path in glob.glob(os.path.join(DUMP, "*")):
        os.remove(path)
    step.update._gradients.experimental_get_compiler_ir(*gradient_inputs(step, length, rows))(stage="optimized_hlo")
    reports = glob.glob(os.path.join(DUMP, "*after_optimizations-memory-usage-report.txt"))
    if len(reports) != 1:
        raise RuntimeError(f"expected one buffer assignment report in {DUMP}, found {len(reports)}")
    with open(reports[0]) as f:
        return int(re.search(r"Total bytes used: (\d+)", f.read()).group(1))


def export_hlo(step: CompiledStep, length: int, rows: int, path: str) -> None:
    """The compiled program's HLO, before XLA's passes (any backend compiles it), xz-compressed."""
    serialized = step.update._gradients.experimental_get_compiler_ir(*gradient_inputs(step, length, rows))(
        stage="hlo_serialized")
    with lzma.open(path, "wb", preset=6) as f:
        f.write(serialized)


def fit(points: dict[int, int]) -> tuple[int, int, float]:
    """(fixed, per_row, the plan's largest excess over a measurement) of {rows: bytes}.

    The line goes through the fewest rows measured and rises as steeply as the steepest measured
    rise from there, so that it is never below a measurement: with recompute XLA keeps more a row
    at many rows than at few (BERT-Large at L=512, attention: 0.43 GiB a row from 1 to 4 rows,
    0.53 from 1 to 56), and a line fitted to few rows would plan too little for many.
    """
    first = min(points)
    per_row = max((points[r] - points[first]) / (r - first) for r in points if r != first)
    fixed = points[first] - first * per_row
    if fixed < 0:  # a small model whose bytes grow faster than linearly: the line through 0 instead
        fixed, per_row = 0.0, max(value / rows for rows, value in points.items())
    excess = max((fixed + r * per_row - value) / value for r, value in points.items())
    return round(fixed), round(per_row), excess


def configurations():
    for name in FLAGS.bert_configs:
        bert = BertConfig.from_json_file(os.path.join(ROOT, "configs", f"bert_config_{name}.json"))
        for length in map(int, FLAGS.lengths):
            for precision in FLAGS.precisions:
                for recompute in FLAGS.recompute:
                    yield name, bert, length, precision, recompute


def measure_here_or_export(work: str) -> dict:
    """{configuration name: bytes} measured here, or {} after writing the HLO (--export_hlo)."""
    measured, manifest = {}, {}
    if FLAGS.export_hlo:  # added to what an earlier export wrote there
        os.makedirs(FLAGS.export_hlo, exist_ok=True)
        if os.path.exists(os.path.join(FLAGS.export_hlo, "manifest.json")):
            with open(os.path.join(FLAGS.export_hlo, "manifest.json")) as f:
                manifest = json.load(f)
    for name, bert, length, precision, recompute in configurations():
        keys = [configuration_name(name, length, precision, recompute, int(rows)) for rows in FLAGS.rows]
        if all(key in manifest for key in keys):  # exported by an earlier run
            continue
        step = compiled_step(bert, length, precision, recompute, work)
        for rows in map(int, FLAGS.rows):
            key = configuration_name(name, length, precision, recompute, rows)
            start = time.perf_counter()
            if FLAGS.export_hlo:
                export_hlo(step, length, rows, os.path.join(FLAGS.export_hlo, f"{key}.hlo.pb.xz"))
                manifest[key] = f"{key}.hlo.pb.xz"
                write_text_atomically(os.path.join(FLAGS.export_hlo, "manifest.json"), json.dumps(manifest, indent=1))
                print(f"{key}: HLO written in {time.perf_counter() - start:.1f} s", flush=True)
            else:
                measured[key] = xla_bytes_here(step, length, rows)
                print(f"{key}: {measured[key] / GIB:.3f} GiB (compiled in {time.perf_counter() - start:.1f} s)",
                      flush=True)
        del step
        gc.collect()
    return measured


KEY = re.compile(r"^(?P<model>[a-z]+)_L(?P<length>\d+)_(?P<precision>[a-z0-9]+)_(?P<recompute>[a-z]+)_rows(?P<rows>\d+)$")


def read_measurements(path: str) -> dict:
    """A --measurements file: {"bytes": {configuration: bytes}, "measured_by", "device"}, and its path.

    Raises:
      SettingsError: the file cannot be read, is not such a file, or holds a count of bytes that is
        not a positive whole number.
    """
    try:
        with open(path) as f:
            given = json.load(f)
    except OSError as e:
        raise SettingsError(f"--measurements={path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SettingsError(f"--measurements={path}: not JSON ({e})") from None
    if not (isinstance(given, dict) and isinstance(given.get("bytes"), dict) and isinstance(given.get("measured_by"), str)
            and isinstance(given.get("device"), str)):
        raise SettingsError(f"--measurements={path}: expected the --output_json of this script or of "
                            f"scripts/measure_hlo_memory.py (an object with bytes, measured_by and device)")
    for key, value in given["bytes"].items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SettingsError(f"--measurements={path}: {key} is {value!r} bytes; expected a positive whole number")
    return {**given, "path": path}


def fits(sources: list[dict]) -> list[Measured]:
    """The plan's lines: each configuration fitted from the first source that measured it at two
    row counts or more; bf16 and fp16 not from a CPU (XLA on a CPU runs their products in float32
    and keeps both copies: BERT-Large at L=512 took 2.4 GiB a row on this CPU, 0.95 on an H100).

    Args:
      sources: {"bytes": by configuration name, "measured_by", "device"}, in order of preference.
    """
    lines = []
    print("\nThe compiled step's bytes = fixed + rows x per_row (the plan adds the optimizer's state)\n")
    print("| model | L | precision | recompute | fixed (GiB) | per row (GiB) | measured (rows: GiB) | plan's largest excess "
          "| measured by |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, bert, length, precision, recompute in configurations():
        for source in sources:
            if precision != "fp32" and source["device"] == "CPU":
                continue
            points = {int(match["rows"]): value for key, value in source["bytes"].items()
                      if (match := KEY.match(key)) and (match["model"], int(match["length"]), match["precision"],
                                                        match["recompute"]) == (name, length, precision, recompute)}
            if len(points) >= 2:
                break
        else:
            continue
        if any(points[rows] <= points[min(points)] for rows in points if rows != min(points)):
            raise SettingsError(f"--measurements={source.get('path')}: {name} at L={length}, {precision}, recompute "
                                f"{recompute}: its bytes do not grow with the rows ({points}); a plan fitted to them "
                                f"would hold any micro-batch; nothing was written")
        fixed, per_row, excess = fit(points)
        lines.append(Measured({**model_sizes(bert), "vocab_size": bert.vocab_size}, length, precision, recompute,
                              fixed, per_row, source["measured_by"]))
        values = ", ".join(f"{rows}: {points[rows] / GIB:.2f}" for rows in sorted(points))
        print(f"| {name} | {length} | {precision} | {recompute} | {fixed / GIB:.2f} | {per_row / GIB:.3f} | {values} | "
              f"{excess:.1%} | {source['measured_by']} |")
    return lines


def write_plan(lines: list[Measured]) -> None:
    """The plan with `lines`: each replaces the plan's line of its configuration, the others stay."""
    key = lambda line: (tuple(sorted(line.model.items())), line.max_seq_length, line.precision, line.recompute)
    new = {key(line): line for line in lines}
    kept = [line for line in read_plan() if key(line) not in new]
    replaced = len(read_plan()) - len(kept)
    entries = [line.__dict__ for line in [*lines, *kept]]
    write_text_atomically(PLAN_FILE, json.dumps({"measured": entries}, indent=1) + "\n")
    print(f"\nplan: {len(lines) - replaced} configurations added, {replaced} replaced, {len(kept)} kept -> {PLAN_FILE}")


def cluster_table(plan: tuple[Measured, ...]) -> None:
    """Part 2: the largest micro-batch a replica holds, per card and recompute mode (BERT-Large)."""
    large = BertConfig.from_json_file(os.path.join(ROOT, "configs", "bert_config_large.json"))
    per_replica = MLPERF_ROWS // MLPERF_REPLICAS
    for length in (512, 128):
        for precision in ("bf16", "fp32"):
            if step_line(large, length, precision, "none", plan)[0] is None:
                continue
            print(f"\nBERT-Large, L={length}, {precision}: the most rows a replica holds: the micro-batch x "
                  f"--steps_per_update that make MLPerf's {MLPERF_ROWS} rows on {MLPERF_REPLICAS} replicas "
                  f"({per_replica} a replica)\n")
            print("| recompute | " + " | ".join(f"{gb} GB" for gb in CARDS_GB) + " |")
            print("|---|" + "---|" * len(CARDS_GB))
            for recompute in RECOMPUTE:
                cells = []
                for gb in CARDS_GB:
                    rows = largest_rows(large, length, precision, recompute, gb * 10**9, plan)
                    if rows is None:
                        cells.append("-")
                        continue
                    split = next((k for k in range(1, per_replica + 1) if per_replica % k == 0
                                  and per_replica // k <= rows), None)
                    cells.append(f"{rows}: {per_replica // split} x {split}" if split else f"{rows}")
                print(f"| {recompute} | " + " | ".join(cells) + " |")
    for length in (512, 128):
        if step_line(large, length, "bf16", "none", plan)[0] is None:
            continue
        print(f"\nBERT-Large, L={length}, bf16, --recompute=none: MLPerf's {MLPERF_ROWS} rows (packs, or unpacked "
              f"rows) by the number of GPUs sharing them: the micro-batch a GPU x --steps_per_update\n")
        print("| GPUs | rows a GPU | " + " | ".join(f"{gb} GB" for gb in CARDS_GB) + " |")
        print("|---|---|" + "---|" * len(CARDS_GB))
        for replicas in GPU_COUNTS:
            share = MLPERF_ROWS // replicas
            cells = []
            for gb in CARDS_GB:
                rows = largest_rows(large, length, "bf16", "none", gb * 10**9, plan) or 0
                split = next((k for k in range(1, share + 1) if share % k == 0 and share // k <= rows), None)
                cells.append(f"{share // split} x {split}" if split else "-")
            print(f"| {replicas} | {share} | " + " | ".join(cells) + " |")


def time_recompute(work: str) -> None:
    """Part 3: forward and backward of each recompute mode, one step of each in turn."""
    bert = BertConfig.from_json_file(os.path.join(ROOT, "configs", f"bert_config_{FLAGS.time_config}.json"))
    steps = {recompute: compiled_step(bert, 512, "fp32", recompute, work) for recompute in RECOMPUTE}
    arguments = {mode: gradient_inputs(step, 512, FLAGS.time_rows) for mode, step in steps.items()}
    for mode, step in steps.items():
        step.update._gradients(*arguments[mode])  # compile
    times = {mode: [] for mode in steps}
    for index in range(FLAGS.rounds):
        for mode in list(steps) if index % 2 == 0 else list(steps)[::-1]:
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), steps[mode].update._gradients(*arguments[mode]))
            times[mode].append(time.perf_counter() - start)
    print(f"\nrecompute's cost: forward and backward of {FLAGS.time_rows} rows of 512, {FLAGS.time_config}, fp32, XLA on "
          f"this machine's {tf.config.list_logical_devices()[-1].device_type}, {FLAGS.rounds} rounds alternated\n")
    print("| recompute | seconds a step (median) | time against none (median of rounds) |")
    print("|---|---|---|")
    for mode, values in times.items():
        ratio = statistics.median(t / base for t, base in zip(values, times["none"]))
        print(f"| {mode} | {statistics.median(values):.3f} | {ratio:.2f}x |")


def main(argv) -> None:
    del argv
    for name in ("lengths", "rows"):
        if not all(value.isdigit() and int(value) > 0 for value in FLAGS[name].value):
            raise SettingsError(f"--{name}={','.join(FLAGS[name].value)}: expected positive whole numbers")
    if FLAGS.export_hlo and os.path.exists(FLAGS.export_hlo) and not os.path.isdir(FLAGS.export_hlo):
        raise SettingsError(f"--export_hlo={FLAGS.export_hlo}: a file, not a directory for the HLO")
    with tempfile.TemporaryDirectory() as work:
        if FLAGS.measurements:
            sources = [read_measurements(path) for path in FLAGS.measurements]
        else:
            device = tf.config.list_logical_devices()[-1].device_type
            sources = [{"bytes": measure_here_or_export(work), "device": device,
                        "measured_by": f"XLA's buffer assignment, TensorFlow {tf.__version__} on {device}"}]
        if FLAGS.export_hlo:
            print(f"\nHLO of {len(os.listdir(FLAGS.export_hlo)) - 1} programs in {FLAGS.export_hlo}: on the GPU machine, "
                  f"python scripts/measure_hlo_memory.py --hlo_dir={FLAGS.export_hlo} --output_json=gpu.json")
            return
        lines = fits(sources)
        plan = tuple(lines)
        cluster_table(plan)
        if FLAGS.write_plan:
            write_plan(lines)
        if FLAGS.output_json and not FLAGS.measurements:
            write_text_atomically(FLAGS.output_json, json.dumps(sources[0], indent=1) + "\n")
        if FLAGS.time:
            time_recompute(work)


def entry_point():
    run(main, PROGRAM, ("export_hlo", "output_json"), "Nothing is kept but what was written", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
