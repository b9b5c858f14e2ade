"""Where files are read and written: local paths, or any filesystem TensorFlow knows.

Once TensorFlow is loaded (training), or for a path with a scheme (gs://, ram://, hdfs://...),
every path goes through tf.io.gfile; the data-preparation tools, which never load TensorFlow,
use the local filesystem directly.

Files are written one way: under a temporary name, then renamed into place. Readers see either
the old file or the complete new one; an interrupted job never leaves a file that looks finished.
"""

from __future__ import annotations

import contextlib
import errno
import glob as local_glob
import os
import sys


def _gfile(path: str):
    """tf.io.gfile when `path` needs it or TensorFlow is loaded anyway; None for plain os calls."""
    if "://" in path or "tensorflow" in sys.modules:
        import tensorflow as tf

        return tf.io.gfile
    return None


def open_file(path: str, mode: str = "r"):
    """Opens `path` (text modes are UTF-8)."""
    gfile = _gfile(path)
    if gfile is not None:
        if "r" in mode and not gfile.exists(path):  # GFile would only fail at the first read
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return gfile.GFile(path, mode)
    return open(path, mode, encoding=None if "b" in mode else "utf-8")


def exists(path: str) -> bool:
    gfile = _gfile(path)
    return gfile.exists(path) if gfile is not None else os.path.exists(path)


def size(path: str) -> int:
    """Bytes in the file at `path`."""
    gfile = _gfile(path)
    return gfile.stat(path).length if gfile is not None else os.path.getsize(path)


def makedirs(path: str) -> None:
    gfile = _gfile(path)
    if gfile is not None:
        gfile.makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def glob(pattern: str) -> list[str]:
    """The paths matching `pattern`, sorted."""
    gfile = _gfile(pattern)
    return sorted(gfile.glob(pattern) if gfile is not None else local_glob.glob(pattern))


def remove(path: str) -> None:
    gfile = _gfile(path)
    if gfile is not None:
        gfile.remove(path)
    else:
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path: str):
    """Yields a temporary path next to `path`; renames it to `path` only if the block succeeds.

    On any error (or an interrupt) the temporary file is removed and `path` is left as it was.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    gfile = _gfile(path)
    try:
        yield tmp
        if gfile is not None:
            gfile.rename(tmp, path, overwrite=True)
        else:
            os.replace(tmp, path)
    finally:
        if exists(tmp):
            remove(tmp)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w"):
    """Opens a temporary file next to `path` for writing; on success it is flushed to disk and
    renamed to `path` (see atomic_path)."""
    with atomic_path(path) as tmp:
        with open_file(tmp, mode) as f:
            yield f
            f.flush()
            if hasattr(f, "fileno"):
                os.fsync(f.fileno())


def write_text_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename."""
    with atomic_open(path) as f:
        f.write(text)
