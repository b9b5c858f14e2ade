"""Our packed and padded training steps against two well-known BERTs, on the same sequences, on this CPU.

    python scripts/benchmark_peers.py                     # tiny, mini and base at L=512
    python scripts/benchmark_peers.py --bert_configs=tiny --rounds=3

For each BERT config, one micro-batch of real text (scripts/_real_batches.py: the shipped sample
at Wikipedia's mix of lengths, --packs packs of up to three sequences, and the same sequences one
a row) is trained on by four trainers, in one process:
  ours, packed        CompiledStep: the model, losses and update run_pretraining trains with
  ours, padded        the same, the sequences one a row
  keras-hub           BertMaskedLM (TensorFlow backend, Keras' own train step), padded
  transformers        BertForPreTraining (PyTorch, its default attention), padded
all with AdamW at float32, no XLA, on the same sequences (keras-hub's model has no next-sentence
head: it trains the masked-LM loss alone). Each round times --updates steps of each trainer, in
an order that turns round each round, so that the machine's drift falls on all of them; the
table gives each one's median sequences/s and real tokens/s, and its ratio to ours padded per
round (median and range). The same peer on a GPU: scripts/device_check_xla.py.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from bert_packed.console.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0, command=True)  # first: TensorFlow's start-up notices stay out of the tables

import json
import warnings

import keras
import numpy as np
import tensorflow as tf
from _real_batches import DEPTH, PREDICTIONS, Sequences
from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.input_files import expand_globs
from bert_packed.model import BertConfig
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE, Tokenizer
from bert_packed.storage.files import write_text_atomically
from bert_packed.training.config import make_config
from bert_packed.training.data import TrainData
from bert_packed.training.process import set_up_process
from bert_packed.training.step import CompiledStep
from bert_packed.update_program.peer import PeerStep

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PROGRAM = "benchmark_peers"
FLAGS = flags.FlagValues()
flags.DEFINE_list("bert_configs", ["tiny", "mini", "base"], "BERT configs (configs/bert_config_*.json).", flag_values=FLAGS)
flags.DEFINE_list("packs", ["4", "4", "2"], "Packs of each config's micro-batch (one for all, or one a config).",
                  flag_values=FLAGS)
flags.DEFINE_integer("rounds", 5, "Measured rounds, after one that compiles.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("updates", 2, "Steps of each trainer a round.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string("corpus", os.path.join(ROOT, "data", "wikipedia_sample", "wiki_*"), "The text of the sequences.",
                    flag_values=FLAGS)
flags.DEFINE_string("output_json", None, "Also write every figure here.", flag_values=FLAGS)


class Ours:
    """Our compiled step on one micro-batch (AdamW, float32, no XLA)."""

    def __init__(self, bert: BertConfig, features: dict, layout: str):
        rows = len(features["input_ids"])
        config = make_config(bert=bert, optimizer="adamw", learning_rate=1e-4, input_mode=layout, train_batch_size=rows,
                             num_train_steps=10**9, output_dir=tempfile.gettempdir())
        set_up_process(config)
        depth = DEPTH if layout == "packed" else 1
        data = TrainData(shapes=Shapes(512, PREDICTIONS, depth), input_mode=layout,
                         packing_factor=1.0)
        self.step = CompiledStep(config, data)
        self.batches = iter(tf.data.Dataset.from_tensors({k: tf.constant(v) for k, v in features.items()}).repeat())

    def __call__(self, updates: int) -> None:
        self.step.run_updates(self.batches, updates)


class KerasHub:
    """keras-hub's BertMaskedLM of the same sizes, trained by Keras on the padded micro-batch."""

    def __init__(self, bert: BertConfig, features: dict):
        import keras_hub

        # Its backbone carries a pooler that the masked-LM loss does not reach: Keras says so each step.
        warnings.filterwarnings("ignore", message="Gradients do not exist for variables")
        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=bert.vocab_size, num_layers=bert.num_hidden_layers, num_heads=bert.num_attention_heads,
            hidden_dim=bert.hidden_size, intermediate_dim=bert.intermediate_size, dropout=bert.hidden_dropout_prob,
            max_sequence_length=bert.max_position_embeddings)
        self.model = keras_hub.models.BertMaskedLM(backbone)
        self.model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        self.x = {"token_ids": features["input_ids"], "padding_mask": features["sequence_ids"] > 0,
                  "segment_ids": features["segment_ids"], "mask_positions": features["masked_lm_positions"]}
        self.y = features["masked_lm_ids"]
        self.weights = (features["prediction_sequence_ids"] > 0).astype(np.float32)

    def __call__(self, updates: int) -> None:
        for _ in range(updates):
            self.model.train_on_batch(self.x, self.y, sample_weight=self.weights)


