"""Helpers shared by the command-line edges."""

from __future__ import annotations

import glob
import sys


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
