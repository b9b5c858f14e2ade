"""The files a command reads: globs expanded to a set in which every datum is read once, and an
eval set apart from the training files by path and by content (by origin too:
bert_packed.inputs.provenance.require_eval_apart adds it)."""

from __future__ import annotations

import os

from bert_packed.errors import InputFilesError, StorageError
from bert_packed.inputs.file_identity import FileIdentity, file_sha256
from bert_packed.storage import files


def expand_globs(patterns: str | list[str], what: str) -> list[str]:
    """Comma-separated globs (or a list of them) -> the files they name, as a set: each pattern's
    matches sorted, in the patterns' order. Every datum is read once: a file matched twice (by
    two patterns, or spelled two ways), two files of the same content (a copy), and an empty file
    are refused before any work.

    Raises:
      InputFilesError: naming the pattern that matches nothing, the file matched twice and both
        patterns, the two files of one content, or the empty file.
    """
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    if not patterns:
        raise InputFilesError(f"{what}: no files given")
    found, matched_by = [], {}
    for pattern in patterns:
        try:
            matches = files.glob(pattern.strip())
        except Exception as e:  # noqa: BLE001 - a filesystem's own errors: no credentials, unknown scheme
            if isinstance(e, StorageError) and e.retry_may_help:  # out of reach now: the same command again goes on
                raise (e if e.path else e.at(pattern.strip())) from None
            raise InputFilesError(f"{what}: {pattern!r}: {str(e).splitlines()[0]}") from None
        if not matches:
            raise InputFilesError(f"{what}: {pattern!r} matches no file")
        for path in matches:
            key = _same_file_key(path)
            if key in matched_by:
                first_path, first_pattern = matched_by[key]
                raise InputFilesError(f"{what}: {path} is matched twice ({first_pattern!r} gives {first_path}, "
                                      f"{pattern!r} gives it again); every file is read once: give it once")
            matched_by[key] = (path, pattern)
            found.append(path)
    by_content: dict[tuple[int, str], list[str]] = {}
    for path in found:
        if not _regular_file(path, what):
            continue  # unreadable (a symlink loop, say): the command that reads it names why
        key = _content_key(path)
        if key[0] == 0:
            raise InputFilesError(f"{what}: {path} is empty")
        for other in by_content.get(key, []):
            if _same_bytes(other, path):
                raise InputFilesError(f"{what}: {other} and {path} hold the same bytes (a copy, or one file linked "
                                      f"twice); every datum is read once: give one of them")
        by_content.setdefault(key, []).append(path)
    return found


def require_disjoint(first: list[str], first_what: str, second: list[str], second_what: str) -> None:
    """Raises InputFilesError when a file of `second` is one of `first` (by path or content): the
    eval set is never training input. Both lists come from expand_globs."""
    by_path = {_same_file_key(path): path for path in first}
    by_content: dict[tuple[int, str], list[str]] = {}
    for path in first:
        if _regular_file(path, first_what):
            by_content.setdefault(_content_key(path), []).append(path)
    for path in second:
        other = by_path.get(_same_file_key(path))
        if other is None and _regular_file(path, second_what):
            other = next((o for o in by_content.get(_content_key(path), []) if _same_bytes(o, path)), None)
        if other is not None:
            same = "is" if _same_file_key(other) == _same_file_key(path) else f"holds the same bytes as {other},"
            raise InputFilesError(f"{second_what}: {path} {same} given by {first_what} too; the eval set is never "
                                  f"training input: give disjoint files")


def _same_file_key(path: str) -> str:
    """One spelling of a file (local paths resolved: links, `..`, a relative path)."""
    return path if "://" in path else os.path.realpath(path)


def _regular_file(path: str, what: str) -> bool:
    """Whether `path` is a file to read (False when it is not there: the reader says why).

    Raises:
      InputFilesError: it is a directory or a device (/dev/null reads as empty, /dev/zero never ends).
    """
    if not files.exists(path):
        return False
    if not files.isfile(path):
        raise InputFilesError(f"{what}: {path}: not a regular file (a directory or a device)")
    return True


def _content_key(path: str) -> tuple[int, str]:
    """(size, hash of the first 64 KiB): files whose keys differ differ."""
    identity = FileIdentity.of(path)
    return identity.bytes, identity.head


def _same_bytes(first: str, second: str) -> bool:
    """Whether two files of one content key hold the same bytes (all of them read)."""
    return file_sha256(first) == file_sha256(second)
