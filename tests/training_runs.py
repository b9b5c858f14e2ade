"""Training runs for the tests: the tiny model on the test data, on compiled steps shared per graph shape.

`config(output_dir, files, **values)` takes every value by the name the product gives it: a
setting by its flag's name (training.config), a fact of the training data by its TrainData
field. `make_trainer(setup)` builds what run_pretraining builds after its flags (the process
set-up, the compiled step) and runs it with the product's own train_and_evaluate.

Compiling a step costs seconds; an update of the tiny model milliseconds. So a compiled step is
built once per graph shape in a test process and handed out again, put back as new, once its
run is given back: the tests' StepPool (conftest.STEPS, which the commands a test runs in this
process take theirs from too). `trained(setup)` gives a run's step back as soon as it ends,
`give_back(run)` when the test is done with a run it kept, and every step still held is given
back after each test. Two runs of one shape held at once get two steps, as two processes would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, MAX_SEQUENCES_PER_PACK, STEPS, TINY

from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.model import BertConfig
from bert_packed.training.checkpoints import Checkpoints
from bert_packed.training.config import PRECISIONS, TrainConfig, make_config, setting_names
from bert_packed.training.data import EvalData, TrainData, eval_pipeline
from bert_packed.training.loop import evaluate_only, run_directory, train_and_evaluate
from bert_packed.training.process import set_up_process
from bert_packed.training.step import CompiledStep

# The values a test gives unless it says otherwise.
DEFAULTS = dict(input_mode="packed", train_batch_size=4, num_train_steps=2, learning_rate=1e-3, deterministic=True,
                log_every_steps=1, save_checkpoints_steps=1000)
_DATA_FACTS = {field.name for field in dataclasses.fields(TrainData)} - {"inputs", "input_mode"} | {"identity"}


@dataclasses.dataclass(frozen=True)
class Setup:
    """What run_pretraining has once its flags are read: the settings and the data's descriptions."""

    config: TrainConfig
    train_data: TrainData
    eval_data: EvalData


def config(output_dir, files, dropout=0.1, eval_files=(), eval_packed=False, vocab_size=TINY["vocab_size"],
           **values) -> Setup:
    """A run of the tiny model on the test data (packed records of S=3 unless `input_mode` says).

    Args:
      output_dir: --output_dir.
      files: the training files.
      dropout: the BERT config's dropout rates.
      eval_files: the eval files (unpacked, or packed with `eval_packed`).
      vocab_size: the BERT config's (the test vocabulary's size unless the data has another).
      values: settings by their flags' names; facts of the training data by their TrainData names
        (packing_factor, strategies, identity, ...).
    """
    bert = BertConfig(**{**TINY, "vocab_size": vocab_size}, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout)
    values = {**DEFAULTS, **values}
    facts = {name: values.pop(name) for name in list(values) if name in _DATA_FACTS}
    unknown = set(values) - set(setting_names())
    assert not unknown, f"no setting or data fact is named {sorted(unknown)}"
    settings = make_config(bert=bert, output_dir=str(output_dir), **values)
    facts.setdefault("shapes", Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK))
    inputs = Dataset(tuple(files), facts.pop("identity", ()))
    train = TrainData(input_mode=settings.batch.input_mode, inputs=inputs, **facts)
    evaluation = EvalData(inputs=Dataset(tuple(eval_files), ()),
                          shapes=Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK if eval_packed else 1),
                          input_mode="packed" if eval_packed else "padded")
    return Setup(settings, train, evaluation)


# The compiled loops of the steps handed out, as built: a test may wrap one (sigterm_in_the_loop_from).
_LOOPS: weakref.WeakKeyDictionary[CompiledStep, object] = weakref.WeakKeyDictionary()


def _set_up_unless_in_place(config: TrainConfig) -> None:
    """The process set-up of `config`: set_up_process's when the process has not had it for this
    seed and precision; else Python's and NumPy's seeds set again, TensorFlow's left as it is.

    Setting TensorFlow's seed clears its kernel cache, and each compiled function of every step
    built before then costs about a second to instantiate again. Nothing of a step draws from
    TensorFlow's seed alone: its weights come from Python's random generator (Keras' initializers'
    seeds, set again here for a new step) or from memory (a step built before, put back as new),
    dropout draws from the run's seed statelessly, and the datasets' shuffles combine their own
    seeds with TensorFlow's, which is the run's either way. Determinism and the precision policy
    are as set_up_process leaves them.
    """
    # Only set_up_process sets the seed, and it enables op determinism with it, for good.
    seeded = tf.compat.v1.random.get_seed(0)[0] == config.run.seed
    in_place = ((seeded or not config.run.deterministic)
                and keras.mixed_precision.global_policy().name == PRECISIONS[config.model.precision])
    if not in_place:
        set_up_process(config)
    elif config.run.deterministic:
        random.seed(config.run.seed)
        np.random.seed(config.run.seed)


