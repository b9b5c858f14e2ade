"""TensorFlow's whole training update exported, with real micro-batches, for a GPU without TensorFlow.

    python scripts/export_update_programs.py --output_dir=.device_export        # where TensorFlow is
    python scripts/device_check_xla.py --export_dir=.device_export --output_json=xla.json   # on the GPU

Each configuration is one compiled step's update of one micro-batch (Update.one_update: forward,
backward, the clip and LAMB's or AdamW's apply, the weights and the optimizer's slots written in
place), exported as XLA's HLO with its layout and its micro-batch (bert_packed.update_program,
export.py says what the files hold). The micro-batches are real text (scripts/_real_batches.py):
the corpus cut to Wikipedia's mix of lengths, packed three a row by the LP planner; a padded
configuration holds the same sequences one a row (a timed BERT-Large one, as many of them, drawn
at random, as the packed one has rows: the memory plan sizes both).

CONFIGURATIONS (by default all but the tiny ones, which the tests export):
  large_L512_bf16_{packed,padded}_{80gb,141gb}   BERT-Large, at the largest micro-batch the memory
                                                 plan fits on an 80 GB and a 141 GB card (timed)
  base_classifier_L128_bf16_{packed,padded}      BERT-base fine-tuning, 32 examples an update (timed)
  mini_L512_{fp32,bf16}_{packed,padded}          correctness: TensorFlow's outputs on this CPU kept
  tiny_L512_{fp32,bf16}_{packed,padded}, tiny_classifier_L128_fp32_{packed,padded}   (the tests')
A correctness configuration's fp32 is exported with TensorFloat-32 off (full-precision products).

Re-running the command keeps every configuration already exported (its files checked against the
manifest) and exports the rest; an export of other inputs (corpus, seed) in --output_dir is refused.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shlex
import tempfile
import time

from bert_packed.console.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0, command=True)

import numpy as np
import tensorflow as tf
from _real_batches import DEPTH, FINETUNING_DEPTH, PREDICTIONS, Sequences
from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import OutputDirectoryError, SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.file_identity import file_sha256
from bert_packed.inputs.input_files import expand_globs
from bert_packed.model import BertConfig
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE, Tokenizer
from bert_packed.storage import files, locks
from bert_packed.training.config import make_config
from bert_packed.training.data import TrainData
from bert_packed.training.export_update import export_configuration
from bert_packed.training.memory import largest_rows, step_bytes
from bert_packed.training.objective import Classification
from bert_packed.training.process import set_up_process
from bert_packed.training.step import CompiledStep
from bert_packed.training.throughput import training_flops
from bert_packed.update_program import export
from bert_packed.update_program.export import Configuration, ExportError

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PROGRAM = "export_update_programs"


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a configuration is made of. rows: packed rows of a correctness configuration; card:
    the card (GB as sold) whose memory plan sizes the micro-batch; examples: a fine-tuning update's."""

    model: str
    objective: str
    max_seq_length: int
    precision: str
    layout: str
    checked: bool
    rows: int = 2
    card: int | None = None
    examples: int = 0


def _specs() -> dict[str, Spec]:
    specs = {}
    for layout in ("packed", "padded"):
        for card in (80, 141):
            specs[f"large_L512_bf16_{layout}_{card}gb"] = Spec("large", "pretraining", 512, "bf16", layout, False,
                                                               card=card)
        specs[f"base_classifier_L128_bf16_{layout}"] = Spec("base", "classification", 128, "bf16", layout, False,
                                                            examples=32)
        for model in ("mini", "tiny"):
            for precision in ("fp32", "bf16"):
                specs[f"{model}_L512_{precision}_{layout}"] = Spec(model, "pretraining", 512, precision, layout, True)
        specs[f"tiny_classifier_L128_fp32_{layout}"] = Spec("tiny", "classification", 128, "fp32", layout, True,
                                                             examples=8)
    return specs


SPECS = _specs()
DEFAULT = [name for name in SPECS if not name.startswith("tiny")]
LABELS = ("none", "person")

