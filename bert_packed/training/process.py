"""Process-wide set-up for a run, in one function that entry points call before building a
CompiledStep: Python logging, the seed and op determinism, and Keras' precision policy. Nothing else
in the package changes process-wide state. The commands as functions (run_pretraining,
run_classifier, run_squad) hold it for the run alone (run_set_up): a notebook's Keras computes
as before once they return."""

from __future__ import annotations

import contextlib
import logging

import keras
import tensorflow as tf

from bert_packed.errors import InternalError
from bert_packed.training.config import PRECISIONS, TrainConfig


def set_up_process(config: TrainConfig) -> None:
    """Sets what a run needs of the whole process.

    - logging at INFO (progress lines, warnings);
    - with --deterministic, the seed of Python, NumPy and TensorFlow, and op determinism, so that
      the same configuration gives the same results;
    - the precision policy of --precision (the model's layers take it when built).
    """
    root = logging.getLogger()
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    if config.run.deterministic:
        keras.utils.set_random_seed(config.run.seed)
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy(PRECISIONS[config.model.precision])


@contextlib.contextmanager
def run_set_up(config: TrainConfig):
    """set_up_process(config) for the `with` block; then Keras' precision policy and op
    determinism as they were before it (a bf16 run would otherwise leave the caller's next layers
    in bf16; the root logger is console.root_logger's, around the whole command). The seeds it set
    stay: setting TensorFlow's again clears its kernel cache, and a caller's own draws are its own
    to seed."""
    from tensorflow.python.framework import config as framework_config

    policy, determinism = keras.mixed_precision.global_policy().name, framework_config.is_op_determinism_enabled()
    set_up_process(config)
    try:
        yield
    finally:
        if keras.mixed_precision.global_policy().name != policy:
            keras.mixed_precision.set_global_policy(policy)
        if framework_config.is_op_determinism_enabled() != determinism:
            (tf.config.experimental.enable_op_determinism if determinism
             else framework_config.disable_op_determinism)()


def check_process_set_up(config: TrainConfig) -> None:
    """Raises InternalError (a bug of the caller) unless set_up_process(config) ran."""
    policy = keras.mixed_precision.global_policy().name
    if policy != PRECISIONS[config.model.precision]:
        raise InternalError(f"the precision policy is {policy}, the run needs {PRECISIONS[config.model.precision]}: call "
                           f"bert_packed.training.process.set_up_process(config) before building a CompiledStep")
