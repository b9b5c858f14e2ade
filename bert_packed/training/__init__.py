"""Training: the settings (config.py), the data a run reads (data.py), losses and metrics (per
sequence), LAMB and its schedule, the compiled update and step (update.py, step.py), checkpoints,
logs, and the run's loop (loop.py: train_and_evaluate).

The names below load on first use, so that `bert_packed.training.config` can be read without
loading TensorFlow (the command line's flags take their defaults from it).
"""

import importlib

_EXPORTS = {
    "bert_packed.training.batching": ("adjusted_betas",),
    "bert_packed.training.config": ("LOSS_AVERAGING",),
    "bert_packed.training.losses": ("loss_from_sums", "metrics_from_sums", "pretraining_sums"),
    "bert_packed.training.optimizers": ("AdamWeightDecay", "Lamb", "PolynomialWarmup"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