FLAGS = flags.FlagValues()
flags.DEFINE_string("output_dir", None, "Where the export goes (manifest.json, a folder a configuration).", flag_values=FLAGS)
flags.DEFINE_list("configurations", DEFAULT, f"Which to export, of: {', '.join(SPECS)}.", flag_values=FLAGS)
flags.DEFINE_string("corpus", os.path.join(ROOT, "data", "wikipedia_sample", "wiki_*"),
                    "The text the micro-batches are made of (create_pretraining_data's input formats).", flag_values=FLAGS)
flags.DEFINE_string("vocab_file", DEFAULT_VOCAB_FILE, "The WordPiece vocabulary.", flag_values=FLAGS)
flags.DEFINE_integer("seed", 1, "Seed of the sequences, the packs chosen and the starting weights.", lower_bound=0,
                     flag_values=FLAGS)
flags.mark_flags_as_required(["output_dir"], flag_values=FLAGS)


def bert_config(model: str) -> BertConfig:
    return BertConfig.from_json_file(os.path.join(ROOT, "configs", f"bert_config_{model}.json"))


def micro_batch(spec: Spec, sequences: Sequences) -> tuple[dict, np.ndarray, int | None]:
    """(features, slot_sequences, rows by the memory plan or None) of a configuration."""
    if spec.objective == "classification":
        return (*sequences.classification(spec.examples, spec.max_seq_length, spec.layout), None)
    rows = spec.rows
    if spec.card:
        rows = largest_rows(bert_config(spec.model), 512, spec.precision, "none", spec.card * 10**9)
        if not rows:
            raise SettingsError(f"the memory plan fits no row of {spec.model} at L=512 on {spec.card} GB")
    return (*sequences.pretraining(rows, spec.layout, 1 if spec.card else None), rows if spec.card else None)


def compiled_step(spec: Spec, features: dict) -> CompiledStep:
    """The configuration's compiled step: the run's settings as run_pretraining (LAMB) or
    run_classifier (AdamW) makes them, XLA, one micro-batch an update."""
    bert = bert_config(spec.model)
    packed = spec.layout == "packed"
    depth = (DEPTH if spec.objective == "pretraining" else FINETUNING_DEPTH) if packed else 1
    rows = len(features["input_ids"])
    fine_tuning = spec.objective == "classification"
    config = make_config(bert=bert, precision=spec.precision, xla=True, input_mode=spec.layout, train_batch_size=rows,
                         optimizer="adamw" if fine_tuning else "lamb", learning_rate=2e-5 if fine_tuning else 4.25e-4,
                         num_train_steps=1000, output_dir=tempfile.gettempdir())
    tf.config.experimental.enable_tensor_float_32_execution(not (spec.checked and spec.precision == "fp32"))
    set_up_process(config)
    predictions = 0 if fine_tuning else PREDICTIONS
    data = TrainData(shapes=Shapes(spec.max_seq_length, predictions, depth),
                     input_mode=spec.layout, packing_factor=1.0)
    objective = Classification(config, LABELS) if fine_tuning else None
    return CompiledStep(config, data, objective=objective)


def describe(name: str, spec: Spec, features: dict, slots: np.ndarray, planned_rows: int | None,
             partner: str) -> Configuration:
    bert = bert_config(spec.model)
    rows = len(features["input_ids"])
    tokens = int((features["sequence_ids"] > 0).sum())
    sequences = int((slots >= 0).sum())
    predictions = int((features["prediction_sequence_ids"] > 0).sum()) if "prediction_sequence_ids" in features else 0
    planned = step_bytes(bert, spec.max_seq_length, spec.precision, "none", rows)
    return Configuration(
        name=name, model=spec.model, bert=bert.to_dict(), objective=spec.objective, layout=spec.layout,
        precision=spec.precision, fp32_products="highest" if spec.checked and spec.precision == "fp32" else "tf32",
        max_seq_length=spec.max_seq_length, rows=rows, sequences=sequences, real_tokens=tokens,
        predictions=predictions, flops=training_flops(bert, tokens, sequences, predictions), planned_bytes=planned,
        sized_for=f"{spec.card} GB" if planned_rows else None, checked=spec.checked, partner=partner,
        seed=FLAGS.seed)


