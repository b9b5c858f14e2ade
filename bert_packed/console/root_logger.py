"""The root logger kept as its caller had it, around a command run as a function."""

from __future__ import annotations

import contextlib
import logging


@contextlib.contextmanager
def root_logger_kept():
    """Puts back the root logger's level and handlers on leaving, however the block ends.

    A training run logs its progress lines at INFO, and Python's module-level logging calls give a
    root without handlers one of their own (logging.basicConfig): in a notebook, every library's
    INFO lines would show from then on. Used as a decorator by the commands as functions
    (run_pretraining, run_classifier, run_squad).
    """
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
