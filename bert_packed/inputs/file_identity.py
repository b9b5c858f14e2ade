"""What a file is: its size and the hash of its first 64 KiB (or of all of it), read once a
command's checks; a run's inputs checked unchanged against what it started with.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import NamedTuple

from bert_packed.errors import UserError
from bert_packed.storage import files

# What identifies a file cheaply: the hash of this much of its beginning, and its size.
HEAD_BYTES = 1 << 16
# Before the hash of a FileIdentity of all of a file.
WHOLE = "all:"


class FileIdentity(NamedTuple):
    """A file and what tells its content from another's: its size and the SHA-256 of its first
    64 KiB, without reading it all (record files, read in parts); or of all of it, "all:" before
    the hash, where a command reads the file whole anyway (a fine-tuning task's: a label flipped
    past its first 64 KiB is another task). JSON writes it as [path, bytes, head] (run.json's data
    files).

    Attributes:
      path: where it is.
      bytes: its size.
      head: SHA-256 of its first 64 KiB, or WHOLE and that of all of it (hex; None where a
        description did not record it).
    """

    path: str
    bytes: int
    head: str | None

    @classmethod
    def of(cls, path: str, whole: bool = False) -> FileIdentity:
        """The identity of the file at `path` now (its size, and its first 64 KiB read, or all of it
        with `whole`); within one_reading_per_file, the one read first there."""
        key = (path, whole)
        if _READ is not None and key in _READ:
            return _READ[key]
        if whole:
            head = WHOLE + file_sha256(path)
        else:
            with files.open_file(path, "rb") as f:
                head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()
        identity = cls(path, files.size(path), head)
        if _READ is not None:
            _READ[key] = identity
        return identity

    @property
    def content(self) -> dict:
        """{"bytes", "head"}: the content's part, as metadata.json and the data tools' digests spell it."""
        return {"bytes": self.bytes, "head": self.head}

    def difference(self) -> str | None:
        """How the file on disk differs from this identity now (None: it does not)."""
        if not files.exists(self.path):
            return "it is gone"
        whole = self.head is not None and self.head.startswith(WHOLE)
        now = FileIdentity.of(self.path, whole)
        if now.bytes != self.bytes:
            return f"{now.bytes:,} bytes, was {self.bytes:,}"
        if self.head is not None and now.head != self.head:  # None: not recorded
            return "its content is other (the SHA-256 of all of it)" if whole else \
                f"its first {HEAD_BYTES // 1024} KiB are others"
        return None

    def as_recorded(self, recorded_head: str | None) -> FileIdentity:
        """This identity in the form a run recorded it: of the first 64 KiB where `recorded_head`
        is (a run begun before task files were hashed whole resumes on the check it began with)."""
        if self.head is None or not self.head.startswith(WHOLE) or recorded_head is None or \
                str(recorded_head).startswith(WHOLE):
            return self
        return FileIdentity.of(self.path)


# The identities read within one_reading_per_file, by (path, whole) (None outside it).
_READ: dict[tuple[str, bool], FileIdentity] | None = None


@contextlib.contextmanager
def one_reading_per_file():
    """Within the block, each file's identity is read once: a command's checks at start (its set of
    inputs, train against eval, each file against its metadata.json) cost one small read per
    file, one request each on a bucket. Outside it every identity is read afresh, as the checks
    of a running run must be."""
    global _READ
    outer = _READ
    _READ = {} if outer is None else outer
    try:
        yield
    finally:
        _READ = outer


class DataChangedError(UserError, ValueError):
    """A file a run reads is not the one it started with."""


def check_unchanged(identities, what: str) -> None:
    """Raises DataChangedError naming the first of `identities` (FileIdentity) that differs on
    disk from what it was; `what` says when it was recorded, for the message."""
    for identity in identities:
        difference = identity.difference()
        if difference is not None:
            raise DataChangedError(f"{identity.path}: changed since {what} ({difference}); the run stopped, and no "
                                   f"checkpoint holds what was read from the new content: restore the file to resume "
                                   f"with the same command, or start a new run in another --output_dir on the new data")


def file_sha256(path: str) -> str:
    """The SHA-256 of all of the file at `path` (hex): read in blocks of 1 MiB."""
    digest = hashlib.sha256()
    with files.open_file(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
