"""Commands run one after another in one process, each as it runs in a process of its own.

A new process that imports TensorFlow costs seconds; the main job (scripts/main_job.py) runs a
dozen commands, and the tests hundreds. Each command keeps its flags in a FlagValues of its own
and parses them from their defaults each time it runs (bert_packed.cli.common.run), so what is
left to a runner is what a command changes of the whole process: this module puts that back when
the command ends.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import random
import signal
import sys

from absl import app, command_name, flags
from absl import logging as absl_logging
from absl.testing import flagsaver

from bert_packed.cli.common import unparse


class QuietRetracing(logging.Filter):
    """Leaves out TensorFlow's warning that a function was retraced. TensorFlow counts the traces
    of a method over every object of its class: each command, and each check of the device check,
    builds compiled steps of its own, whose first traces it then reports as one function retraced,
    which says nothing of the command."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


@contextlib.contextmanager
def command_in_this_process(module_name: str, cwd: str | None = None):
    """Sets this process up as a fresh one about to run a command, yields the command's module,
    and afterwards puts back everything a command changes in the process.

    Meanwhile TensorFlow's warning that a function was retraced is left out (QuietRetracing), and
    absl's handler filters nothing, as in a new process, and the process keeps its name (absl's
    app.run would give it the command's).

    What is put back: absl's global flags' values (its process-wide flags are every command's),
    the logging set-up, the SIGINT and SIGTERM handlers, sys.argv, sys.stdout and sys.stderr, the
    environment, the working directory, and what a training run sets of the whole process (op
    determinism, the random seeds, the precision policy: bert_packed.training.process.set_up_process).

    Args:
      module_name: the command's module (`bert_packed.cli.pack_pretraining_data`, or a script's
        module name when scripts/ is on sys.path); its entry_point() runs the command.
      cwd: the working directory meanwhile (None: the current one).
    """
    quiet = QuietRetracing()
    with _process_state_kept(), _training_state_kept(), _process_flags_kept():
        process_name = command_name.make_process_name_useful
        try:
            command_name.make_process_name_useful = lambda: None  # the process keeps its name
            if cwd is not None:
                os.chdir(cwd)
            absl_logging.get_absl_handler().filters[:] = []  # the running command's repeat counter, say
            logging.getLogger("tensorflow").addFilter(quiet)
            yield importlib.import_module(module_name)
        finally:
            logging.getLogger("tensorflow").removeFilter(quiet)
            command_name.make_process_name_useful = process_name


def run_in_process(module_name: str, args: list[str], program: str | None = None, cwd: str | None = None,
                   steps=None) -> int:
    """Runs a command in this process, as `python <program> args` runs it in its own, with this
    process's stdout and stderr, and returns its exit status.

    Args:
      module_name: as command_in_this_process's.
      args: the command's arguments.
      program: its name in sys.argv[0] (None: the module's last part, with .py).
      cwd: as command_in_this_process's.
      steps: the caller's StepPool (bert_packed.training.step_pool), for a command that trains.

    Returns:
      The exit status: 0, or what the command exited with (a message it exited on is printed to
      stderr, status 1, as Python does).
    """
    with command_in_this_process(module_name, cwd) as module:
        return call_entry_point(module, [program or f"{module_name.rsplit('.', 1)[-1]}.py", *args], steps)


def call_entry_point(module, argv: list[str], steps=None) -> int:
    """Calls `module.entry_point()` with `argv` as sys.argv, inside command_in_this_process, and
    returns its exit status (as run_in_process's). A command that trains takes `steps` (the
    caller's StepPool) when it is given."""
    sys.argv = argv
    absl_logging.get_absl_handler().python_handler.stream = sys.stderr  # it holds the stderr of its creation
    takes_steps = steps is not None and "steps" in inspect.signature(module.entry_point).parameters
    try:
        module.entry_point(**({"steps": steps} if takes_steps else {}))
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _process_flags_kept():
    """Puts back the values of absl's global flags, and whether they were parsed: a command parses
    absl's process-wide ones (--verbosity, ...) from their defaults, and those are its caller's
    too (a job's, or a program's of its own that parsed them)."""
    app.define_help_flags()  # once per process, as a command's run defines them: among what is saved
    saved, was_parsed = flagsaver.save_flag_values(flags.FLAGS), flags.FLAGS.is_parsed()
    try:
        yield
    finally:
        unparse(flags.FLAGS)
        flagsaver.restore_flag_values(saved, flags.FLAGS)
        if was_parsed:
            flags.FLAGS.mark_as_parsed()


@contextlib.contextmanager
def _process_state_kept():
    """Puts back the logging set-up (levels, handlers, and the absl handler's stream, formatter and
    filters), the SIGINT and SIGTERM handlers, sys.argv, sys.stdout and sys.stderr, the environment
    and the working directory."""
    handler = absl_logging.get_absl_handler()
    saved_handler = (handler.python_handler.stream, handler.python_handler.formatter, list(handler.filters))
    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    saved_loggers = [(logger, logger.level, list(logger.handlers)) for logger in loggers]
    saved_signals = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    saved_io = (sys.argv, sys.stdout, sys.stderr)
    saved_environment = dict(os.environ)
    saved_directory = os.getcwd()
    try:
        yield
    finally:
        os.chdir(saved_directory)
        os.environ.clear()
        os.environ.update(saved_environment)
        sys.argv, sys.stdout, sys.stderr = saved_io
        for number, saved in saved_signals.items():
            signal.signal(number, saved)
        stream, formatter, filters = saved_handler
        handler.python_handler.stream = stream
        handler.setFormatter(formatter)
        handler.filters[:] = filters
        for logger, level, handlers in saved_loggers:
            logger.setLevel(level)
            logger.handlers[:] = handlers


@contextlib.contextmanager
def _training_state_kept():
    """Puts back what set_up_process sets of the whole process, as it was before the command (as in
    a new process where TensorFlow was not imported yet): op determinism, the seeds of Python,
    NumPy and TensorFlow, and Keras's precision policy. A training run with --deterministic would
    otherwise leave the next command deterministic and seeded, a bf16 run leave it in bf16.

    Meanwhile Python's and NumPy's generators start from the system's entropy, as a new process's
    do: a run without --deterministic draws its initial weights from them, and would otherwise
    start from the same weights as the previous such run."""
    python_random = random.getstate()
    numpy_random = sys.modules["numpy"].random.get_state() if "numpy" in sys.modules else None
    random.seed()
    if numpy_random is not None:
        sys.modules["numpy"].random.seed()
    determinism, tensorflow_seed, policy = False, None, "float32"
    if "tensorflow" in sys.modules:
        import keras
        from tensorflow.python.eager import context
        from tensorflow.python.framework import config

        determinism, tensorflow_seed = config.is_op_determinism_enabled(), context.global_seed()
        policy = keras.mixed_precision.global_policy().name
    try:
        yield
    finally:
        random.setstate(python_random)
        if "numpy" in sys.modules:
            numpy = sys.modules["numpy"]
            if numpy_random is None:
                numpy.random.seed(None)
            else:
                numpy.random.set_state(numpy_random)
        if "tensorflow" in sys.modules:
            import keras
            import tensorflow as tf
            from tensorflow.python.eager import context
            from tensorflow.python.framework import config

            if config.is_op_determinism_enabled() != determinism:
                (config.enable_op_determinism if determinism else config.disable_op_determinism)()
            if context.global_seed() != tensorflow_seed:  # setting it clears TensorFlow's kernel cache
                tf.random.set_seed(tensorflow_seed)
            if keras.mixed_precision.global_policy().name != policy:
                keras.mixed_precision.set_global_policy(policy)
