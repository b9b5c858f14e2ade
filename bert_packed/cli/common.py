"""Helpers shared by the command-line edges."""

from __future__ import annotations

import errno
import glob
import sys

# A full disk, a full quota and a file-size limit all stop a write the same way.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large")


def expand_globs(patterns: str | list[str], what: str) -> list[str]:
    """Comma-separated globs (or a list of them) -> sorted files; every pattern must match.

    Raises:
      FileNotFoundError: naming the pattern that matches nothing.
    """
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    if not patterns:
        raise FileNotFoundError(f"{what}: no files given")
    files = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern.strip()))
        if not matches:
            raise FileNotFoundError(f"{what}: {pattern!r} matches no file")
        files.extend(matches)
    return files


def fail(program: str, error: Exception | str) -> None:
    """Exits with status 2 and one line naming the problem (no traceback for bad input)."""
    sys.stderr.write(f"{program}: error: {error}\n")
    sys.exit(2)


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` (an OSError, or TensorFlow's wording of one) says the disk is full."""
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
        return True
    return any(text in str(error) for text in _DISK_FULL_TEXTS)


def fail_if_disk_full(program: str, error: BaseException, output: str, kept: str) -> None:
    """Exits with one line when `error` is a full disk; returns otherwise (the caller re-raises).

    Args:
      program: the command's name.
      error: what was raised.
      output: where the command writes.
      kept: what survives, for the message (finished shards, the last checkpoint...).
    """
    if not is_disk_full(error):
        return
    where = getattr(error, "filename", None) or output
    reason = getattr(error, "strerror", None) or next(text for text in _DISK_FULL_TEXTS if text in str(error))
    fail(program, f"{where}: the disk is full ({reason}). {kept}; partial files were removed. Free some space "
                  f"and run the same command again to continue")
