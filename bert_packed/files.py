"""Writing files so that an interrupted job never leaves one that looks finished."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def atomic_path(path: str):
    """Yields a temporary path next to `path`; renames it to `path` only if the block succeeds.

    Readers see either the old file or the complete new one. On any error (or an interrupt) the
    temporary file is removed and `path` is left as it was.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
