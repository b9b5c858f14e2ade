"""The one way files are written: under a temporary name, then renamed into place.

Readers see either the old file or the complete new one; an interrupted job never leaves a file
that looks finished.
"""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def atomic_path(path: str):
    """Yields a temporary path next to `path`; renames it to `path` only if the block succeeds.

    On any error (or an interrupt) the temporary file is removed and `path` is left as it was.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w"):
    """Opens a temporary file next to `path` for writing; on success it is flushed to disk and
    renamed to `path` (see atomic_path)."""
    encoding = None if "b" in mode else "utf-8"
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def write_text_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename."""
    with atomic_open(path) as f:
        f.write(text)