def compiled_step(setup: Setup, strategy=None) -> CompiledStep:
    """A compiled step for `setup`, as new: one this process built before for its graph shape and
    no running test holds (put back as new), else a new one."""
    _set_up_unless_in_place(setup.config)
    step = STEPS.take(setup.config, setup.train_data, strategy)
    _LOOPS.setdefault(step, step.update.loop)
    return step


def release() -> None:
    """The running test has ended: the steps it held may be handed out again, their loops as built."""
    for step, loop in _LOOPS.items():
        step.update.loop = loop
    STEPS.release()


class Run:
    """A run as run_pretraining makes one, with the attributes tests look into.

    Attributes:
      setup: its settings and data.
      compiled: its CompiledStep; model, optimizer, update, step, sequences and strategy are the step's.
      checkpoints: the run directory's checkpoints.
      stopped_by: the signal that stopped the last train() after a save, else None.
    """

    def __init__(self, setup: Setup, strategy=None):
        self.setup = setup
        self.compiled = compiled_step(setup, strategy)
        self.model, self.optimizer, self.update = self.compiled.model, self.compiled.optimizer, self.compiled.update
        self.step, self.sequences, self.strategy = self.compiled.step, self.compiled.sequences, self.compiled.strategy
        self.checkpoints = Checkpoints(run_directory(setup.config, self.compiled).checkpoints, self.compiled.state,
                                       setup.config.run.keep_checkpoint_max)
        self.stopped_by = None

    @property
    def config(self) -> TrainConfig:
        return self.setup.config

    def train(self) -> dict:
        result = train_and_evaluate(self.setup.config, self.setup.train_data, self.setup.eval_data, self.compiled)
        self.stopped_by = result.stopped_by
        return result.record

    def evaluate(self) -> dict:
        return self.compiled.evaluate(eval_pipeline(self.setup.eval_data, self.setup.config))

    def evaluate_only(self) -> dict:
        return evaluate_only(self.setup.config, self.setup.eval_data, self.compiled)


def make_trainer(setup: Setup, strategy=None) -> Run:
    """A run of `setup`, after the process set-up an entry point does."""
    return Run(setup, strategy)


def trained(setup: Setup, strategy=None) -> dict:
    """What `make_trainer(setup).train()` returns, the run's step given back as soon as it ends
    (however it ends), where the test keeps nothing of the run but its files: the next run of
    its shape, in this test too, takes that step instead of compiling one (about 3 s each)."""
    run = make_trainer(setup, strategy)
    try:
        return run.train()
    finally:
        give_back(run)


def give_back(run: Run) -> None:
    """`run`'s step back to the tests' pool, its loop as built, before the test ends: the test
    uses nothing of the run (its model, its step) after this."""
    run.update.loop = _LOOPS[run.compiled]
    STEPS.release(run.compiled)


def weights(trainer: Run) -> list:
    return [w.numpy() for w in trainer.model.weights]


def read_log(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def assert_same_evaluation(first, second, num_sequences):
    """Two trainers, given the first's weights, evaluate to the same metrics over the same sequences."""
    for w, value in zip(second.model.weights, weights(first)):
        w.assign(value)
    a, b = first.evaluate(), second.evaluate()
    assert a["num_sequences"] == b["num_sequences"] == num_sequences
    for key in ("loss", "mlm_accuracy", "mlm_loss", "nsp_loss", "nsp_accuracy"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


def sigterm_in_the_loop_from(run, step: int | None = None) -> None:
    """Sends `run` SIGTERM, as a preemption would, during the compiled loop that starts at
    micro-step `step` (None: the first loop), once that loop has run: the run stops after it."""
    loop = run.update.loop

    def loop_then_sigterm(iterator, num_updates):
        result = loop(iterator, num_updates)
        if step is None or int(run.step) == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    run.update.loop = loop_then_sigterm



def two_fine_tuning_updates(rows: dict, input_mode: str, packing_factor: float, output_dir, objective,
                            start: list | None = None) -> tuple[list, list, dict, CompiledStep]:
    """Two updates of the compiled step of `objective(config)` (a fine-tuning objective: dropout
    off, AdamW), each on every row of `rows` at once, from `start`'s weights (None: its own).

    Returns:
      (the weights before, after, the first update's sums by name, the step).
    """
    num_rows = len(rows["input_ids"])
    setup = config(output_dir, [], dropout=0.0, input_mode=input_mode, train_batch_size=num_rows, optimizer="adamw",
                   adjust_batch_for_packing=False, adjust_betas_for_packing=False, packing_factor=packing_factor,
                   clip_by_global_norm_after_gradient_allreduce=True)
    _set_up_unless_in_place(setup.config)
    step = STEPS.take(setup.config, setup.train_data, objective=objective(setup.config))
    for weight, value in zip(step.model.weights, start or [], strict=start is not None):
        weight.assign(value)
    before = [w.numpy() for w in step.model.weights]
    dataset = tf.data.Dataset.from_tensor_slices(rows).batch(num_rows).repeat()
    results = step.run_updates(iter(step.strategy.distribute_datasets_from_function(lambda context: dataset)), 2)
    return before, [w.numpy() for w in step.model.weights], dict(zip(step.update.sum_keys, results[0, 1:])), step
