"""Loading TensorFlow quietly: its start-up notices (oneDNN, CPU features, absl) and its C++ INFO
and WARNING lines stay off the console unless asked for (--verbosity=1), errors still show.

Every part of the project that loads TensorFlow goes through import_tensorflow: the commands,
the benchmarks, and the data tools' rare fallbacks (TensorFlow's parser names a bad record).
A command's process (command=True) also loads it without what TensorFlow and Keras import only
because it is installed, for features no command uses (COMMANDS_DO_NOT_USE).
"""

from __future__ import annotations

import os
import re
import sys
import threading

import bert_packed

# What TensorFlow writes to stderr while it loads, before any of its logging settings apply: the
# absl notice, the oneDNN and CPU-feature notices, and on machines with CUDA libraries the
# factory-registration complaints. Other lines, errors included, pass.
STARTUP_NOTICES = re.compile(r"^(WARNING: All log messages before absl::InitializeLog|[IW]\d{4} |To enable the "
                             r"following instructions:|TF-TRT Warning|E\d{4} .*(Unable to register|already "
                             r"been registered))")

# Held while TensorFlow loads: two threads that swapped file descriptor 2 at once would each
# keep the other's pipe open, and wait for its end forever.
_LOADING = threading.Lock()

# Imported at TensorFlow's start-up wherever they are installed, for TFLite's converter of JAX
# functions, Keras's DataFrame slicing and its image plots: 1.8 of 6 s of a command's start-up
# here with all three installed (JAX and pandas come with the tests' and Beam's extras,
# matplotlib with the curves). Each module imports as usual once TensorFlow is loaded, but those
# features stay off in the command's process (TFLite and Keras try once); a notebook's or a
# library caller's TensorFlow keeps them.
COMMANDS_DO_NOT_USE = ("jax", "pandas", "matplotlib")


def import_tensorflow(verbosity: int = 0, command: bool = False):
    """Loads TensorFlow quietly unless --verbosity is above 0; any thread may call it.

    Quiet: TF_CPP_MIN_LOG_LEVEL=2 (unless set), and what TensorFlow writes straight to file
    descriptor 2 while it loads goes through a pipe, where a thread passes on every line but the
    start-up notices as it comes (so an error just before a crash still shows).

    Args:
      verbosity: the command's --verbosity.
      command: the caller is a command's process (a command's main, a script), before it starts
        any thread: TensorFlow is loaded without COMMANDS_DO_NOT_USE, which no thread can import
        meanwhile, and Keras on its TensorFlow backend.
    """
    with _LOADING:
        if "tensorflow" in sys.modules:
            return sys.modules["tensorflow"]
        if command and "keras" not in sys.modules:
            # A command is a TensorFlow program, whatever backend KERAS_BACKEND or
            # ~/.keras/keras.json choose for the user's other work (with jax, every training
            # command was an internal error); the processes it starts inherit the choice.
            os.environ["KERAS_BACKEND"] = "tensorflow"
        left_out = [name for name in COMMANDS_DO_NOT_USE if name not in sys.modules] if command else []
        for name in left_out:
            sys.modules[name] = None  # `import name` raises ImportError, which each importer expects
        try:
            return _import_tensorflow(verbosity)
        finally:
            for name in left_out:
                if sys.modules.get(name, ()) is None:
                    del sys.modules[name]


def _import_tensorflow(verbosity: int):
    if verbosity > 0 and bert_packed.TF_LOG_LEVEL_DEFAULTED:
        os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)  # every line, as asked
    if verbosity > 0:
        import tensorflow
        return tensorflow
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    stderr = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pass_on():
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if not STARTUP_NOTICES.match(line.decode("utf-8", "replace")):
                    os.write(stderr, line)

    thread = threading.Thread(target=pass_on, daemon=True)
    thread.start()
    try:
        import tensorflow
    finally:
        os.dup2(stderr, 2)  # the pipe's last writer closes: the thread reads to its end and stops
        thread.join()
        os.close(stderr)
    return tensorflow