class Transformers:
    """transformers' BertForPreTraining (PyTorch) on the padded micro-batch (update_program.peer)."""

    def __init__(self, bert: BertConfig, features: dict):
        self.peer = PeerStep(bert.to_dict(), features, bf16=False)

    def __call__(self, updates: int) -> None:
        for _ in range(updates):
            self.peer.step()


def measure(name: str, packs: int, sequences: Sequences) -> dict:
    """Every trainer of one config, alternated (module docstring)."""
    bert = BertConfig.from_json_file(os.path.join(ROOT, "configs", f"bert_config_{name}.json"))
    packed, _ = sequences.pretraining(packs, "packed", None)
    padded, _ = sequences.pretraining(packs, "padded", None)
    count, tokens = len(padded["input_ids"]), int((padded["sequence_ids"] > 0).sum())
    trainers = {"ours, packed": Ours(bert, packed, "packed"), "ours, padded": Ours(bert, padded, "padded"),
                "keras-hub BertMaskedLM": KerasHub(bert, padded), "transformers BertForPreTraining": Transformers(bert, padded)}
    for trainer in trainers.values():
        trainer(1)  # compiles, warms
    seconds = {label: [] for label in trainers}
    for index in range(FLAGS.rounds):
        for label in list(trainers) if index % 2 == 0 else list(trainers)[::-1]:
            start = time.perf_counter()
            trainers[label](FLAGS.updates)
            seconds[label].append((time.perf_counter() - start) / FLAGS.updates)
    base = seconds["ours, padded"]
    figures = {"packed_rows": packs, "sequences": count, "real_tokens": tokens, "trainers": {}}
    for label, times in seconds.items():
        ratios = [b / t for t, b in zip(times, base)]
        figures["trainers"][label] = {"sequences_per_second": count / statistics.median(times),
                                      "real_tokens_per_second": tokens / statistics.median(times),
                                      "against_ours_padded": {"median": statistics.median(ratios), "min": min(ratios),
                                                              "max": max(ratios)}, "seconds": times}
    return figures


def main(argv) -> None:
    del argv
    if len(FLAGS.packs) not in (1, len(FLAGS.bert_configs)) or not all(p.isdigit() and int(p) > 0 for p in FLAGS.packs):
        raise SettingsError(f"--packs={','.join(FLAGS.packs)}: one positive number, or one a config")
    packs = [int(p) for p in (FLAGS.packs * len(FLAGS.bert_configs) if len(FLAGS.packs) == 1 else FLAGS.packs)]
    sequences = Sequences(expand_globs(FLAGS.corpus, "--corpus"), Tokenizer(DEFAULT_VOCAB_FILE), seed=1)
    results = {}
    print(f"\nOn this CPU, {FLAGS.rounds} rounds of {FLAGS.updates} steps each, alternated; AdamW, float32, no XLA\n")
    print("| config | trainer | sequences/s | real tokens/s | sequences/s against ours padded (median, range) |")
    print("|---|---|---|---|---|")
    for name, count in zip(FLAGS.bert_configs, packs):
        results[name] = measure(name, count, sequences)
        for label, figures in results[name]["trainers"].items():
            ratio = figures["against_ours_padded"]
            print(f"| {name} ({results[name]['sequences']} sequences, {count} packs) | {label} | "
                  f"{figures['sequences_per_second']:.2f} | {figures['real_tokens_per_second']:,.0f} | "
                  f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) |", flush=True)
    if FLAGS.output_json:
        write_text_atomically(FLAGS.output_json, json.dumps(results, indent=1) + "\n")


def entry_point():
    run(main, PROGRAM, "output_json", "Nothing is kept (--output_json is written at the end)", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