def made_by(paths: list[str]) -> dict:
    """What the export is made of and with (the corpus and vocabulary by their contents): another
    value is another export."""
    return {"tensorflow": tf.__version__, "corpus": [{"file": os.path.basename(p), "bytes": files.size(p),
                                                      "sha256": file_sha256(p)} for p in paths],
            "vocabulary_sha256": file_sha256(FLAGS.vocab_file), "seed": FLAGS.seed}


def already_exported(directory: str, configuration: Configuration) -> bool:
    """The configuration is in the manifest, as described now, with all its files intact."""
    try:
        exported = export.read_manifest(directory, drop_broken=True)[1].get(configuration.name)
        if exported is None or dataclasses.replace(exported, files={}) != configuration:
            return False
        for name in exported.files:
            export.read_file(directory, exported, name)
        return True
    except ExportError:
        return False


def main(argv) -> None:
    del argv
    if not FLAGS.configurations:
        raise SettingsError(f"--configurations is empty; expected some of {', '.join(SPECS)}")
    unknown = [name for name in FLAGS.configurations if name not in SPECS]
    if unknown:
        raise SettingsError(f"--configurations: no configuration {unknown[0]!r}; expected some of {', '.join(SPECS)}")
    paths = expand_globs(FLAGS.corpus, "--corpus")
    origin = made_by(paths)
    files.makedirs(FLAGS.output_dir)
    with locks.exclusive(os.path.join(FLAGS.output_dir, ".lock"), PROGRAM):
        if files.exists(os.path.join(FLAGS.output_dir, export.MANIFEST)):
            recorded, _ = export.read_manifest(FLAGS.output_dir, drop_broken=True)
            if recorded != origin:
                raise OutputDirectoryError(f"--output_dir={FLAGS.output_dir}: holds an export of other inputs "
                                           f"({recorded}); give another --output_dir")
        print(f"{PROGRAM}: the sequences of {len(paths)} corpus files ...", flush=True)
        sequences = Sequences(paths, Tokenizer(FLAGS.vocab_file), FLAGS.seed)
        steps = {}
        step_of = lambda name: (SPECS[name].model, SPECS[name].objective, SPECS[name].precision, SPECS[name].checked)
        names = sorted(FLAGS.configurations, key=lambda name: list(map(step_of, SPECS)).index(step_of(name)))
        for index, name in enumerate(names, 1):  # those of one compiled step one after another
            spec = SPECS[name]
            start = time.perf_counter()
            features, slots, planned_rows = micro_batch(spec, sequences)
            partner = name.replace(spec.layout, "padded" if spec.layout == "packed" else "packed")
            configuration = describe(name, spec, features, slots, planned_rows, partner)
            if already_exported(FLAGS.output_dir, configuration):
                print(f"{index}/{len(names)} {name}: exported already", flush=True)
                continue
            key = step_of(name)
            if key not in steps:
                steps.clear()
                gc.collect()
                steps[key] = compiled_step(spec, features)
            export_configuration(steps[key], features, slots, configuration, FLAGS.output_dir, origin)
            print(f"{index}/{len(names)} {name}: {configuration.rows} rows, {configuration.sequences} "
                  f"sequences, {configuration.real_tokens:,} real tokens ({time.perf_counter() - start:.0f} s)",
                  flush=True)
        size = sum(files.size(os.path.join(root, f)) for root, _, names in os.walk(FLAGS.output_dir) for f in names)
        print(f"\n{FLAGS.output_dir}: {size / 2**20:.1f} MiB; on the GPU machine: python scripts/device_check_xla.py "
              f"--export_dir={shlex.quote(FLAGS.output_dir)} --output_json=xla.json")


def entry_point():
    run(main, PROGRAM, "output_dir", "Every configuration exported is kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
